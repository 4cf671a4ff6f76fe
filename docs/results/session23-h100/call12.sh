#!/usr/bin/env bash
# Session 23 call 12: the committed tree after the weights helper (saWeight, same arithmetic):
# the decode probe both ways and the checks.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
ab_run off new NERVA_ATTN_SHORT=0
ab_run on new
ab_run on new
ab_report
ab_check new
tail -3 $AB/err.log
ab_pack call12
