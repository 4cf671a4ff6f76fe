#!/usr/bin/env bash
# Session 26 call 10: does layer 0's attention fit beside the embedding qkv when that kernel asks
# for the shared-memory carveout of 164 KB, the attention's (n11: 72 % of the largest; call 9's largest carveout let the attention in but shrank L1 for every kernel after it, 2.5 % slower)? Layer 0's attention became resident only
# as the 256 qkv blocks exited (call 7's trace: pre 2.4 µs, qkv's release lag 2.5 µs).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" n8=.device/n8 n11=.device/n11 tn11=.device/tn11
export BENCH=.device/dist3/bench.mjs
for i in 1 2 3; do
  ab_run n8 n8
  ab_run n11 n11
done
ab_report
ab_trace n11 /tmp/tn11.node
head -9 $AB/timeline-n11.txt | tail -3
ab_pack call10
