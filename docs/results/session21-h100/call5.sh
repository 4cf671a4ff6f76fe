#!/usr/bin/env bash
# Session 21 call 5: earlier triggers (experiment-early-triggers.patch: NERVA_DECODE_EARLY bits 4 and 8) and the
# shared GEMV dot expression (dot8bf16): base (ccbbf19) vs new
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" new=.device/addon head=.device/addon-head
for i in 1 2; do
  ab_run base head; ab_run new new
  for e in 7 11 15; do ab_run early$e new NERVA_DECODE_EARLY=$e; done
done
for a in head new; do PL=1536 GEN=128 ab_run $a-1536 $a; done
for e in 7 11 15; do PL=1536 GEN=128 ab_run early$e-1536 new NERVA_DECODE_EARLY=$e; done
M=qwen3-8b GEN=64 ab_run base-8b head
M=qwen3-8b GEN=64 ab_run new-8b new
M=qwen3-8b GEN=64 ab_run early15-8b new NERVA_DECODE_EARLY=15
ab_run new-persistent new NERVA_CUDA_DECODER=persistent
ab_report
NERVA_CUDA_ADDON=/tmp/new.node NERVA_DECODE_EARLY=15 OUT=$AB timeout 150 $AB_NODE .device/dist/conformance.mjs > $AB/conf15.log 2>&1
echo "conformance early15 rc $?"; tail -4 $AB/conf15.log
ab_check new; ab_pack call5
