#!/usr/bin/env bash
# Session 25 call 2: HEAD's build (head) against this session's (n: call 1's two-batch fold,
# op sample_step as one launch, the embedding's 16-byte loads, the greedy argmax's loads in
# flight together); n with NERVA_SAMPLE_STEP=0 runs the step's end as three launches again.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" head=.device/head n=.device/n
for i in 1 2 3; do
  ab_run head head
  ab_run n n
  ab_run n-3ops n NERVA_SAMPLE_STEP=0
done
ab_run bf16-head head NERVA_KV_DTYPE=bf16
ab_run bf16-n n NERVA_KV_DTYPE=bf16
PL=896 GEN=128 ab_run head-896 head
PL=896 GEN=128 ab_run n-896 n
ab_report
ab_check n
grep -i "fail" $AB/conf.log | head -20
ab_pack call2
