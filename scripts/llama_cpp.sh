#!/usr/bin/env bash
# llama.cpp as the peer the comparisons run (scripts/compare_peers.py): llama-cpp-python
# 0.3.36 built from source for this machine (-march=native, GGML_NATIVE=ON), into the
# project's virtual environment. Without AMX: its tile path crashes inside llama-cpp-python
# on the Xeons seen here, so the flags leave it out (the weight repacking of the AVX-512
# and AVX2 paths stays on); a generic wheel is about 2x slower on q8_0 and Q4_1, an unfair
# peer. Skipped when the installed build is this version and was built for this CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
VERSION=0.3.36
STAMP="$VENV/llama-cpp-python.cpu"
CPU=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | xargs)
FLAGS=$(grep -m1 "^flags" /proc/cpuinfo | md5sum | cut -c1-12)
if "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null \
    && [ "$(cat "$STAMP" 2>/dev/null)" = "$CPU $FLAGS" ]; then
    exit 0
fi
echo "llama_cpp.sh: building llama-cpp-python $VERSION for this CPU ($CPU); several minutes" >&2
NO_AMX="-mno-amx-int8 -mno-amx-tile -mno-amx-bf16"
CMAKE_ARGS="-DGGML_NATIVE=ON -DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'" \
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps \
    --no-binary llama-cpp-python "llama-cpp-python==$VERSION"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "llama-cpp-python==$VERSION"  # its deps
echo "$CPU $FLAGS" > "$STAMP"
