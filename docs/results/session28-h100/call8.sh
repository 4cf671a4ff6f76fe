#!/usr/bin/env bash
# Session 28 call 8: the cluster attention up to 2048 keys (clusters of 16 blocks past 1024;
# capabilities.decodeShortKeyTiers [1024, 2048], the engine's graphs 1s and 1s2048): s7 = this
# tree's addon and bundles (dist9) against s6 (074c3d8's kernels, session 27's bundles: one
# bound, 1024); conformance of s7 (a new case: 1500 keys within maxKeys 2048).
NERVA_CUDA_ARCHITECTURES=90 bash tools/gpu/build-addon.sh /tmp/b-s7 > /tmp/b-s7.log 2>&1 || { tail -20 /tmp/b-s7.log; exit 1; }
mkdir -p /tmp/d-s7 && xz -T8 -c /tmp/b-s7/nerva_cuda.node > /tmp/d-s7/nerva_cuda.node.xz
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" s7=/tmp/d-s7 s6=.device/s6
DIST=.device/dist9
NERVA_CUDA_ADDON=/tmp/s7.node OUT=$AB timeout 200 $AB_NODE $DIST/conformance.mjs > $AB/conf.log 2>&1; echo "conformance rc $?"; tail -4 $AB/conf.log
for i in 1 2; do
  BENCH=.device/dist7/bench.mjs PL=1536 GEN=128 ab_run s6-1536 s6
  BENCH=$DIST/bench.mjs PL=1536 GEN=128 ab_run s7-1536 s7
done
BENCH=$DIST/bench.mjs PL=1536 GEN=128 ab_run s7-1536-bf16 s7 NERVA_KV_DTYPE=bf16
BENCH=$DIST/bench.mjs PL=896 GEN=128 ab_run s7-896 s7
BENCH=.device/dist7/bench.mjs ab_run s6 s6
BENCH=$DIST/bench.mjs ab_run s7 s7
ab_report
python3 -c "
import json
for l in open('$AB/bench.jsonl'):
    j = json.loads(l); print(j['tag'], j.get('decode_graphs'))"
ab_pack call8
