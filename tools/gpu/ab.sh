# A/B decode runs of prebuilt addons on the GPU machine, sourced by a call script:
#
#   source tools/gpu/ab.sh
#   ab_setup "qwen3-0.6b qwen3-8b" base=.device/addon-head new=.device/addon   # xz-compressed addons
#   for i in 1 2 3; do ab_run base base; ab_run new new; done                  # alternate the builds
#   PL=1536 GEN=128 ab_run new-1536 new NERVA_KV_DTYPE=bf16                    # VAR=value: the run's env
#   ab_report; ab_check new; ab_pack callN
#
# ab_setup unpacks Node (.device/node.xz) and each NAME=DIR's DIR/nerva_cuda.node.xz to
# /tmp/NAME.node (the first is also /tmp/nerva-addon/nerva_cuda.node, where run.sh looks), then
# synthesizes the sizes (run.sh synth). ab_run TAG NAME [VAR=value...]: one decode probe
# (.device/dist/bench.mjs, prompt PL (128), GEN (256) new tokens, checkpoint M (qwen3-0.6b)) on
# /tmp/NAME.node, its JSON line tagged TAG in $AB/bench.jsonl; BENCH=PATH runs another bundle of
# bench.ts (an engine change against the tree's: .device/dist2/bench.mjs, say). ab_report prints tag, tok/s,
# fraction of roofline, p50 ms and token digest a line. ab_check NAME: conformance and batch
# invariance on that addon (DIST=DIR: the bundles of another tree, as BENCH). ab_pack NAME: $OUT/NAME.tgz of everything under $AB.
# ab_fork TAG NAME [VAR=value...]: 32 batch-invariant forks of checkpoint M (qwen3-8b), bf16 KV, GEN (128) tokens
# each, the forks alone (nerva-bench fork --no-sequential: seconds, not minutes) on /tmp/NAME.node; the line
# in $AB/fork.jsonl, and tag, fork step device ms (p50), step interval ms, tokens_sha256 and graph nodes printed.
# ab_prefill TAG NAME MODEL [nerva-bench prefill flags...]: --repeats 3 timed prefills of MODEL (a checkpoint folder
# or a GGUF file) on /tmp/NAME.node, e.g. --prompt-len 4096 --matmul-precision bf16 [--profile]; the line in
# $AB/prefill.jsonl, and tag, prompt, precision, ms median, tok/s, MFU against the run's GEMM rate and against the
# peak (and --profile's ms by op class) printed (DIST=DIR: the bundles of another tree, as ab_check).
# ab_tokens TAG NAME MODEL [nerva run flags...]: the greedy tokens of a 2000-token prompt (ids from Python's
# random.Random(7), 1..149999) on /tmp/NAME.node, 12 new, printed with the first step's top 3 logits: the check that
# a kernel change keeps a long prompt's outputs (e.g. --matmul-precision bf16; DIST=DIR: another tree's bundles).
# ab_gguf M TYPE: a synthetic GGUF file of checkpoint config M at TYPE (Q4_K_M, Q8_0, ...) as /tmp/synth/M-TYPE.gguf
# (once: an existing file is kept), for ab_run / ab_prefill (M=M-TYPE.gguf).
# ab_kernels TAG NAME: ncu times each kernel of 32 forks of checkpoint M (qwen3-8b) on /tmp/NAME.node
# (fork_kernels.mjs, 6 tokens); kernel_table.py then sums the last 3 decode steps (the 32-row graph's
# node count read from the run's output) -> $AB/kernels-TAG.txt, printed.
# ab_profile TAG NAME KERNEL [ROWS] [SKIP]: ncu --set full on one launch of KERNEL (a regex on kernel names) in
# ROWS (32) batch-invariant forks (12 tokens each, two rounds) of checkpoint M (qwen3-0.6b) on /tmp/NAME.node, after SKIP (200) launches of it
# (past the first round's, so a replayed decode graph's) -> $AB/profile-TAG.txt (ncu's details page), key lines printed.
# ab_profile_prefill TAG NAME KERNEL MODEL [SKIP] [nerva-bench prefill flags...]: ncu --set full on one launch of KERNEL in
# a prefill of MODEL (--repeats 1) on /tmp/NAME.node, after SKIP (36: the warm-up prefill's launches of a 36-layer
# model) launches of it -> $AB/profile-TAG.txt, key lines printed; e.g. ab_profile_prefill wg cand k_attn_prefill_wgmma
# /tmp/synth/qwen3-8b 36 --prompt-len 4096 --matmul-precision bf16.
# ab_trace TAG TRACE_ADDON [VAR=value...]: one decode probe on a traced addon (built with -DNERVA_TRACE),
# its timeline in $AB/timeline-TAG.txt (DETAIL=KERNEL: that kernel's block detail in
# $AB/detail-TAG.txt too; LAYER=KERNEL: one layer's blocks around a launch of KERNEL, each kernel's residency,
# release and exit, in $AB/layer-TAG.txt; KEEP_TRACE=1: the trace itself, $AB/trace-TAG.bin.xz); prints the
# per-kernel summary.
# ab_marks TRACE_ADDON KERNEL "MARKS" [VAR=value...]: ab_trace for each mark value (NERVA_SA_MARK, tag
# markN, KERNEL's detail kept), and one line a mark: the medians over the step's launches of the
# blocks' release, mark and exit (µs after a launch's first release).
# ab_sass TAG NAME MANGLED: `cuobjdump -sass` of the function MANGLED (a kernel's mangled name, e.g.
# _ZN5nerva3ops7k_qgemvILi7ELi16ELb0EEEvPKfPKhPfiiiiPKviiiiiii) in /tmp/NAME.node -> $AB/sass-TAG.txt,
# and its largest loop's instruction mix printed (tools/gpu/sass_loop.py).
# Build the addons here first: NERVA_CUDA_ARCHITECTURES=90 bash tools/gpu/build-addon.sh DIR (a variant of one
# kernel file: cp -r DIR VAR && bash tools/gpu/build-addon.sh VAR ops/attention/decode_gqa.cu), then
# xz -c DIR/nerva_cuda.node > .device/addon/nerva_cuda.node.xz (carry ".device"; the run tool's 64 MiB
# limit counts the tracked tree too, ~20 MiB, and .device's Node, bundles and fixtures ~30 MiB: room
# for about ten addons of ~1.4 MiB xz-compressed, two of ~6 MiB built with NERVA_LINEINFO=1).

