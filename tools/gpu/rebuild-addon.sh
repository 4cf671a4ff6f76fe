#!/usr/bin/env bash
# Rebuilds an addon from a full build-addon.sh output folder, recompiling only the kernel
# translation units named (paths under packages/cuda-backend/native): a variant of one kernel
# file in ~30 s instead of the whole build's minutes.
#   tools/gpu/rebuild-addon.sh FULL_DIR OUT_DIR ops/attention/decode_gqa.cu [...]
set -euo pipefail
full=${1:?full build folder}
out=${2:?output folder}
shift 2
pkg=packages/cuda-backend
cuda=${CUDA_HOME:-/usr/local/cuda}
archs=${NERVA_CUDA_ARCHITECTURES:-90}
gencode=()
for a in ${archs//;/ }; do a=${a#sm_}; gencode+=("-gencode=arch=compute_$a,code=sm_$a"); done
rm -rf "$out" && mkdir -p "$out/kernels"
cp "$full"/kernels/*.o "$out/kernels/"
for src in "$@"; do
  o="$out/kernels/$(echo "${src%.cu}" | tr / _).o"
  nvcc -c "$pkg/native/$src" -o "$o" -O3 -std=c++17 -Xcompiler -fPIC -I$pkg/native -I$pkg/native/common -I$pkg/native/host \
    -I"$cuda/include" "${gencode[@]}" ${NERVA_NVCC_FLAGS:-}
done
ar rcs "$out/kernels.a" "$out"/kernels/*.o
g++ -shared -o "$out/nerva_cuda.node" "$full"/*.o "$out/kernels.a" \
  -L"$cuda/lib64" -L"$cuda/targets/x86_64-linux/lib" -lcudart_static -ldl -lrt -lpthread
echo "[rebuild-addon] $out/nerva_cuda.node"
