#!/usr/bin/env bash
# Build llama.cpp's CPU runtime once from the vendored source (scripts/test.sh step 3b), into <llama.cpp>/build:
#   bash scripts/build_llama_cpp.sh [llama.cpp source dir, default .cache/llama.cpp or $ORKPACK_LLAMA_CPP]
# CPU only, Release, with the RPC backend, in one configure so every test that needs llama.cpp's runtime shares it:
# libllama (the eval oracle of families transformers has no class for, tests/oracle/logits.c), llama-perplexity
# (tests/test_export.py), llama-completion (the cluster client, tests/test_cluster_run.py),
# llama-quantize and ggml-rpc-server (rpc-server). Skipped when build/orkpack-build.ok says this configuration was
# built; a failed build leaves no stamp, and the tests that need it skip and say why.
set -euo pipefail
src="${1:-${ORKPACK_LLAMA_CPP:-$(dirname "$0")/../.cache/llama.cpp}}"
[ -f "$src/CMakeLists.txt" ] || { echo "llama.cpp source not at $src: its runtime is not built"; exit 1; }
command -v cmake >/dev/null || { echo "cmake missing: llama.cpp's runtime is not built (the llama.cpp oracle tests skip)"; exit 1; }
build="$src/build"
targets="llama llama-perplexity llama-quantize ggml-rpc-server llama-completion"
flags="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF"
stamp="$flags | $targets"
if [ -f "$build/orkpack-build.ok" ] && [ "$(cat "$build/orkpack-build.ok")" = "$stamp" ]; then
  exit 0
fi
rm -f "$build/orkpack-build.ok"
mkdir -p "$build"
start=$(date +%s)
# shellcheck disable=SC2086
cmake -S "$src" -B "$build" $flags >"$build/orkpack-configure.log" 2>&1 || { echo "llama.cpp configure failed (see $build/orkpack-configure.log)"; exit 1; }
# shellcheck disable=SC2086
cmake --build "$build" --target $targets -j "${ORKPACK_BUILD_JOBS:-2}" >"$build/orkpack-build.log" 2>&1 \
  || { echo "llama.cpp build failed (see $build/orkpack-build.log)"; exit 1; }
echo "$stamp" >"$build/orkpack-build.ok"
echo "llama.cpp runtime built in $(( $(date +%s) - start ))s into $build"
