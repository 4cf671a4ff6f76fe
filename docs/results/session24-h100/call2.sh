#!/usr/bin/env bash
# Session 24 call 2: qkv in 48 registers by default (NERVA_GEMV_LEAN) and o's projection fused into
# the cluster attention (NERVA_ATTN_O); each switch off against both on, alternating; the checks;
# a traced step of each.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" new=.device/addon
xz -dc .device/addon/trace.node.xz > /tmp/trace.node
for i in 1 2; do
  ab_run head new NERVA_GEMV_LEAN=0 NERVA_ATTN_O=0
  ab_run lean new NERVA_ATTN_O=0
  ab_run fo new NERVA_GEMV_LEAN=0
  ab_run both new
done
ab_run bf16-head new NERVA_KV_DTYPE=bf16 NERVA_GEMV_LEAN=0 NERVA_ATTN_O=0
ab_run bf16-both new NERVA_KV_DTYPE=bf16
PL=896 GEN=128 ab_run head-896 new NERVA_GEMV_LEAN=0 NERVA_ATTN_O=0
PL=896 GEN=128 ab_run both-896 new
PL=1536 GEN=128 ab_run head-1536 new NERVA_GEMV_LEAN=0 NERVA_ATTN_O=0
PL=1536 GEN=128 ab_run both-1536 new
M=qwen3-8b GEN=64 ab_run 8b-head new NERVA_GEMV_LEAN=0 NERVA_ATTN_O=0
M=qwen3-8b GEN=64 ab_run 8b-both new
ab_report
for v in lean both; do
  case $v in lean) e="NERVA_ATTN_O=0";; both) e="";; esac
  env $e OUT=$AB/x NERVA_CUDA_ADDON=/tmp/trace.node NERVA_DEVICE_TRACE=$AB/trace.bin timeout 120 $AB_NODE .device/dist/bench.mjs /tmp/synth/qwen3-0.6b 128 256 > /dev/null 2>> $AB/err.log
  python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 > $AB/timeline-$v.txt 2>&1
  rm -f $AB/trace.bin
  echo "== $v"; grep -A10 "per kernel" $AB/timeline-$v.txt
done
ab_check new
grep -i "fail" $AB/conf.log | head -20
tail -3 $AB/err.log
ab_pack call2
