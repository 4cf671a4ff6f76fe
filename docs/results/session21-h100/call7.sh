#!/usr/bin/env bash
# Session 21 call 7: bf16 KV, twice the keys in flight per warp (packed pairs take half the registers): base (HEAD) vs new
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
  for a in head new; do
    run $a-f32 /tmp/$a.node
    run $a-bf16 /tmp/$a.node NERVA_KV_DTYPE=bf16
    PL=1536 GEN=128 run $a-bf16-1536 /tmp/$a.node NERVA_KV_DTYPE=bf16
    PL=4000 GEN=128 run $a-bf16-4000 /tmp/$a.node NERVA_KV_DTYPE=bf16
  done
done
for a in head new; do
  PL=4000 GEN=128 run $a-f32-4000 /tmp/$a.node
  M=qwen3-8b GEN=64 run $a-8b-bf16 /tmp/$a.node NERVA_KV_DTYPE=bf16
  M=qwen3-8b PL=4000 GEN=32 run $a-8b-bf16-4000 /tmp/$a.node NERVA_KV_DTYPE=bf16
  run $a-f32 /tmp/$a.node
done
python3 - <<PY
import json
for l in open('$O/bench.jsonl'):
    j=json.loads(l); print(j['tag'], j.get('tokens_per_s'), j.get('fraction_of_roofline'), j.get('ms_per_token_p50'), (j.get('tokens_sha256') or '')[:16])
PY
NERVA_CUDA_ADDON=/tmp/new.node OUT=$O timeout 150 $N .device/dist/conformance.mjs > $O/conf.log 2>&1; echo "conformance rc $?"; tail -4 $O/conf.log
NERVA_CUDA_ADDON=/tmp/new.node OUT=$O timeout 200 $N .device/dist/batch_invariance.mjs > $O/inv.log 2>&1; echo "invariance rc $?"; grep -c "\] ok" $O/inv.log; sed -n 1,12p $O/inv.log | grep -i "fail" | head -5
tail -3 $O/err.log
cd $OUT && tar czf call7.tgz a && rm -rf a
