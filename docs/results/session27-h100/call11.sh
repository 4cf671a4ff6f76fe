#!/usr/bin/env bash
# Session 27 call 11 (experiment): layer 0's attention waits for SMs the step's first kernel
# reconfigured to a small shared-memory carveout while they were idle (session 26: a 72 %
# preference on that kernel fixed layer 0 but left every SM at 164 KB, o and down slower).
# Here the first kernel asks for 72 % and o/down (k_gemv_wide) and gate_up ask for the smallest
# carveout that fits them, so SMs that go idle mid-step return to a large L1. cv = this tree
# plus the NERVA_CARVE_* knobs (unset: no preference); alternating.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" cv=.device/cv
export BENCH=.device/dist7/bench.mjs
for i in 1 2 3; do
  ab_run base cv
  ab_run emb72 cv NERVA_CARVE_EMB=72
  ab_run emb72-wide0 cv NERVA_CARVE_EMB=72 NERVA_CARVE_WIDE=0
  ab_run emb72-wide0-glu0 cv NERVA_CARVE_EMB=72 NERVA_CARVE_WIDE=0 NERVA_CARVE_GLU=0
done
ab_report
ab_pack call11
