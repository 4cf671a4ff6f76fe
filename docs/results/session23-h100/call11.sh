#!/usr/bin/env bash
# Session 23 call 11: the tree as committed (launch-config helper, the kernel body guarded below
# sm_90): the decode probe both ways and the checks.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
for i in 1 2; do
  ab_run off new NERVA_ATTN_SHORT=0
  ab_run on new
done
ab_report
python3 - $AB/bench.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l); print(j['tag'], 'graphs', j.get('decode_graphs'), 'nodes', j.get('graph_nodes_per_token'), 'copy GB/s', j.get('copy_bandwidth_gbs'))
PY
ab_check new
tail -3 $AB/err.log
ab_pack call11
