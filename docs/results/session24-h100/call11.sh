#!/usr/bin/env bash
# Session 24 call 11: o's and down's block width (NERVA_GEMV_WIDE 4 against the default 8) now that
# the attention's blocks sit beside qkv's (session 19 chose 8 before).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
for i in 1 2; do
  ab_run w8 new
  ab_run w4 new NERVA_GEMV_WIDE=4
done
ab_report
ab_pack call11
