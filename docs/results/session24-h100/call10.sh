#!/usr/bin/env bash
# Session 24 call 10: capabilities.decodeShortKeys now comes from the addon's info() (its
# SA_MAX_KEYS): the engine still captures the short-context graph by default ('1s') and the split
# kernel's graph with NERVA_ATTN_SHORT=0 ('1'); same tokens.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
ab_run default new
ab_run short-off new NERVA_ATTN_SHORT=0
ab_report
python3 - $AB/bench.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    print(j['tag'], 'decode_graphs', j.get('decode_graphs'))
PY
tail -3 $AB/err.log
ab_pack call10
