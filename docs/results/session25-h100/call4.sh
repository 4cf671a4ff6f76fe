#!/usr/bin/env bash
# Session 25 call 4 (experiment): o's blocks hint the last NERVA_GU_L2 of gate_up's rows (gate
# and up) into L2 before their wait, while the attention leaves HBM idle: gate_up's last blocks
# become resident only after the attention's or o's blocks leave and load their weights late.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" pf=.device/pf
for i in 1 2 3; do
  ab_run off pf
  ab_run gu33 pf NERVA_GU_L2=0.33
  ab_run gu50 pf NERVA_GU_L2=0.5
  ab_run gu100 pf NERVA_GU_L2=1
done
ab_report
ab_pack call4
