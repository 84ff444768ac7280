# Sourced by the scripts: make sure the project's virtual environment exists.
VENV="${LLAMA_NP_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$VENV"
fi
export TOKENIZERS_PARALLELISM=false
