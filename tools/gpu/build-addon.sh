#!/usr/bin/env bash
# Builds the CUDA addon on the GPU machine, where there is no node-gyp, no npm and no network:
# the same sources, defines and libraries as packages/cuda-backend/binding.gyp, driven by
# nvcc and g++ directly. Node-API headers come from .device/include (copied there by
# tools/gpu/prepare.sh from the npm packages node-api-headers and node-addon-api).
#   tools/gpu/build-addon.sh OUT_DIR      -> OUT_DIR/nerva_cuda.node
#   tools/gpu/build-addon.sh OUT_DIR ops/attention/decode_gqa.cu ...
# With kernel sources named (paths under packages/cuda-backend/native), OUT_DIR holds a full build
# already (a copy of one, for an A/B variant): only the named files are compiled again, every other
# object is kept, and the addon is linked anew (seconds instead of minutes).
set -euo pipefail
out=${1:?output directory}
shift
only=" $* "
# A named source that is not a kernel file would otherwise be skipped without a word.
for src in "$@"; do
  case "$src" in
    *.cu) [ -f "packages/cuda-backend/native/$src" ] || { echo "[build-addon] no kernel file packages/cuda-backend/native/$src" >&2; exit 2; } ;;
    *) echo "[build-addon] $src: name kernel files (.cu) under packages/cuda-backend/native" >&2; exit 2 ;;
  esac
  [ -d "$out/kernels" ] || { echo "[build-addon] $out holds no full build to recompile $src into" >&2; exit 2; }
done
mkdir -p "$out"
pkg=packages/cuda-backend
cuda=${CUDA_HOME:-/usr/local/cuda}
inc=.device/include
archs=${NERVA_CUDA_ARCHITECTURES:-${CUDAARCHS:-${CUDA_ARCH:-}}}
if [ -z "$archs" ]; then
  archs=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.' || true)
fi
archs=${archs:-90}
gencode=()
# Hopper as sm_90a (wgmma), as packages/cuda-backend/scripts/archs.mjs builds it.
for a in ${archs//;/ }; do a=${a#sm_}; a=${a//./}; [ "$a" = 90 ] && a=90a; gencode+=("-gencode=arch=compute_$a,code=sm_$a"); done
echo "[build-addon] CUDA $cuda, archs $archs"
# NERVA_LINEINFO=1 adds -lineinfo (source lines for nvdisasm -g or a profiler). Off, as in
# binding.gyp: the addon then xz-compresses to ~1.4 MiB instead of ~6, so several fit the run
# tool's carry beside Node and the bundles.
lineinfo=()
[ "${NERVA_LINEINFO:-0}" = 1 ] && lineinfo=(-lineinfo)
# The kernel translation units (native/common, native/ops/**), one nvcc each, all at once, then
# one archive: the link takes from it what the addon's objects use.
kdir="$out/kernels"
mkdir -p "$kdir"
kobjs=()
kpids=()
for src in $(cd $pkg/native && find common ops -name '*.cu' | sort); do
  o="$kdir/$(echo "${src%.cu}" | tr / _).o"
  kobjs+=("$o")
  [ "$only" != "  " ] && [ -f "$o" ] && [ "${only/ $src /}" = "$only" ] && continue
  nvcc -c "$pkg/native/$src" -o "$o" -O3 -std=c++17 -Xcompiler -fPIC "${lineinfo[@]}" -I$pkg/native -I$pkg/native/common -I$pkg/native/host \
    -I"$cuda/include" "${gencode[@]}" ${NERVA_NVCC_FLAGS:-} &
  kpids+=($!)
done
flags=(-c -fPIC -O2 -std=c++17 -fexceptions -DNAPI_VERSION=8 -DNAPI_CPP_EXCEPTIONS -DBUILDING_NODE_EXTENSION
  -I"$inc/node-api-headers" -I"$inc/node-addon-api" -I"$cuda/include")
# The addon's and the host modules' sources (binding.gyp's list).
cc_sources=(addon/module addon/context addon/memory addon/streams addon/host_compute addon/cublas_dl addon/nccl_dl
  host/isa host/host_pool host/host_mlp host/host_attention host/host_channel common/knobs)
objs=()
for src in "${cc_sources[@]}"; do
  o="$out/$(basename "$src").o"
  objs+=("$o")
  [ "$only" != "  " ] && [ -f "$o" ] && continue
  g++ "${flags[@]}" -I$pkg/native -I$pkg/native/common -I$pkg/native/host -I$pkg/native/addon $pkg/native/$src.cc -o "$o"
done
# The hand-declared cuBLASLt ABI against the real header, where the machine has it.
if [ -f "$cuda/include/cublasLt.h" ]; then
  g++ -fsyntax-only -std=c++17 -I"$cuda/include" tools/gpu/lt_abi_check.cc
  echo "[build-addon] cuBLASLt ABI matches $cuda/include/cublasLt.h"
else
  echo "[build-addon] no cublasLt.h here: the cuBLASLt ABI check is skipped"
fi
for p in ${kpids[@]+"${kpids[@]}"}; do wait "$p"; done
rm -f "$out/kernels.a"
ar rcs "$out/kernels.a" "${kobjs[@]}"
g++ -shared -o "$out/nerva_cuda.node" "${objs[@]}" "$out/kernels.a" \
  -L"$cuda/lib64" -L"$cuda/targets/x86_64-linux/lib" -lcudart_static -ldl -lrt -lpthread
# A kept object built against older headers links (Node-API symbols stay undefined in any addon)
# but fails at load with "symbol lookup error": name it here instead.
missing=$(nm -D --undefined-only "$out/nerva_cuda.node" | awk '$2 ~ /^_ZN5nerva/ {print $2}')
if [ -n "$missing" ]; then
  echo "[build-addon] $out/nerva_cuda.node leaves NERVA symbols undefined (objects from an older tree? rebuild it in full):" >&2
  echo "$missing" | sed 's/^/  /' >&2
  exit 1
fi
echo "[build-addon] $out/nerva_cuda.node"
