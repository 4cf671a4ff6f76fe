#!/usr/bin/env bash
# Session 27 call 9: the final tree's A/B switches re-measured against its defaults (tuned in
# sessions 19-26, before this session's step): down and o in blocks of 4 outputs (fewer
# registers a block: down beside gate_up), the sampler as a cluster of 16, the attention as
# clusters of 16, no early trigger of gate_up/qkv; alternating with the defaults.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" t1=.device/t1
export BENCH=.device/dist7/bench.mjs
for i in 1 2; do
  ab_run default t1
  ab_run wide4 t1 NERVA_GEMV_WIDE=4
  ab_run sample16 t1 NERVA_SAMPLE_CLUSTER=16
  ab_run attn16 t1 NERVA_ATTN_SHORT=16
  ab_run early1 t1 NERVA_DECODE_EARLY=1
  ab_run early2 t1 NERVA_DECODE_EARLY=2
done
ab_run default t1
ab_report
ab_pack call9
