#!/usr/bin/env bash
# Session 21 call 1: NERVA_GEMV_L2PRE variants (bulk L2 prefetch instead of register prefetch before the wait), bf16 KV
O=$OUT/a; mkdir -p $O $O/x
xz -dc .device/addon-head/nerva_cuda.node.xz > /tmp/head.node
xz -dc .device/addon/nerva_cuda.node.xz > /tmp/new.node
mkdir -p /tmp/nerva-addon && cp /tmp/new.node /tmp/nerva-addon/nerva_cuda.node
N=/tmp/node
[ -x $N ] || { xz -dc .device/node.xz > $N && chmod +x $N; }
NERVA_SIZES="qwen3-0.6b" OUT=$O bash tools/gpu/run.sh synth > $O/stdout.log 2>&1
grep "run.sh\]" $O/run.log | tail -2
B=.device/dist/bench.mjs
run() { tag=$1; A=$2; shift 2; env OUT=$O/x NERVA_CUDA_ADDON=$A "$@" timeout 120 $N $B /tmp/synth/${M:-qwen3-0.6b} ${PL:-128} ${GEN:-256} 2>>$O/err.log | tail -1 | sed "s/^{/{\"tag\":\"$tag\",/" >> $O/bench.jsonl; }
for i in 1 2; do
  run head /tmp/head.node
  run new0 /tmp/new.node
  for v in 0010 0020 0100 0110 0120 1111 2222 0011 1000 0001; do run l2-$v /tmp/new.node NERVA_GEMV_L2PRE=$v; done
  run early2-0020 /tmp/new.node NERVA_DECODE_EARLY=2 NERVA_GEMV_L2PRE=0020
  run kvbf16 /tmp/new.node NERVA_KV_DTYPE=bf16
done
python3 - <<PY
import json
for l in open('$O/bench.jsonl'):
    j=json.loads(l); print(j['tag'], j.get('tokens_per_s'), j.get('fraction_of_roofline'), j.get('ms_per_token_p50'), (j.get('tokens_sha256') or '')[:16])
PY
tail -3 $O/err.log
cd $OUT && tar czf call1.tgz a && rm -rf a
