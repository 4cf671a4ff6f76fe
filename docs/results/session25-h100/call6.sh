#!/usr/bin/env bash
# Session 25 call 6 (experiment): call 5's shapes one kernel at a time. NERVA_WIDE_KS1: 1 o as a
# warp an output (256 threads of 60 registers), 2 down so (256 of 80), 4 down as 2 warps an
# output with 6 chunks a lane (512 of 62: one such block fits beside a gate_up block).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" k2=.device/k2
for i in 1 2; do
  ab_run off k2
  ab_run o-ks1 k2 NERVA_WIDE_KS1=1
  ab_run down-ks1 k2 NERVA_WIDE_KS1=2
  ab_run down-ks2p6 k2 NERVA_WIDE_KS1=4
done
ab_report
ab_pack call6
