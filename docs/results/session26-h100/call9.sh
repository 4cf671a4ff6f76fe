#!/usr/bin/env bash
# Session 26 call 9: does layer 0's attention fit beside the embedding qkv when that kernel asks
# for the largest shared-memory carveout (n10; call 8's 40 registers did not help)? Layer 0's attention became resident only
# as the 256 qkv blocks exited (call 7's trace: pre 2.4 µs, qkv's release lag 2.5 µs).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" n8=.device/n8 n10=.device/n10 tn10=.device/tn10
export BENCH=.device/dist3/bench.mjs
for i in 1 2 3; do
  ab_run n8 n8
  ab_run n10 n10
done
ab_report
ab_trace n10 /tmp/tn10.node
head -9 $AB/timeline-n10.txt | tail -3
ab_pack call9
