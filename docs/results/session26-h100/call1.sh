#!/usr/bin/env bash
# Session 26 call 1: the step's end and layer 0 against bf1d647 (h): n with every change on, then
# each change off by its switch (NERVA_DECODE_EARLY=3: no layer-0 qkv entry trigger;
# NERVA_RING_EARLY=0: the ring cursor read after the wait; NERVA_SAMPLE_CLUSTER=0/4/16: the greedy
# sample's blocks as k_sample's last-arriving merge, or clusters of 4/16 instead of 8). Then the
# graph-gap microbenchmark, conformance and invariance on n, and a traced n.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" h=.device/h n=.device/n t=.device/t
.device/micro/graphgap > $AB/graphgap.txt 2>&1; cat $AB/graphgap.txt
for i in 1 2; do
  ab_run h h
  ab_run n n
  ab_run n-off n NERVA_DECODE_EARLY=3 NERVA_RING_EARLY=0 NERVA_SAMPLE_CLUSTER=0
done
ab_run n-e3 n NERVA_DECODE_EARLY=3
ab_run n-r0 n NERVA_RING_EARLY=0
ab_run n-s0 n NERVA_SAMPLE_CLUSTER=0
ab_run n-s16 n NERVA_SAMPLE_CLUSTER=16
ab_run n-s4 n NERVA_SAMPLE_CLUSTER=4
ab_run h3 h
ab_run n3 n
ab_report
ab_check n
grep -i "fail" $AB/conf.log | head -20
ab_trace n /tmp/t.node
ab_trace n-off /tmp/t.node NERVA_DECODE_EARLY=3 NERVA_RING_EARLY=0 NERVA_SAMPLE_CLUSTER=0
ab_pack call1
