#!/usr/bin/env bash
# Session 21 call 2: why bf16 KV decodes slower than f32 KV at batch 1 (traced timelines), and the 8B
O=$OUT/a; mkdir -p $O $O/x
xz -dc .device/addon-head/nerva_cuda.node.xz > /tmp/head.node
xz -dc .device/addon-head/trace.node.xz > /tmp/trace.node
mkdir -p /tmp/nerva-addon && cp /tmp/head.node /tmp/nerva-addon/nerva_cuda.node
N=/tmp/node
[ -x $N ] || { xz -dc .device/node.xz > $N && chmod +x $N; }
NERVA_SIZES="qwen3-0.6b qwen3-8b" OUT=$O bash tools/gpu/run.sh synth > $O/stdout.log 2>&1
grep "run.sh\]" $O/run.log | tail -3
B=.device/dist/bench.mjs
run() { tag=$1; A=$2; shift 2; env OUT=$O/x NERVA_CUDA_ADDON=$A "$@" timeout 120 $N $B /tmp/synth/${M:-qwen3-0.6b} ${PL:-128} ${GEN:-256} 2>>$O/err.log | tail -1 | sed "s/^{/{\"tag\":\"$tag\",/" >> $O/bench.jsonl; }
for i in 1 2; do
  run f32 /tmp/head.node
  run bf16 /tmp/head.node NERVA_KV_DTYPE=bf16
done
PL=1536 GEN=128 run f32-1536 /tmp/head.node
PL=1536 GEN=128 run bf16-1536 /tmp/head.node NERVA_KV_DTYPE=bf16
M=qwen3-8b GEN=64 run 8b-f32 /tmp/head.node
M=qwen3-8b GEN=64 run 8b-bf16 /tmp/head.node NERVA_KV_DTYPE=bf16
for kv in f32 bf16; do
  OUT=$O/x NERVA_CUDA_ADDON=/tmp/trace.node NERVA_KV_DTYPE=$kv NERVA_DEVICE_TRACE=$O/trace.bin timeout 120 $N $B /tmp/synth/qwen3-0.6b 128 256 > /dev/null 2>>$O/err.log
  python3 tools/gpu/trace_timeline.py $O/trace.bin --tokens 6 > $O/timeline-$kv.txt 2>&1
  python3 tools/gpu/trace_timeline.py $O/trace.bin --tokens 6 --detail k_attn_partial_rope > $O/timeline-$kv-attn.txt 2>&1
  rm -f $O/trace.bin
  grep -A12 "per kernel" $O/timeline-$kv.txt
done
python3 - <<PY
import json
for l in open('$O/bench.jsonl'):
    j=json.loads(l); print(j['tag'], j.get('tokens_per_s'), j.get('fraction_of_roofline'), j.get('ms_per_token_p50'), (j.get('tokens_sha256') or '')[:16], j.get('kv_cache_dtype'))
PY
tail -3 $O/err.log
cd $OUT && tar czf call2.tgz a && rm -rf a
