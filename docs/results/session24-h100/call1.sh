#!/usr/bin/env bash
# Session 24 call 1: can the cluster attention's blocks be resident beside qkv's? qkv in 48
# registers (NERVA_GEMV_LEAN=1) and/or every kernel preferring the largest shared-memory
# carveout (NERVA_CARVE=1); decode probes alternating, then a traced step of each.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
xz -dc .device/addon/trace.node.xz > /tmp/trace.node
for i in 1 2; do
  ab_run base new
  ab_run lean new NERVA_GEMV_LEAN=1
  ab_run carve new NERVA_CARVE=1
  ab_run both new NERVA_GEMV_LEAN=1 NERVA_CARVE=1
done
ab_run bf16-base new NERVA_KV_DTYPE=bf16
ab_run bf16-both new NERVA_KV_DTYPE=bf16 NERVA_GEMV_LEAN=1 NERVA_CARVE=1
PL=1536 GEN=128 ab_run base-1536 new
PL=1536 GEN=128 ab_run both-1536 new NERVA_GEMV_LEAN=1 NERVA_CARVE=1
ab_report
for v in base lean carve both; do
  case $v in base) e="";; lean) e="NERVA_GEMV_LEAN=1";; carve) e="NERVA_CARVE=1";; both) e="NERVA_GEMV_LEAN=1 NERVA_CARVE=1";; esac
  env $e OUT=$AB/x NERVA_CUDA_ADDON=/tmp/trace.node NERVA_DEVICE_TRACE=$AB/trace.bin timeout 120 $AB_NODE .device/dist/bench.mjs /tmp/synth/qwen3-0.6b 128 256 > /dev/null 2>> $AB/err.log
  python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 > $AB/timeline-$v.txt 2>&1
  rm -f $AB/trace.bin
  echo "== $v"; grep -A10 "per kernel" $AB/timeline-$v.txt
done
tail -3 $AB/err.log
ab_pack call1
