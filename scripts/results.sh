#!/usr/bin/env bash
# Regenerate every figure of the README and docs/results.md on this machine: installs the
# project with every extra (numba, matplotlib, transformers and torch for the peers),
# llama.cpp built for this CPU (scripts/llama_cpp.sh: its Python binding, llama-server,
# llama-quantize and its converter's source) and the two real models, then runs
# scripts/results.py (its arguments: --quick, --only SECTIONS, --render).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
install_project test,plot,fast,serve
case " $* " in
    *" --render "*) ;;
    *)
        scripts/llama_cpp.sh
        "$VENV/bin/llama-np" pull smollm2-135m >/dev/null
        "$VENV/bin/llama-np" pull qwen2.5-coder-0.5b >/dev/null
        ;;
esac
exec "$VENV/bin/python" scripts/results.py "$@"
