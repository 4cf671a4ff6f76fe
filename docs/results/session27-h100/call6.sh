#!/usr/bin/env bash
# Session 27 call 6: gate_up at batch 1 in 56 registers (k_gemv_bf16_glu_lean) so the down
# projection's blocks fit beside it on SMs holding one gate_up block (t2; NERVA_GEMV_GLU_LEAN=0
# runs k_gemv_bf16 in the same addon), alternating; traced steps both ways.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" t2=.device/t2
export BENCH=.device/dist6/bench.mjs
for i in 1 2 3 4; do
  ab_run glu-lean t2
  ab_run glu-full t2 NERVA_GEMV_GLU_LEAN=0
done
ab_report
xz -dc .device/tt2/nerva_cuda.node.xz > /tmp/tt2.node
ab_trace tt2-lean /tmp/tt2.node NERVA_RUN_AHEAD_STEPS=1
ab_trace tt2-full /tmp/tt2.node NERVA_RUN_AHEAD_STEPS=1 NERVA_GEMV_GLU_LEAN=0
ab_pack call6
