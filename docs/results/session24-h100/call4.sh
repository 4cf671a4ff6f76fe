#!/usr/bin/env bash
# Session 24 call 4: the landed tree, traced: the cluster attention's phases now that its blocks are
# resident beside qkv (NERVA_SA_MARK 1, 3, 4, 5, 6), and one untraced decode probe each way.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
xz -dc .device/addon/trace.node.xz > /tmp/trace.node
ab_run head new NERVA_GEMV_LEAN=0
ab_run lean new
ab_report
for mk in 1 3 4 5 6; do
  OUT=$AB/x NERVA_CUDA_ADDON=/tmp/trace.node NERVA_SA_MARK=$mk NERVA_DEVICE_TRACE=$AB/trace.bin timeout 120 $AB_NODE .device/dist/bench.mjs /tmp/synth/qwen3-0.6b 128 256 > /dev/null 2>> $AB/err.log
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
grep -A10 "per kernel" $AB/timeline-mark1.txt
tail -3 $AB/err.log
ab_pack call4
