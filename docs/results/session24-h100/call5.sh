#!/usr/bin/env bash
# Session 24 call 5: the cluster attention pulls the next layer's keys and values of its rows into
# L2 (NERVA_ATTN_KV_PREFETCH, default on), so that layer's key copies, issued while its qkv runs,
# hit L2 instead of competing with qkv's weights for HBM; against the qkv bound alone and the head.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
xz -dc .device/addon/trace.node.xz > /tmp/trace.node
for i in 1 2 3; do
  ab_run head new NERVA_GEMV_LEAN=0 NERVA_ATTN_KV_PREFETCH=0
  ab_run lean new NERVA_ATTN_KV_PREFETCH=0
  ab_run lean-pf new
done
ab_run pf-only new NERVA_GEMV_LEAN=0
ab_run bf16-lean new NERVA_KV_DTYPE=bf16 NERVA_ATTN_KV_PREFETCH=0
ab_run bf16-lean-pf new NERVA_KV_DTYPE=bf16
PL=896 GEN=128 ab_run lean-896 new NERVA_ATTN_KV_PREFETCH=0
PL=896 GEN=128 ab_run lean-pf-896 new
ab_report
for v in lean lean-pf; do
  case $v in lean) e="NERVA_ATTN_KV_PREFETCH=0";; lean-pf) e="";; esac
  env $e OUT=$AB/x NERVA_CUDA_ADDON=/tmp/trace.node NERVA_DEVICE_TRACE=$AB/trace.bin timeout 120 $AB_NODE .device/dist/bench.mjs /tmp/synth/qwen3-0.6b 128 256 > /dev/null 2>> $AB/err.log
  python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 > $AB/timeline-$v.txt 2>&1
  rm -f $AB/trace.bin
  echo "== $v"; grep -A10 "per kernel" $AB/timeline-$v.txt
done
tail -3 $AB/err.log
ab_pack call5
