#!/usr/bin/env bash
# Session 26 call 7: the final tree (n8: 61fb6a2's addon with this tree's bundles, dist3) against
# bf1d647 (h, its bundles), four rounds alternating, and a traced n8 (the step's first kernel is now
# the qkv that gathers its row).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" h=.device/h n8=.device/n8 tn8=.device/tn8
for i in 1 2 3 4; do
  ab_run h h
  BENCH=.device/dist3/bench.mjs ab_run n8 n8
done
ab_report
BENCH=.device/dist3/bench.mjs ab_trace n8 /tmp/tn8.node
ab_pack call7
