#!/usr/bin/env bash
# Session 23 call 10: the cluster attention with its softmax steps for both heads interleaved and
# the push's and merge's weights computed a lane each (v3), against the landed build (v2) and the
# split kernel.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" v3=.device/addon v2=.device/addon128
for i in 1 2 3; do
  ab_run off v2 NERVA_ATTN_SHORT=0
  ab_run v2 v2
  ab_run v3 v3
done
PL=640 GEN=128 ab_run v2-768 v2
PL=640 GEN=128 ab_run v3-768 v3
ab_run v2-bf16 v2 NERVA_KV_DTYPE=bf16
ab_run v3-bf16 v3 NERVA_KV_DTYPE=bf16
ab_report
python3 - $AB/bench.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l); print(j['tag'], 'copy GB/s', j.get('copy_bandwidth_gbs'))
PY
ab_check v3
grep -i "fail" $AB/conf.log | head -20
tail -3 $AB/err.log
ab_pack call10
