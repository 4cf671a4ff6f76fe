#!/usr/bin/env bash
# Session 26 call 5: timed events off the stream (n6: the addon records an untimed shadow event in
# the stream and the timed event behind it on a stream of its own; NERVA_EVENT_SHADOW=0 turns it
# off), and n4b (call 4) again.
# Against n3a (2a2fa90). The graph-gap
# microbenchmark with the shadow arrangement, and a traced n6.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" n3a=.device/n3a n6=.device/n6 n4b=.device/n4b tn6=.device/tn6
.device/micro/graphgap > $AB/graphgap.txt 2>&1; cat $AB/graphgap.txt
export BENCH=.device/dist2/bench.mjs
for i in 1 2 3; do
  ab_run n3a n3a
  ab_run n6 n6
  ab_run n6-off n6 NERVA_EVENT_SHADOW=0
  ab_run n4b n4b
done
ab_report
ab_trace n6 /tmp/tn6.node
ab_pack call5
