#!/usr/bin/env bash
# Session 25 call 7: the cluster attention with its q/k norm weights and the new key's slot taken
# before the dependency wait (nw) against the build of 5ebc3e2 (n2), alternating; then the checks.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" n2=.device/n2 nw=.device/nw
for i in 1 2 3; do
  ab_run n2 n2
  ab_run nw nw
done
ab_run bf16-n2 n2 NERVA_KV_DTYPE=bf16
ab_run bf16-nw nw NERVA_KV_DTYPE=bf16
PL=896 GEN=128 ab_run n2-896 n2
PL=896 GEN=128 ab_run nw-896 nw
ab_report
ab_check nw
grep -i "fail" $AB/conf.log | head -20
ab_pack call7
