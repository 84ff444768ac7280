#!/usr/bin/env bash
# llama.cpp as the peer the comparisons run, built for this machine (-march=native,
# GGML_NATIVE=ON) from llama-cpp-python 0.3.36's source distribution:
# - the Python binding (scripts/compare_peers.py, peers_batch.py), into the project's virtual
#   environment;
# - llama.cpp's own C++ server, llama-server (continuous batching: the serve section's peer,
#   scripts/peers_serve.py), from the same source's vendor/llama.cpp, into $VENV/bin, and
#   its quantizer, llama-quantize (scripts/families.py: Q4_K_M files), left in the build;
# - its benchmark tools, llama-bench (one sequence: pp512 / tg128) and llama-batched-bench
#   (batches), into $VENV/bin: the fair peers (the binding adds ~0.6 ms a token).
# Without AMX: its tile path crashes inside llama-cpp-python on the Xeons seen here, so the
# flags leave it out (the weight repacking of the AVX-512 and AVX2 paths stays on); a generic
# wheel is about 2x slower on q8_0 and Q4_1, an unfair peer. Each is skipped when already
# built, at this version, for this CPU. The source stays in the cache
# ($LLAMA_NP_CACHE/llama.cpp-$VERSION): llama.cpp's converter (convert_hf_to_gguf.py) is there.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
VERSION=0.3.36
CPU=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | xargs)
FLAGS=$(grep -m1 "^flags" /proc/cpuinfo | md5sum | cut -c1-12)
NO_AMX="-mno-amx-int8 -mno-amx-tile -mno-amx-bf16"
CACHE="${LLAMA_NP_CACHE:-$HOME/.cache/llama-np}"
SRC="$CACHE/llama.cpp-$VERSION"

STAMP="$VENV/llama-cpp-python.cpu"
if ! "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null \
    || [ "$(cat "$STAMP" 2>/dev/null)" != "$CPU $FLAGS" ]; then
    echo "llama_cpp.sh: building llama-cpp-python $VERSION for this CPU ($CPU); several minutes" >&2
    CMAKE_ARGS="-DGGML_NATIVE=ON -DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        "$VENV/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps \
        --no-binary llama-cpp-python "llama-cpp-python==$VERSION"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "llama-cpp-python==$VERSION"  # its deps
    echo "$CPU $FLAGS" > "$STAMP"
fi

if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
    mkdir -p "$CACHE"
    TMP=$(mktemp -d "$CACHE/.llama.cpp.XXXXXX")
    "$VENV/bin/pip" download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$VERSION" -d "$TMP"
    tar xzf "$TMP/llama_cpp_python-$VERSION.tar.gz" -C "$TMP"
    rm -rf "$SRC"
    mv "$TMP/llama_cpp_python-$VERSION" "$SRC"
    rm -rf "$TMP"
fi

SERVER_STAMP="$VENV/llama-server.cpu"
BUILD="$SRC/build-server"
if [ ! -x "$VENV/bin/llama-server" ] || [ ! -x "$BUILD/bin/llama-quantize" ] \
    || [ ! -x "$VENV/bin/llama-bench" ] || [ ! -x "$VENV/bin/llama-batched-bench" ] \
    || [ "$(cat "$SERVER_STAMP" 2>/dev/null)" != "$VERSION $CPU $FLAGS" ]; then
    echo "llama_cpp.sh: building llama-server, llama-quantize, llama-bench and llama-batched-bench (llama.cpp of llama-cpp-python $VERSION) for this CPU; several minutes" >&2
    cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" > "$BUILD.log" 2>&1 \
        || { tail -20 "$BUILD.log" >&2; exit 1; }
    cmake --build "$BUILD" --target llama-server llama-quantize llama-bench llama-batched-bench \
        -j "$(nproc)" >> "$BUILD.log" 2>&1 || { tail -20 "$BUILD.log" >&2; exit 1; }
    for tool in llama-server llama-bench llama-batched-bench; do
        cp "$BUILD/bin/$tool" "$VENV/bin/$tool.tmp"
        mv "$VENV/bin/$tool.tmp" "$VENV/bin/$tool"
    done
    echo "$VERSION $CPU $FLAGS" > "$SERVER_STAMP"
fi
