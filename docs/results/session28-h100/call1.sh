#!/usr/bin/env bash
# Session 28 call 1: the cluster attention's post-wait chains shortened (value and key rows loaded
# without a branch between them, the heads' softmax weights side by side, shifts for the push's
# divisions; at most 128 registers) against session 27's kernels (t1), alternating; conformance
# and invariance of the new addon; a traced step of it.
set -x
NERVA_CUDA_ARCHITECTURES=90 bash tools/gpu/build-addon.sh /tmp/b-s1 > /tmp/b-s1.log 2>&1 &
NERVA_CUDA_ARCHITECTURES=90 NERVA_NVCC_FLAGS="-DNERVA_TRACE" bash tools/gpu/build-addon.sh /tmp/b-t1 > /tmp/b-t1.log 2>&1 &
wait
tail -2 /tmp/b-s1.log /tmp/b-t1.log
mkdir -p /tmp/s1 && xz -T8 -c /tmp/b-s1/nerva_cuda.node > /tmp/s1/nerva_cuda.node.xz
set +x
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" t1=.device/t1 s1=/tmp/s1
export BENCH=.device/dist7/bench.mjs
for i in 1 2 3 4 5; do
  ab_run t1 t1
  ab_run s1 s1
done
ab_report
DIST=.device/dist7 ab_check s1
ab_trace ts1 /tmp/b-t1/nerva_cuda.node NERVA_RUN_AHEAD_STEPS=1
mkdir -p $OUT/addon && cp /tmp/s1/nerva_cuda.node.xz $OUT/addon/
ab_pack call1
