#!/usr/bin/env bash
# Session 22 call 2: the decode group launched (call 1's probe set a shared-memory limit the GPU refused)
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon head=.device/addon-head
ab_run probe-g16 new NERVA_DECODE_GROUP=16
ab_run probe-g8 new NERVA_DECODE_GROUP=8
ab_run probe-def new
ab_report
python3 -c "
import json
for l in open('$AB/bench.jsonl'): j=json.loads(l); print(j['tag'], j['graph_nodes_per_token'], j['tokens_sha256'][:16])"
grep -i "nerva:" $AB/err.log | sort | uniq -c
for i in 1 2 3; do
  ab_run head-f32 head; ab_run off-f32 new NERVA_DECODE_GROUP=0; ab_run g16-f32 new NERVA_DECODE_GROUP=16; ab_run g8-f32 new NERVA_DECODE_GROUP=8
done
for i in 1 2; do
  ab_run off-bf16 new NERVA_DECODE_GROUP=0 NERVA_KV_DTYPE=bf16; ab_run g16-bf16 new NERVA_KV_DTYPE=bf16 NERVA_DECODE_GROUP=16
done
for a in off g16; do
  v=NERVA_DECODE_GROUP=${a#g}; [ $a = off ] && v=NERVA_DECODE_GROUP=0
  PL=1536 GEN=128 ab_run $a-f32-1536 new $v
  PL=4000 GEN=128 ab_run $a-f32-4000 new $v
done
ab_report; NERVA_DECODE_GROUP=16 ab_check new; ab_pack call2
