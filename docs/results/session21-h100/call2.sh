#!/usr/bin/env bash
# Session 21 call 2: why bf16 KV decodes slower than f32 KV at batch 1 (traced timelines), and the 8B.
# .device/addon-head: the build of a7df150; trace.node.xz beside it: the same with -DNERVA_TRACE.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" head=.device/addon-head
xz -dc .device/addon-head/trace.node.xz > /tmp/trace.node
for i in 1 2; do ab_run f32 head; ab_run bf16 head NERVA_KV_DTYPE=bf16; done
PL=1536 GEN=128 ab_run f32-1536 head
PL=1536 GEN=128 ab_run bf16-1536 head NERVA_KV_DTYPE=bf16
M=qwen3-8b GEN=64 ab_run 8b-f32 head
M=qwen3-8b GEN=64 ab_run 8b-bf16 head NERVA_KV_DTYPE=bf16
for kv in f32 bf16; do
  OUT=$AB/x NERVA_CUDA_ADDON=/tmp/trace.node NERVA_KV_DTYPE=$kv NERVA_DEVICE_TRACE=$AB/trace.bin timeout 120 $AB_NODE .device/dist/bench.mjs /tmp/synth/qwen3-0.6b 128 256 > /dev/null 2>> $AB/err.log
  python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 > $AB/timeline-$kv.txt 2>&1
  python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 --detail k_attn_partial_rope > $AB/timeline-$kv-attn.txt 2>&1
  rm -f $AB/trace.bin
  grep -A12 "per kernel" $AB/timeline-$kv.txt
done
ab_report; ab_pack call2
