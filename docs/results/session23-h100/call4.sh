#!/usr/bin/env bash
# Session 23 call 4: is k_attn_decode_short slowed by the next kernels' weight prefetch on its SMs?
# NERVA_SA_TRIGGER: where it lets o in (0 after its wait, 1 after its keys are folded, 2 after the
# merge, 3 at its exit); traced marks with o let in at the exit.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
xz -dc .device/addon/trace.node.xz > /tmp/trace.node
for i in 1 2; do
  ab_run base new
  for t in 0 1 2 3; do ab_run s8-t$t new NERVA_ATTN_SHORT=8 NERVA_SA_TRIGGER=$t; done
  ab_run s8-t0-early1 new NERVA_ATTN_SHORT=8 NERVA_DECODE_EARLY=1
  ab_run s16-t1 new NERVA_ATTN_SHORT=16 NERVA_ATTN_SHORT_CAP=32 NERVA_SA_TRIGGER=1
done
ab_report
for t in 3 1; do
for mk in 1 2 3 5 6; do
  OUT=$AB/x NERVA_CUDA_ADDON=/tmp/trace.node NERVA_ATTN_SHORT=8 NERVA_SA_TRIGGER=$t NERVA_SA_MARK=$mk NERVA_DEVICE_TRACE=$AB/trace.bin timeout 120 $AB_NODE .device/dist/bench.mjs /tmp/synth/qwen3-0.6b 128 256 > /dev/null 2>> $AB/err.log
  python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 > $AB/timeline-t$t-mark$mk.txt 2>&1
  python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 --detail k_attn_decode_short > $AB/detail-t$t-mark$mk.txt 2>&1
  rm -f $AB/trace.bin
  python3 - $AB/detail-t$t-mark$mk.txt $t $mk <<'PY'
import re, sys, statistics as st
rel, mk, ex = [], [], []
for l in open(sys.argv[1]):
    if l.startswith('  grid'):
        rel.append(float(re.search(r'release p50 ([\d.]+)', l).group(1)))
        ex.append(float(re.search(r'exit p10 [\d.]+ p50 ([\d.]+)', l).group(1)))
        m = re.search(r'mark p50 ([\d.]+)', l)
        if m: mk.append(float(m.group(1)))
print('trigger', sys.argv[2], 'mark', sys.argv[3], 'launches', len(rel), 'release p50 %.2f' % st.median(rel), 'mark p50 %.2f' % (st.median(mk) if mk else -1), 'exit p50 %.2f' % st.median(ex))
PY
done
grep -A8 "per kernel" $AB/timeline-t$t-mark1.txt
done
tail -3 $AB/err.log
ab_pack call4
