#!/usr/bin/env bash
# Session 23 call 5: k_attn_decode_short rewritten: a quad of lanes a key, warps with their own
# running softmax, partials pushed to the merging block (one cluster barrier, no remote loads).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
xz -dc .device/addon/trace.node.xz > /tmp/trace.node
for i in 1 2; do
  ab_run base new
  ab_run s8-t0 new NERVA_ATTN_SHORT=8
  ab_run s8-t1 new NERVA_ATTN_SHORT=8 NERVA_SA_TRIGGER=1
  ab_run s4c96 new NERVA_ATTN_SHORT=4 NERVA_ATTN_SHORT_CAP=96
  ab_run s16c32 new NERVA_ATTN_SHORT=16 NERVA_ATTN_SHORT_CAP=32
done
PL=1536 GEN=128 ab_run base-1536 new
PL=1536 GEN=128 ab_run s8-1536 new NERVA_ATTN_SHORT=8
ab_run bf16-base new NERVA_KV_DTYPE=bf16
ab_run bf16-s8 new NERVA_KV_DTYPE=bf16 NERVA_ATTN_SHORT=8
ab_report
for mk in 1 3 4 5 6; do
  OUT=$AB/x NERVA_CUDA_ADDON=/tmp/trace.node NERVA_ATTN_SHORT=8 NERVA_SA_MARK=$mk NERVA_DEVICE_TRACE=$AB/trace.bin timeout 120 $AB_NODE .device/dist/bench.mjs /tmp/synth/qwen3-0.6b 128 256 > /dev/null 2>> $AB/err.log
  python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 > $AB/timeline-mark$mk.txt 2>&1
  python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 --detail k_attn_decode_short > $AB/detail-mark$mk.txt 2>&1
  rm -f $AB/trace.bin
  python3 - $AB/detail-mark$mk.txt $mk <<'PY'
import re, sys, statistics as st
rel, mk, ex = [], [], []
for l in open(sys.argv[1]):
    if l.startswith('  grid'):
        rel.append(float(re.search(r'release p50 ([\d.]+)', l).group(1)))
        ex.append(float(re.search(r'exit p10 [\d.]+ p50 ([\d.]+)', l).group(1)))
        m = re.search(r'mark p50 ([\d.]+)', l)
        if m: mk.append(float(m.group(1)))
print('mark', sys.argv[2], 'launches', len(rel), 'release p50 %.2f' % st.median(rel), 'mark p50 %.2f' % (st.median(mk) if mk else -1), 'exit p50 %.2f' % st.median(ex))
PY
done
grep -A8 "per kernel" $AB/timeline-mark1.txt
NERVA_ATTN_SHORT=8 ab_check new
grep -i "fail" $AB/conf.log | head -20
tail -3 $AB/err.log
ab_pack call5
