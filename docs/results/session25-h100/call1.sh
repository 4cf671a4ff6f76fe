#!/usr/bin/env bash
# Session 25 call 1: the cluster attention folding a warp's two key batches in one step (c)
# against HEAD's build (head), alternating; prompt 320 puts two batches in warps 0-1 of every
# block at every step; then the checks.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" head=.device/head c=.device/c
for i in 1 2 3; do
  ab_run head head
  ab_run c c
done
for i in 1 2; do
  PL=320 GEN=64 ab_run head-320 head
  PL=320 GEN=64 ab_run c-320 c
done
ab_run bf16-head head NERVA_KV_DTYPE=bf16
ab_run bf16-c c NERVA_KV_DTYPE=bf16
PL=896 GEN=128 ab_run head-896 head
PL=896 GEN=128 ab_run c-896 c
ab_report
ab_check c
grep -i "fail" $AB/conf.log | head -20
ab_pack call1
