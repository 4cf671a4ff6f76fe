#!/usr/bin/env bash
# Session 25 call 3: where clusters of 16 overtake clusters of 8 in the cluster attention (with
# the two-batch fold), by prompt length (GEN 128); then one traced probe of the same build for the
# step's kernels (embedding and sampling with their loads in flight together).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" n2=.device/n2
for pl in 256 384 512 640 768 896; do
  PL=$pl GEN=128 ab_run c8-$pl n2
  PL=$pl GEN=128 ab_run c16-$pl n2 NERVA_ATTN_SHORT=16
done
for pl in 384 512 640; do
  PL=$pl GEN=128 ab_run c8-$pl n2
  PL=$pl GEN=128 ab_run c16-$pl n2 NERVA_ATTN_SHORT=16
done
ab_report
xz -dc .device/n2t/nerva_cuda.node.xz > /tmp/n2t.node
ab_trace n2t /tmp/n2t.node
ab_pack call3