AB=${OUT:?set OUT to the output folder of the run tool}/a
AB_NODE=/tmp/node

ab_setup() {
  local sizes=$1 spec name dir first=1
  shift
  mkdir -p "$AB/x"
  [ -x $AB_NODE ] || { xz -dc .device/node.xz > $AB_NODE && chmod +x $AB_NODE; }
  for spec in "$@"; do
    name=${spec%%=*}
    dir=${spec#*=}
    xz -dc "$dir/nerva_cuda.node.xz" > "/tmp/$name.node" || return 1
    if [ $first = 1 ]; then
      mkdir -p /tmp/nerva-addon && cp "/tmp/$name.node" /tmp/nerva-addon/nerva_cuda.node
      first=0
    fi
  done
  NERVA_SIZES="$sizes" OUT=$AB bash tools/gpu/run.sh synth > "$AB/stdout.log" 2>&1
  grep "run.sh\]" "$AB/run.log" | tail -3
}

ab_run() {
  local tag=$1 name=$2
  shift 2
  env OUT="$AB/x" NERVA_CUDA_ADDON="/tmp/$name.node" "$@" timeout 120 $AB_NODE ${BENCH:-.device/dist/bench.mjs} \
    "/tmp/synth/${M:-qwen3-0.6b}" "${PL:-128}" "${GEN:-256}" 2>> "$AB/err.log" | tail -1 |
    sed "s/^{/{\"tag\":\"$tag\",/" >> "$AB/bench.jsonl"
}

ab_report() {
  python3 - "$AB/bench.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    print(j['tag'], j.get('tokens_per_s'), j.get('fraction_of_roofline'), j.get('ms_per_token_p50'), (j.get('tokens_sha256') or '')[:16])
PY
  tail -3 "$AB/err.log" 2> /dev/null
}

ab_fork() {
  local tag=$1 name=$2
  shift 2
  env NERVA_CUDA_ADDON="/tmp/$name.node" "$@" timeout 150 $AB_NODE .device/dist/bench_cli.mjs fork --model "/tmp/synth/${M:-qwen3-8b}" \
    --backend cuda --kv-cache-dtype bf16 --batch-invariant --no-sequential --new-tokens "${GEN:-128}" 2>> "$AB/err.log" | tail -1 |
    sed "s/^{/{\"tag\":\"$tag\",/" >> "$AB/fork.jsonl"
  python3 -c "import json,sys; j=json.loads(open(sys.argv[1]).readlines()[-1]); print(j['tag'], j.get('fork_step_device_ms_p50'), j.get('fork_step_interval_ms'), j.get('tokens_sha256'), j.get('graph_nodes'))" "$AB/fork.jsonl"
}

ab_prefill() {
  local tag=$1 name=$2 model=$3
  shift 3
  NERVA_CUDA_ADDON="/tmp/$name.node" timeout 150 $AB_NODE ${DIST:-.device/dist}/bench_cli.mjs prefill --model "$model" --backend cuda \
    --repeats 3 "$@" 2>> "$AB/err.log" | tail -1 | sed "s/^{/{\"tag\":\"$tag\",/" >> "$AB/prefill.jsonl"
  python3 - "$AB/prefill.jsonl" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).readlines()[-1])
