#!/usr/bin/env bash
# Session 22 call 6: where the decode group's time goes: its trace mark at six points (NERVA_DG_MARK)
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
xz -dc .device/addon/trace.node.xz > /tmp/trace.node
for m in 1 2 3 4 5 6; do
  OUT=$AB/x NERVA_CUDA_ADDON=/tmp/trace.node NERVA_DECODE_GROUP=16 NERVA_DG_MARK=$m NERVA_DEVICE_TRACE=$AB/trace.bin timeout 120 $AB_NODE .device/dist/bench.mjs /tmp/synth/qwen3-0.6b 128 256 > /dev/null 2>> $AB/err.log
  python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 --detail k_decode_group > $AB/mark$m.txt 2>&1
  [ $m = 1 ] && python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 > $AB/timeline-g16.txt 2>&1
  rm -f $AB/trace.bin
  python3 - $AB/mark$m.txt $m <<'PY'
import re, sys, statistics as st
rel, mk, ex, tail = [], [], [], []
for l in open(sys.argv[1]):
    m = re.search(r'release p50 ([\d.]+) .*exit p10 ([\d.]+) p50 ([\d.]+) .*last ([\d.]+) \(block \d+\) \| mark p50 ([\d.]+); longest after mark: at ([\d.]+), ([\d.]+) after', l)
    if m:
        rel.append(float(m.group(1))); ex.append(float(m.group(3))); mk.append(float(m.group(5))); tail.append(float(m.group(4)))
print('mark', sys.argv[2], 'launches', len(mk), 'release p50 %.2f mark p50 %.2f exit p50 %.2f last exit %.2f' % (st.median(rel), st.median(mk), st.median(ex), st.median(tail)))
PY
done
grep -A10 "per kernel" $AB/timeline-g16.txt
tail -3 $AB/err.log
ab_pack call6
