#!/usr/bin/env bash
# Session 28 call 3: the cluster merges without a cluster barrier (st.async into the merging
# block's shared memory, counted by its mbarrier; the barrier's init published by a relaxed
# cluster arrive before the dependency wait): s5 the attention's merge, s6 also the sampler's.
# Alternating with s1 (call 1, committed 5bb8546); conformance and invariance of s6; a traced s6.
build() {  # build NAME [KERNELS_CU] [NVCC_FLAGS]
  local w=/tmp/w-$1
  mkdir -p $w/packages/cuda-backend && cp -r packages/cuda-backend/native $w/packages/cuda-backend/
  [ -n "$2" ] && cp "$2" $w/packages/cuda-backend/native/kernels.cu
  ln -sfn "$PWD/.device" $w/.device && ln -sfn "$PWD/tools" $w/tools
  (cd $w && NERVA_CUDA_ARCHITECTURES=90 NERVA_NVCC_FLAGS="${3:-}" bash tools/gpu/build-addon.sh /tmp/b-$1 > /tmp/b-$1.log 2>&1)
  mkdir -p /tmp/d-$1 && xz -T4 -c /tmp/b-$1/nerva_cuda.node > /tmp/d-$1/nerva_cuda.node.xz
}
build s5 .device/v/kernels_s5.cu &
build s6 "" &
build ts6 "" -DNERVA_TRACE &
wait
for v in s5 s6 ts6; do tail -n 1 /tmp/b-$v.log; done
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" s1=.device/s1 s5=/tmp/d-s5 s6=/tmp/d-s6
export BENCH=.device/dist7/bench.mjs
for i in 1 2 3; do
  ab_run s1 s1
  ab_run s5 s5
  ab_run s6 s6
done
ab_report
DIST=.device/dist7 ab_check s6
ab_trace ts6 /tmp/b-ts6/nerva_cuda.node NERVA_RUN_AHEAD_STEPS=1
mkdir -p $OUT/addon && for v in s5 s6; do cp /tmp/d-$v/nerva_cuda.node.xz $OUT/addon/$v.node.xz; done
ab_pack call3
