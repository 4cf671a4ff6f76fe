#!/usr/bin/env bash
# Session 24 call 7: how much of the cluster attention's time is gate_up's weight burst beside it?
# o lets gate_up in only after its wait (NERVA_DECODE_EARLY=2) against the default (3); traced marks
# of the attention with each (call 5's build; its L2 prefetch off, NERVA_ATTN_KV_PREFETCH=0, is the
# committed tree).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
xz -dc .device/addon/trace.node.xz > /tmp/trace.node
ab_run early3 new NERVA_ATTN_KV_PREFETCH=0
ab_run early2 new NERVA_ATTN_KV_PREFETCH=0 NERVA_DECODE_EARLY=2
ab_report
echo "== early 2"
ab_marks /tmp/trace.node k_attn_decode_short "1 3 4 5 6" NERVA_ATTN_KV_PREFETCH=0 NERVA_DECODE_EARLY=2
grep -A10 "per kernel" $AB/timeline-mark1.txt
mkdir -p $AB/early2 && mv $AB/timeline-mark* $AB/detail-mark* $AB/early2/
echo "== early 3"
ab_marks /tmp/trace.node k_attn_decode_short "1 3 4 5 6" NERVA_ATTN_KV_PREFETCH=0
tail -3 $AB/err.log
ab_pack call7
