#!/usr/bin/env bash
# Session 26 call 6: op decoder_layers' embed (n8, 2a2fa90 + the embedding gathered by the first
# qkv kernel, this tree's bundles in dist3) against n3a (2a2fa90 with call 2's engine, dist2) and
# bf1d647 (h, its bundles); the other shapes; conformance (the embed cases included) and
# invariance on n8; a traced n8.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" h=.device/h n3a=.device/n3a n8=.device/n8 tn8=.device/tn8
for i in 1 2 3; do
  ab_run h h
  BENCH=.device/dist2/bench.mjs ab_run n3a n3a
  BENCH=.device/dist3/bench.mjs ab_run n8 n8
done
ab_run bf16-h h NERVA_KV_DTYPE=bf16
BENCH=.device/dist3/bench.mjs ab_run bf16-n8 n8 NERVA_KV_DTYPE=bf16
PL=896 GEN=128 ab_run h-896 h
PL=896 GEN=128 BENCH=.device/dist3/bench.mjs ab_run n8-896 n8
PL=1536 GEN=128 ab_run h-1536 h
PL=1536 GEN=128 BENCH=.device/dist3/bench.mjs ab_run n8-1536 n8
M=qwen3-8b GEN=64 ab_run h-8b h
M=qwen3-8b GEN=64 BENCH=.device/dist3/bench.mjs ab_run n8-8b n8
ab_report
DIST=.device/dist3 ab_check n8
grep -i "fail" $AB/conf.log | head -20
BENCH=.device/dist3/bench.mjs ab_trace n8 /tmp/tn8.node
ab_pack call6
