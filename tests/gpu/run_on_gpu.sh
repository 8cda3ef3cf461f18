#!/usr/bin/env bash
# On a machine with a GPU: build llmq for it and run the GPU tests, then (optionally) benchmarks.
#   tests/gpu/run_on_gpu.sh [OUTDIR] [bench workloads...]
# Builds into build-gpu/ (sm_90a only, Release), runs `ctest -L gpu`, writes logs into OUTDIR.
set -uo pipefail
out=${1:-out}; shift || true
mkdir -p "$out"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLMQ_CUDA=ON -DLLMQ_CUDA_ARCHS=90a >"$out/cmake.log" 2>&1 \
  || { tail -30 "$out/cmake.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
build-gpu/llmq --version
(cd build-gpu && ctest -L gpu --output-on-failure -j 1 2>&1 | tee "$out/ctest-gpu.log" | grep -E "^(ok|FAIL|SKIP)|Test +#|tests passed|time" )
