#!/usr/bin/env bash
# Session 28 call 2: on top of call 1's attention (s1, committed 5bb8546):
#   s2: the one-row GEMVs' prefetched chunks folded with no branch between their loads;
#   s3: s2 and down's blocks (k_gemv_wide, 768 threads) in at most 40 registers, beside gate_up;
#   s4: s1 and down at 40 registers only.
# Alternating with s1 and t1 (session 27's kernels); conformance and invariance of s3; a traced s3.
build() {  # build NAME KERNELS_CU [NVCC_FLAGS]
  local w=/tmp/w-$1
  mkdir -p $w/packages/cuda-backend && cp -r packages/cuda-backend/native $w/packages/cuda-backend/
  cp "$2" $w/packages/cuda-backend/native/kernels.cu
  ln -sfn "$PWD/.device" $w/.device && ln -sfn "$PWD/tools" $w/tools
  (cd $w && NERVA_CUDA_ARCHITECTURES=90 NERVA_NVCC_FLAGS="${3:-}" bash tools/gpu/build-addon.sh /tmp/b-$1 > /tmp/b-$1.log 2>&1)
  mkdir -p /tmp/d-$1 && xz -T4 -c /tmp/b-$1/nerva_cuda.node > /tmp/d-$1/nerva_cuda.node.xz
}
build s2 .device/v/kernels_s2.cu &
build s3 .device/v/kernels_s3.cu &
build s4 .device/v/kernels_s4.cu &
build ts3 .device/v/kernels_s3.cu -DNERVA_TRACE &
wait
for v in s2 s3 s4 ts3; do tail -n 1 /tmp/b-$v.log; done
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" s1=.device/s1 t1=.device/t1 s2=/tmp/d-s2 s3=/tmp/d-s3 s4=/tmp/d-s4
export BENCH=.device/dist7/bench.mjs
for i in 1 2 3; do
  ab_run s1 s1
  ab_run s2 s2
  ab_run s3 s3
  ab_run s4 s4
done
ab_run t1 t1
ab_report
DIST=.device/dist7 ab_check s3
ab_trace ts3 /tmp/b-ts3/nerva_cuda.node NERVA_RUN_AHEAD_STEPS=1
if command -v cuobjdump > /dev/null; then cuobjdump -sass /tmp/s3.node | xz -T4 > $OUT/s3.sass.xz; else echo "no cuobjdump"; ls /usr/local/cuda/bin | head -30; fi
mkdir -p $OUT/addon && for v in s2 s3 s4; do cp /tmp/d-$v/nerva_cuda.node.xz $OUT/addon/$v.node.xz; done
ab_pack call2
