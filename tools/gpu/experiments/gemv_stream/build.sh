#!/usr/bin/env bash
# Builds the batch-1 bf16 GEMV stream bench (bench.cu) against this tree's k_gemv_bf16:
#   bash tools/gpu/experiments/gemv_stream/build.sh OUT   -> OUT/gemv_stream (sm_90a)
set -euo pipefail
out=${1:?output directory}
mkdir -p "$out"
P=packages/cuda-backend/native
# The engine's GEMV (helpers, gemvBf16, k_gemv_bf16) as the bench's reference kernel.
sed -n '/^\/\/ nw\[4j..4j+3\]/,/^\/\/ The one-row normed projection at batch 1/p' $P/ops/gemv.cu | head -n -1 > "$out/gemv_part.cuh"
nvcc -O3 -std=c++17 -I$P -I$P/common -I"$out" -gencode=arch=compute_90a,code=sm_90a \
  -o "$out/gemv_stream" tools/gpu/experiments/gemv_stream/bench.cu