print(j['tag'], {k: j.get(k) for k in ['prompt_len', 'matmul_precision', 'ms_median', 'tokens_per_s', 'mfu', 'mfu_vs_peak', 'error']})
p = j.get('profile')
if p:
    print('  profile', json.dumps(p.get('ms'))[:700])
PY
}

ab_tokens() {
  local tag=$1 name=$2 model=$3 ids
  shift 3
  ids=$(python3 -c "import random; r = random.Random(7); print(','.join(str(r.randrange(1, 150000)) for _ in range(2000)))")
  NERVA_CUDA_ADDON="/tmp/$name.node" timeout 90 $AB_NODE ${DIST:-.device/dist}/cli.mjs run --model "$model" --backend cuda \
    --prompt-ids "$ids" --max-tokens 12 --temperature 0 --json "$@" 2>> "$AB/err.log" | tail -1 > "$AB/tokens-$tag.json"
  python3 - "$AB/tokens-$tag.json" "$tag" <<'PY'
import json, sys
try:
    j = json.loads(open(sys.argv[1]).read())
    print(sys.argv[2], j['token_ids'], [(i, round(v, 5)) for i, v in j['first_logits_top5'][:3]])
except Exception as e:
    print(sys.argv[2], 'no result:', e)
PY
}

ab_gguf() {
  local m=$1 type=$2 f t0
  f=/tmp/synth/$m-$type.gguf
  [ -f "$f" ] && return 0
  t0=$(date +%s)
  timeout 240 $AB_NODE .device/dist/cli.mjs synth --config ".device/configs/$m.json" --out "$f" --gguf "$type" > "$AB/synth-$m-$type.log" 2>&1
  echo "gguf synth $m $type rc $? $(( $(date +%s) - t0 )) s"
}

ab_sass() {
  local tag=$1 name=$2 fun=$3
  cuobjdump -sass -fun "$fun" "/tmp/$name.node" > "$AB/sass-$tag.txt" 2>> "$AB/err.log"
  echo "== $tag"
  python3 tools/gpu/sass_loop.py "$AB/sass-$tag.txt" --top 12
}

ab_kernels() {
  local tag=$1 name=$2 n
  NERVA_CUDA_ADDON="/tmp/$name.node" timeout 300 ncu --csv --metrics gpu__time_duration.sum $AB_NODE .device/dist/fork_kernels.mjs \
    "/tmp/synth/${M:-qwen3-8b}" 32 6 > "$AB/kernels-$tag.csv" 2>> "$AB/err.log"
  n=$(python3 tools/gpu/kernel_table.py --nodes "$AB/kernels-$tag.csv") || return 1
  python3 tools/gpu/kernel_table.py "$AB/kernels-$tag.csv" "$n" > "$AB/kernels-$tag.txt" && cat "$AB/kernels-$tag.txt"
}

ab_profile() {
  local tag=$1 name=$2 kernel=$3 rows=${4:-32} skip=${5:-200}
  NERVA_CUDA_ADDON="/tmp/$name.node" timeout 300 ncu --set full -k "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
    $AB_NODE .device/dist/fork_kernels.mjs "/tmp/synth/${M:-qwen3-0.6b}" "$rows" 12 > "$AB/profile-$tag.txt" 2>> "$AB/err.log"
  echo "== $tag ($kernel, $rows rows)"
  grep -E "Duration|Registers Per Thread|Occupancy|Issue Slots Busy|Warp Cycles Per Issued|Memory Throughput|L2 Hit Rate|Stall|Block Limit" \
    "$AB/profile-$tag.txt" | head -40
}

