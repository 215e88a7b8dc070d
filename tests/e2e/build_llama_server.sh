#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama-cpp-python sdist (registry package, vendored llama.cpp)
# and writes a tiny random-weight llama GGUF with the real 32k SPM vocabulary. Idempotent: every step is
# skipped when its output exists; outputs appear atomically (tmp + mv), a lock serialises concurrent runs.
# Cache: ${LOADGEN_CACHE:-$HOME/.cache/loadgen}/llama-server/ (outside the checkout).
# Prints two lines at the end: LLAMA_SERVER=<binary> and LLAMA_MODEL=<gguf>.
set -euo pipefail

VERSION=0.3.36
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${LOADGEN_CACHE:-$HOME/.cache/loadgen}/llama-server"
PY="${PYTHON:-python3}"
JOBS="${LLAMA_BUILD_JOBS:-2}"
SDIST="$CACHE/llama_cpp_python-$VERSION.tar.gz"
SRC="$CACHE/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$CACHE/build-$VERSION"
BIN="$CACHE/bin/llama-server-$VERSION"
MODEL="$CACHE/models/tiny-llama-spm-4l-512-f16.gguf"

mkdir -p "$CACHE/bin" "$CACHE/models" "$CACHE/src"
exec 9>"$CACHE/.lock"
flock 9

if [ ! -f "$SDIST" ]; then
    echo "build_llama_server: downloading llama-cpp-python==$VERSION sdist" >&2
    tmp="$(mktemp -d "$CACHE/dl.XXXXXX")"
    "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp" >&2
    mv "$tmp/llama_cpp_python-$VERSION.tar.gz" "$SDIST"
    rm -rf "$tmp"
fi

if [ ! -f "$SRC/CMakeLists.txt" ]; then
    echo "build_llama_server: unpacking $SDIST" >&2
    tmp="$(mktemp -d "$CACHE/src.XXXXXX")"
    tar -xzf "$SDIST" -C "$tmp"
    rm -rf "$CACHE/src/llama_cpp_python-$VERSION"
    mv "$tmp/llama_cpp_python-$VERSION" "$CACHE/src/"
    rm -rf "$tmp"
fi

if [ ! -x "$BIN" ]; then
    # Options checked against the vendored CMakeLists.txt: LLAMA_BUILD_UI / LLAMA_USE_PREBUILT_UI off so the
    # build never downloads UI assets; LLAMA_OPENSSL off (no HTTPS needed on loopback); GGML_NATIVE off so a
    # cached binary runs on any x86-64 CI machine. LLAMA_CURL is deprecated and ignored there, so not passed.
    echo "build_llama_server: building llama-server (cmake + ninja, -j$JOBS); expect 10-30 min cold" >&2
    start_s=$(date +%s)
    cmake -S "$SRC" -B "$BUILD" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$CACHE/cmake-configure.log" 2>&1 \
        || { tail -40 "$CACHE/cmake-configure.log" >&2; exit 1; }
    cmake --build "$BUILD" --target llama-server -j "$JOBS" >"$CACHE/cmake-build.log" 2>&1 \
        || { tail -40 "$CACHE/cmake-build.log" >&2; exit 1; }
    cp "$BUILD/bin/llama-server" "$BIN.tmp"
    mv "$BIN.tmp" "$BIN"
    echo "build_llama_server: built in $(( $(date +%s) - start_s )) s" | tee "$CACHE/build-time.txt" >&2
fi

if [ ! -f "$MODEL" ]; then
    echo "build_llama_server: writing the tiny random-weight model" >&2
    "$PY" "$HERE/make_tiny_gguf.py" --vocab "$SRC/models/ggml-vocab-llama-spm.gguf" --out "$MODEL.tmp"
    mv "$MODEL.tmp" "$MODEL"
fi

echo "LLAMA_SERVER=$BIN"
echo "LLAMA_MODEL=$MODEL"
