#!/usr/bin/env bash
# Session 21 call 5: earlier triggers (NERVA_DECODE_EARLY bits 4: gate_up lets down in at entry, 8: qkv lets the
# attention in at entry) and the shared GEMV dot expression (dot8bf16): base (ccbbf19) vs new
O=$OUT/a; mkdir -p $O $O/x
xz -dc .device/addon-head/nerva_cuda.node.xz > /tmp/head.node
xz -dc .device/addon/nerva_cuda.node.xz > /tmp/new.node
mkdir -p /tmp/nerva-addon && cp /tmp/new.node /tmp/nerva-addon/nerva_cuda.node
N=/tmp/node
[ -x $N ] || { xz -dc .device/node.xz > $N && chmod +x $N; }
NERVA_SIZES="qwen3-0.6b qwen3-8b" OUT=$O bash tools/gpu/run.sh synth > $O/stdout.log 2>&1
grep "run.sh\]" $O/run.log | tail -3
B=.device/dist/bench.mjs
run() { tag=$1; A=$2; shift 2; env OUT=$O/x NERVA_CUDA_ADDON=$A "$@" timeout 120 $N $B /tmp/synth/${M:-qwen3-0.6b} ${PL:-128} ${GEN:-256} 2>>$O/err.log | tail -1 | sed "s/^{/{\"tag\":\"$tag\",/" >> $O/bench.jsonl; }
for i in 1 2; do
  run base /tmp/head.node
  run new /tmp/new.node
  for e in 7 11 15; do run early$e /tmp/new.node NERVA_DECODE_EARLY=$e; done
done
for a in head new; do PL=1536 GEN=128 run $a-1536 /tmp/$a.node; done
for e in 7 11 15; do PL=1536 GEN=128 run early$e-1536 /tmp/new.node NERVA_DECODE_EARLY=$e; done
M=qwen3-8b GEN=64 run base-8b /tmp/head.node
M=qwen3-8b GEN=64 run new-8b /tmp/new.node
M=qwen3-8b GEN=64 run early15-8b /tmp/new.node NERVA_DECODE_EARLY=15
run new-persistent /tmp/new.node NERVA_CUDA_DECODER=persistent
python3 - <<PY
import json
for l in open('$O/bench.jsonl'):
    j=json.loads(l); print(j['tag'], j.get('tokens_per_s'), j.get('fraction_of_roofline'), j.get('ms_per_token_p50'), (j.get('tokens_sha256') or '')[:16])
PY
NERVA_CUDA_ADDON=/tmp/new.node OUT=$O timeout 150 $N .device/dist/conformance.mjs > $O/conf.log 2>&1; echo "conformance rc $?"; tail -4 $O/conf.log
NERVA_CUDA_ADDON=/tmp/new.node NERVA_DECODE_EARLY=15 OUT=$O timeout 150 $N .device/dist/conformance.mjs > $O/conf15.log 2>&1; echo "conformance early15 rc $?"; tail -4 $O/conf15.log
tail -3 $O/err.log
cd $OUT && tar czf call5.tgz a && rm -rf a