ab_profile_prefill() {
  local tag=$1 name=$2 kernel=$3 model=$4 skip=${5:-36}
  shift 5 2> /dev/null || shift $#
  NERVA_CUDA_ADDON="/tmp/$name.node" timeout 300 ncu --set full -k "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
    $AB_NODE .device/dist/bench_cli.mjs prefill --model "$model" --backend cuda --repeats 1 "$@" > "$AB/profile-$tag.txt" 2>> "$AB/err.log"
  echo "== $tag ($kernel)"
  grep -E "Duration|Registers Per Thread|Occupancy|Issue Slots Busy|Warp Cycles Per Issued|Memory Throughput|L2 Hit Rate|Stall|Block Limit|Tensor" \
    "$AB/profile-$tag.txt" | head -50
}

ab_check() {
  NERVA_CUDA_ADDON="/tmp/$1.node" OUT=$AB timeout 150 $AB_NODE ${DIST:-.device/dist}/conformance.mjs > "$AB/conf.log" 2>&1
  echo "conformance rc $?"
  tail -4 "$AB/conf.log"
  NERVA_CUDA_ADDON="/tmp/$1.node" OUT=$AB timeout 300 $AB_NODE ${DIST:-.device/dist}/batch_invariance.mjs > "$AB/inv.log" 2>&1
  echo "invariance rc $?, $(grep -c '\] ok' "$AB/inv.log") ok"
  sed -n '/batchInvariant: true/,/default backend/p' "$AB/inv.log" | grep -i fail | head -5
}

ab_trace() {
  local tag=$1 addon=$2
  shift 2
  env OUT="$AB/x" NERVA_CUDA_ADDON="$addon" NERVA_DEVICE_TRACE="$AB/trace.bin" "$@" timeout 120 \
    $AB_NODE ${BENCH:-.device/dist/bench.mjs} "/tmp/synth/${M:-qwen3-0.6b}" "${PL:-128}" "${GEN:-256}" > /dev/null 2>> "$AB/err.log"
  python3 tools/gpu/trace_timeline.py "$AB/trace.bin" --tokens 6 > "$AB/timeline-$tag.txt" 2>&1
  if [ -n "${DETAIL:-}" ]; then
    python3 tools/gpu/trace_timeline.py "$AB/trace.bin" --tokens 6 --detail "$DETAIL" > "$AB/detail-$tag.txt" 2>&1
  fi
  if [ -n "${LAYER:-}" ]; then
    python3 tools/gpu/trace_timeline.py "$AB/trace.bin" --layer "$LAYER" > "$AB/layer-$tag.txt" 2>&1
  fi
  if [ "${KEEP_TRACE:-0}" = 1 ]; then xz -T0 -c "$AB/trace.bin" > "$AB/trace-$tag.bin.xz"; fi
  rm -f "$AB/trace.bin"
  echo "== $tag"
  grep -A10 "per kernel" "$AB/timeline-$tag.txt"
}

ab_marks() {
  local addon=$1 kernel=$2 marks=$3 mk
  shift 3
  for mk in $marks; do
    DETAIL=$kernel ab_trace "mark$mk" "$addon" NERVA_SA_MARK=$mk "$@" > /dev/null
    python3 - "$AB/detail-mark$mk.txt" "$mk" <<'PY'
import re, sys, statistics as st
rel, mk, ex = [], [], []
for l in open(sys.argv[1]):
    if l.startswith('  grid'):
        rel.append(float(re.search(r'release p50 ([\d.]+)', l).group(1)))
        ex.append(float(re.search(r'exit p10 [\d.]+ p50 ([\d.]+)', l).group(1)))
        m = re.search(r'mark p50 ([\d.]+)', l)
        if m: mk.append(float(m.group(1)))
if rel:
    print('mark', sys.argv[2], 'launches', len(rel), 'release p50 %.2f' % st.median(rel),
          'mark p50 %.2f' % (st.median(mk) if mk else -1), 'exit p50 %.2f' % st.median(ex))
else:
    print('mark', sys.argv[2], 'no launches of the kernel in the trace')
PY
  done
}

ab_pack() {
  (cd "$OUT" && tar czf "$1.tgz" a && rm -rf a)
}
