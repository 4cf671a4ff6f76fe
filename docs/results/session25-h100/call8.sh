#!/usr/bin/env bash
# Session 25 call 8: the checks of the final build (nw, 12d0c7a) with the conformance and
# invariance bundles of this tree (call 7's bundles still held the op sample_step experiment's
# cases), two more alternating rounds against 5ebc3e2 (n2), and prompt 1536 (the split-KV
# attention, whose rope now loads its norm weights apart too).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" n2=.device/n2 nw=.device/nw
for i in 1 2; do
  ab_run n2 n2
  ab_run nw nw
done
PL=1536 GEN=128 ab_run n2-1536 n2
PL=1536 GEN=128 ab_run nw-1536 nw
ab_report
ab_check nw
grep -i "fail" $AB/conf.log | head -20
ab_pack call8
