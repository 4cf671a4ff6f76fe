#!/usr/bin/env bash
# Session 23 call 8: the cluster decode attention as landed (engine: one-row steps within 1024 keys
# replay a graph of their own, captured with maxKeys 1024), against NERVA_ATTN_SHORT=0 (the split
# kernel always); conformance and batch invariance with it on.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" new=.device/addon
for i in 1 2 3; do
  ab_run off new NERVA_ATTN_SHORT=0
  ab_run on new
done
PL=896 GEN=128 ab_run off-1024 new NERVA_ATTN_SHORT=0
PL=896 GEN=128 ab_run on-1024 new
PL=1536 GEN=128 ab_run off-1536 new NERVA_ATTN_SHORT=0
PL=1536 GEN=128 ab_run on-1536 new
PL=4000 GEN=128 ab_run off-4000 new NERVA_ATTN_SHORT=0
PL=4000 GEN=128 ab_run on-4000 new
ab_run off-bf16 new NERVA_ATTN_SHORT=0 NERVA_KV_DTYPE=bf16
ab_run on-bf16 new NERVA_KV_DTYPE=bf16
M=qwen3-8b GEN=64 ab_run off-8b new NERVA_ATTN_SHORT=0
M=qwen3-8b GEN=64 ab_run on-8b new
ab_report
python3 - $AB/bench.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l); print(j['tag'], 'nodes', j.get('graph_nodes_per_token'), 'copy GB/s', j.get('copy_bandwidth_gbs'), 'roofline', j.get('roofline_tok_s'))
PY
ab_check new
grep -i "fail" $AB/conf.log | head -20
tail -3 $AB/err.log
ab_pack call8
