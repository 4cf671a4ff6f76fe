#!/usr/bin/env bash
# Two builds of the tree side by side in one GPU call: the greedy token digests of every fixture
# model and each NERVA_SIZES checkpoint, and batch-1 decode tok/s with the builds alternating, so a
# change that must leave behaviour unchanged (a refactor) is shown to. -> $OUT/compare.jsonl
#
# BEFORE: the older tree's bundles and addon, prepared here from a checkout of it:
#   git worktree add /tmp/before REF && (cd /tmp/before && pnpm install --frozen-lockfile && bash tools/gpu/prepare.sh --addon)
#   mkdir -p .device/before && cp -r /tmp/before/.device/dist .device/before/ && xz -c /tmp/before/.device/addon/nerva_cuda.node > .device/before/nerva_cuda.node.xz
# AFTER: this tree (bash tools/gpu/prepare.sh --addon). Then, on the device (carry [".device"]):
#   NERVA_SIZES="qwen3-0.6b qwen3-8b" OUT=$OUT bash tools/gpu/compare.sh
# COMPARE_RUNS (default 3) decode runs of each build on each size, alternating.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT}
mkdir -p "$OUT/x"
NODE=/tmp/node
[ -x $NODE ] || { xz -dc .device/node.xz > $NODE && chmod +x $NODE; }
xz -dc .device/before/nerva_cuda.node.xz > /tmp/before.node || { echo "no .device/before/nerva_cuda.node.xz"; exit 1; }
xz -dc .device/addon/nerva_cuda.node.xz > /tmp/after.node || { echo "no .device/addon/nerva_cuda.node.xz (prepare.sh --addon)"; exit 1; }
mkdir -p /tmp/nerva-addon && cp /tmp/after.node /tmp/nerva-addon/nerva_cuda.node
OUT="$OUT/x" bash tools/gpu/run.sh synth > "$OUT/x/synth.log" 2>&1

# run TAG BUILD MODEL PROMPT_LEN NEW_TOKENS: one decode probe, its JSON line tagged in compare.jsonl.
run() {
  local tag=$1 build=$2 model=$3 pl=$4 gen=$5 dist=.device/dist
  [ "$build" = before ] && dist=.device/before/dist
  OUT="$OUT/x" NERVA_CUDA_ADDON=/tmp/$build.node timeout 300 $NODE "$dist/bench.mjs" "$model" "$pl" "$gen" 2>> "$OUT/x/err.log" | tail -1 |
    sed "s/^{/{\"tag\":\"$tag\",\"build\":\"$build\",/" >> "$OUT/compare.jsonl"
}

for m in .device/fixtures/models/*/ models/tiny-shakespeare-qwen3/; do
  for b in before after; do run "fixture:$(basename "$m")" $b "$m" 16 32; done
done
for size in ${NERVA_SIZES:-qwen3-0.6b}; do
  gen=256
  [ "$size" = qwen3-8b ] && gen=128
  for i in $(seq "${COMPARE_RUNS:-3}"); do
    for b in before after; do run "$size" $b "/tmp/synth/$size" 128 $gen; done
  done
done

python3 - "$OUT/compare.jsonl" <<'PY' | tee "$OUT/compare-summary.txt"
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
tags = sorted({r['tag'] for r in rows})
ok = True
for t in tags:
    d = {b: [r for r in rows if r['tag'] == t and r['build'] == b] for b in ('before', 'after')}
    sha = {b: {r.get('tokens_sha256') for r in d[b]} for b in d}
    same = sha['before'] == sha['after'] and len(sha['after']) == 1 and None not in sha['after']
    ok &= same
    tps = {b: st.median([r['tokens_per_s'] for r in d[b]]) if d[b] else None for b in d}
    ratio = tps['after'] / tps['before'] if tps['after'] and tps['before'] else None
    print(t, 'digest', ','.join(sorted(map(str, sha['after']))), 'same' if same else 'DIFFERENT before=' + ','.join(map(str, sha['before'])),
          'tok/s before', tps['before'], 'after', tps['after'], 'ratio', None if ratio is None else round(ratio, 4))
print('ALL DIGESTS EQUAL' if ok else 'DIGESTS DIFFER')
PY
