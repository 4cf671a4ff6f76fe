#!/usr/bin/env bash
# Session 24 call 9: qkv lets the cluster attention in at its entry (NERVA_DECODE_EARLY bit 4), now
# that the attention's blocks fit beside qkv's (session 21 found no gain when they did not), so its
# prologue runs while qkv waits rather than while qkv computes; against the default (3).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
for i in 1 2 3; do
  ab_run e3 new
  ab_run e7 new NERVA_DECODE_EARLY=7
done
ab_run e7-head new NERVA_DECODE_EARLY=7 NERVA_GEMV_LEAN=0
ab_run bf16-e3 new NERVA_KV_DTYPE=bf16
ab_run bf16-e7 new NERVA_KV_DTYPE=bf16 NERVA_DECODE_EARLY=7
PL=896 GEN=128 ab_run e3-896 new
PL=896 GEN=128 ab_run e7-896 new NERVA_DECODE_EARLY=7
PL=1536 GEN=128 ab_run e3-1536 new
PL=1536 GEN=128 ab_run e7-1536 new NERVA_DECODE_EARLY=7
ab_report
NERVA_DECODE_EARLY=7 ab_check new
tail -3 $AB/err.log
ab_pack call9
