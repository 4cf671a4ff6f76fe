#!/usr/bin/env bash
# Session 26 call 8: does layer 0's attention fit beside the embedding qkv when that kernel is held
# to 40 registers (n9: NERVA_EMBED_REGS=40; 48 in n8)? Layer 0's attention became resident only
# as the 256 qkv blocks exited (call 7's trace: pre 2.4 µs, qkv's release lag 2.5 µs).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" n8=.device/n8 n9=.device/n9 tn9=.device/tn9
export BENCH=.device/dist3/bench.mjs
for i in 1 2 3; do
  ab_run n8 n8
  ab_run n9 n9
done
ab_report
ab_trace n9 /tmp/tn9.node
head -9 $AB/timeline-n9.txt | tail -3
ab_pack call8
