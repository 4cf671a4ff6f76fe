#!/usr/bin/env bash
# The one script for the GPU machine (see /work/shared/device/README.md and tools/gpu/README.md).
# Prepare here with tools/gpu/prepare.sh, then run with carry [".device"]:
#   bash tools/gpu/run.sh [phases]     phases: comma list of build,vitest,conformance,checks,parity,paged,synth,oracle,bench,profile,offload,
#                                      tiered (tiered KV vs all hot on the fixtures and each size; NERVA_TIERED_LINK_SHARES=0,0.5,1 per link share), longctx (nerva-bench long-context
#                                      on each size; NERVA_LONGCTX_CONTEXT, default "1024 4096", NERVA_LONGCTX_RATIOS, default 2,4;
#                                      NERVA_LONGCTX_LINK_SHARES, e.g. 0,0.3,0.5: kvWarmLinkShare values per ratio),
#                                      hostattn (host attention GB/s on the 8B shape vs the host's DRAM read rate, no Node needed)
#   NERVA_SIZES="qwen3-0.6b qwen3-8b"   synthetic checkpoints (from .device/configs) for synth/oracle/bench/profile/offload
#   offload (not in the default list; meant for a checkpoint larger than the budget, e.g.
#   NERVA_SIZES=qwen3-8b bash tools/gpu/run.sh build,synth,offload): accelerate's device_map offload
#   and `nerva-bench offload` under the same budget (NERVA_OFFLOAD_BUDGET, default 4GiB), 16 prompt
#   ids, 8 new tokens for accelerate and NERVA_OFFLOAD_TOKENS (default 32) for NERVA -> both JSON
#   lines in $OUT/offload.jsonl
#   nccl (not in the default list; bash tools/gpu/run.sh build,nccl): NCCL load, a one-rank
#   communicator, and with 2+ GPUs a checked GPU 0 -> GPU 1 send/recv (tools/gpu/nccl_check.ts) -> $OUT/nccl.json
#   hostmlp (not in the default list; bash tools/gpu/run.sh hostmlp, needs no Node and no addon):
#   builds tools/gpu/host_mlp_bench.cc with packages/cuda-backend/native/host/ (host_mlp.cc, the pool, the ISA layer)
#   (g++, cudart as build-addon.sh links it) and runs it: the host MLP's weight GB/s for the Qwen3-8B
#   MLP shape, alone and during a 1 GiB H2D copy loop -> one JSON object per line in $OUT/hostmlp.json
#   pipeline (not in the default list; bash tools/gpu/run.sh build,synth,pipeline): the engine's stage
#   pipeline on ONE GPU (--allow-single-device-stages, device-copy links) against one stage, on every
#   fixture model and each NERVA_SIZES checkpoint: same greedy tokens (batch 1 and 4 concurrent),
#   logits bit for bit, decode tok/s of both and the overhead per token (tools/gpu/pipeline.ts;
#   NERVA_PIPELINE_STAGES=2,3 for more stage counts) -> $OUT/pipeline-fixtures.json, $OUT/pipeline-<size>.json
#   pipeline2 (not in the default list; 2+ GPUs): the same with a stage per GPU (stageDevices 0,1: one
#   CudaBackend per GPU, NCCL links, micro-batches) -> $OUT/pipeline-multi-fixtures.json, $OUT/pipeline-multi-<size>.json;
#   NERVA_PIPELINE_BUDGET=10GiB: the stages under that VRAM budget each (resident), and one GPU under it (memory OS), with
#   per-stage memory and the ledger's stage and handoff times (e.g. NERVA_SIZES=qwen3-8b NERVA_PIPELINE_BUDGET=10GiB ... build,synth,pipeline2)
#   throughput (not in the default list; bash tools/gpu/run.sh build,synth,throughput): nano-vllm's
#   throughput benchmark on each NERVA_SIZES checkpoint (default qwen3-0.6b): `nerva-bench throughput
#   --workload-only` writes the workload (256 requests, prompt and output lengths 100..1024, seed 0;
#   NERVA_THROUGHPUT_WORKLOAD_ARGS overrides, e.g. "--requests 64"), tools/gpu/torch_throughput.py runs
#   it batched in PyTorch (bf16, static padded KV, CUDA graphs, torch.compile; NERVA_TORCH_ARGS adds
#   flags, NERVA_TORCH_TIMEOUT s limit, default 300; --check-tokens NERVA_TORCH_CHECK_TOKENS, default 2),
#   then `nerva-bench throughput --workload FILE --baseline LINE` once per NERVA_THROUGHPUT_VARIANTS
#   entry (';'-separated flag sets, default "--batch-invariant --kv-cache-dtype bf16 --matmul-precision bf16
#   --max-num-batched-tokens 8192;--kv-cache-dtype bf16;--kv-cache-dtype bf16 --matmul-precision bf16;default"; --verify
#   NERVA_THROUGHPUT_VERIFY, default 8; NERVA_THROUGHPUT_BACKEND, default cuda) -> the baseline's line, then NERVA's lines (each with
#   speedup_vs_torch) appended to $OUT/throughput.jsonl. ~4 minutes for the 0.6B on an H100.
#   prefill (not in the default list; bash tools/gpu/run.sh build,prefill): `nerva-bench prefill` on each
#   NERVA_SIZES checkpoint (default qwen3-8b here, synthesized when missing), at each prompt length of
#   NERVA_PREFILL_LEN (default "4096"), once per matmul precision of NERVA_PREFILL_PRECISIONS (default
#   "exact bf16"), NERVA_PREFILL_REPEATS timed prefills (default 3; NERVA_PREFILL_ARGS adds flags, e.g.
#   "--chunk 2048"): tokens/s and MFU against the bf16 GEMM rate of op matmul measured in the same process
#   on a backend of the same precision -> one JSON line per run appended to $OUT/prefill.jsonl.
#   fork (not in the default list; NERVA_SIZES="qwen3-0.6b qwen3-8b" bash tools/gpu/run.sh build,synth,fork): nerva-bench fork
#   on each checkpoint, NERVA_FORK_N (32) sampled forks of a NERVA_FORK_PROMPT (512)-token prompt, NERVA_FORK_TOKENS (128)
#   each, against the same requests one by one, once per KV dtype in NERVA_FORK_KV ("auto bf16") and per environment in NERVA_FORK_ENVS
#   (';'-separated VAR=value sets) -> $OUT/fork.jsonl; NERVA_FORK_ARGS adds flags (e.g. "--batch-invariant --profile";
#   "--no-sequential": the forks alone, the fork step and tokens_sha256 in seconds, to compare builds)
#   ltalgos (not in the default list; bash tools/gpu/run.sh ltalgos): tools/gpu/lt_candidates.cc, built against cublasLt.h: per
#   decode weight shape, the cuBLASLt algorithms that could pin it, their ms at 2/64/256 rows and row invariance -> $OUT/lt_candidates.jsonl
#   ltprefill (not in the default list; bash tools/gpu/run.sh ltprefill): tools/gpu/lt_prefill.cu, built against cuBLAS: per
#   prefill weight shape at 4096 rows, cublasGemmEx's ms against each cuBLASLt heuristic offer's, and whether its bits are the same -> $OUT/lt_prefill.jsonl
#   invariance (not in the default list; bash tools/gpu/run.sh build,invariance): tools/gpu/batch_invariance.ts, the decode
#   ops (fused_matmul shapes, decoder_layers with f32 and bf16 KV) at 1 row and at 2..256 rows, every row bit for bit,
#   on a batchInvariant backend (must hold) and on the default one (informational), once with the default kernels
#   (cuBLASLt with pinned algorithms, GQA attention), the same under matmul precision bf16 (NERVA_MATMUL=bf16: one
#   term) -> $OUT/batch_invariance-{lt-gqa,lt-gqa-bf16}.json
#   quant (not in the default list; bash tools/gpu/run.sh build,synth,bench,quant): per NERVA_SIZES, synthetic GGUF files at each of
#   NERVA_QUANT_TYPES (default "Q4_K_M Q8_0"; llama.cpp's type rules, random blocks) decoded by bench.mjs -> $OUT/bench.jsonl,
#   with the file's bytes and the fraction of the quantized-bytes roofline; then `nerva-bench prefill` at NERVA_QUANT_PREFILL tokens
#   (default 1024, 0: none) on each file and on the bf16 checkpoint, once per NERVA_PREFILL_PRECISIONS -> $OUT/prefill.jsonl; where /tmp/peer/llama-bench
#   exists (a llama.cpp build for sm_90 made outside the project, never committed: a benchmark peer), `nerva-bench
#   llama-cpp --llama-bench` decodes each file with both engines (llama.cpp: -p 0 -n 128 -ngl 99) -> $OUT/llamacpp.jsonl
#   (one line a file, with nerva_over_llama_cpp). The peer (~22 MB xz-compressed) and .device together pass the
#   64 MiB a call carries with the tree, so it travels first: put it at .device-peer/llama-bench.xz (add
#   '/.device-peer/' to .git/info/exclude), run `bash tools/gpu/run.sh peer` with carry [".device-peer"] (it only
#   unpacks it to /tmp/peer, which survives while the machine stays warm), then the quant phases with carry [".device"].
#   qgemv (not in the default list): the quantized GEMV (Q4_K, Q6_K, Q8_0, Q4_0) on the Qwen3-8B decode projections at 1
#   and 4 rows, weight GB/s over the copy bandwidth measured in the same process (tools/gpu/qgemv.ts) -> $OUT/qgemv.jsonl
#   contexts (not in the default list): one model and two contexts on the GPU (tools/gpu/contexts.ts): weights
#   allocated once, each context's tokens equal a lone engine's -> $OUT/contexts.json
#   gguf (not in the default list): every fixture model and the Shakespeare model converted to GGUF at F32, F16, Q8_0,
#   Q4_0, Q4_K, Q6_K and Q4_K_M, run on CUDA and on CPU over the same file (tools/gpu/gguf_check.ts): greedy tokens
#   (equal at F32/F16), logits within the CUDA f32 relTol, the dtypes the CUDA engine stored -> $OUT/gguf_check.json
#   embed (not in the default list; bash tools/gpu/run.sh build,embed): Engine.embed on CUDA against the CPU
#   reference on every fixture model and the embedded one (tools/gpu/embeddings.ts): last and mean pooling,
#   CUDA vs CPU and CUDA batched vs alone within 1e-4 of the largest component, no KV held -> $OUT/embeddings.json
#   grammar (not in the default list; NERVA_SIZES=qwen3-0.6b bash tools/gpu/run.sh build,synth,grammar): constrained decoding's
#   cost per token (tools/gpu/grammar_cost.ts) on each size's synthetic checkpoint with Qwen3's tokenizer beside it (from
#   .device/tokenizers, tools/gpu/prepare.sh; in /tmp/synth/<size>-tokenizer, hard links to the weights, so the other phases
#   still measure a folder without one): at batch 1 and 32, free requests, every request held to a JSON schema, and at 32
#   one held among 31 free, with graphs and eagerly; decode ms per token, tok/s, ratios to free, the ledger's grammarMs
#   (waits for masks), whether graphs ran, the grammar worker threads; NERVA_GRAMMAR_ARGS adds flags (e.g. "--repeats 5
#   --new-tokens 128", "--graphs on", "--grammar-threads 15", "--backend cpu" for a dry run) -> $OUT/grammar_cost.jsonl
#   serve (not in the default list; bash tools/gpu/run.sh build,synth,serve): the OpenAI server through `nerva-bench serve`
#   (startServer in the bundle's process as `nerva serve` runs it, the engine in its worker thread from .device/dist/worker-entry.js,
#   the streaming clients in a thread of their own) on the embedded model and on each NERVA_SIZES checkpoint (default qwen3-0.6b;
#   no tokenizer: the prompts are token ids), NERVA_SERVE_PROMPT (128) prompt tokens, NERVA_SERVE_TOKENS (256) tokens a request:
#   1 stream (4 requests one after the other) with --vs-decode, so the engine's own decode probe on the same model, prompt and token
#   count runs in the same call (its line first; the serve line's stream_over_decode is the served stream's decode rate over it),
#   then NERVA_SERVE_STREAMS (default 64) streams, 4 requests each in closed loop (itl_ms_p99 over the engine's mean step interval
#   in the same window: itl_p99_over_step) -> $OUT/serve.jsonl; NERVA_SERVE_ARGS adds flags; NERVA_SERVE_BACKEND=cpu dry-runs it here
#   soak (not in the default list; NERVA_SIZES=qwen3-0.6b bash tools/gpu/run.sh build,synth,soak,soakwait): tools/soak/soak.mjs
#   against `nerva serve --backend cuda` on the size's synthetic checkpoint with Qwen3's tokenizer (a padded vocabulary),
#   both left running in sessions of their own (NERVA_SOAK_MINUTES, default 30; NERVA_SOAK_CONCURRENCY, default 32);
#   soakwait (also alone, in later calls: bash tools/gpu/run.sh soakwait) waits up to NERVA_SOAK_WAIT s (560) for the report,
#   NERVA_SOAK_STOP_AFTER s ends the load early -> $OUT/soak.json, $OUT/soak-server.log
#   vitest (in the default list; needs the addon, so `build` in the same call): every test file of
#   @nerva/cuda-backend, the GPU-only ones among them, under vitest from .device/vitest.tar.xz
#   (tools/gpu/pack_vitest.mjs) with NERVA_GPU_TESTS=1 (a GPU-only file without the addon or a GPU
#   fails, naming why) and a stub libnccl.so.2 lacking ncclSend first on LD_LIBRARY_PATH (the NCCL
#   glue's stub checks must not reach the machine's real NCCL) -> $OUT/vitest.json: passed, failed,
#   skipped (must be 0), each failure's message
# Results land in $OUT as JSON (at most 8 files come back).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/nerva-out}
mkdir -p "$OUT"
phases=${1:-build,vitest,conformance,checks,parity,batch,cli,synth,oracle,bench,profile}
has() { [[ ",$phases," == *",$1,"* ]]; }
log="$OUT/run.log"
: > "$log"
say() { echo "[run.sh] $*" | tee -a "$log"; }
status=0

# The llama.cpp peer, when carried (see the quant phase), unpacked to /tmp/peer: it outlives this call
# while the machine stays warm. Phase `peer` does only that.
if [ -f .device-peer/llama-bench.xz ] && [ ! -x /tmp/peer/llama-bench ]; then
  mkdir -p /tmp/peer && xz -dc .device-peer/llama-bench.xz > /tmp/peer/llama-bench && chmod +x /tmp/peer/llama-bench
fi
if [ "$phases" = peer ]; then say "llama.cpp peer: $(ls -l /tmp/peer/llama-bench 2>&1)"; exit 0; fi

xz -dc .device/node.xz > /tmp/node && chmod +x /tmp/node
# tools/gpu/prepare.sh packs the bundles (.device/dist.tar.xz); a .device/dist folder is used as it is.
[ -d .device/dist ] || [ ! -f .device/dist.tar.xz ] || xz -dc .device/dist.tar.xz | tar -xf - -C .device
NODE=/tmp/node
say "node $($NODE --version); $(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader)"
export NERVA_CUDA_ADDON=/tmp/nerva-addon/nerva_cuda.node
export OUT

# The sources the addon is built from: a prebuilt .device/addon (tools/gpu/prepare.sh --addon, same
# nvcc and archs as build-addon.sh) is used instead of building when it came from these sources.
addon_sha() { find packages/cuda-backend/native -type f | LC_ALL=C sort | xargs cat tools/gpu/build-addon.sh | sha256sum | cut -c1-16; }
# The prebuilt addon travels xz-compressed (11 MiB as built, ~1.5 MiB packed: carry's 64 MiB).
if has build && [ -f .device/addon/nerva_cuda.node.xz ] && [ "$(cat .device/addon/sources.sha 2>/dev/null)" = "$(addon_sha)" ]; then
  mkdir -p /tmp/nerva-addon && xz -dc .device/addon/nerva_cuda.node.xz > /tmp/nerva-addon/nerva_cuda.node && say "addon prebuilt here (sources $(addon_sha))"
elif has build; then
  t0=$(date +%s)
  if bash tools/gpu/build-addon.sh /tmp/nerva-addon >>"$log" 2>&1; then say "addon built in $(( $(date +%s) - t0 )) s"; else say "addon build FAILED"; tail -30 "$log"; exit 1; fi
fi

# The hand-declared cuBLASLt ABI (batch-invariant GEMMs) against this machine's cublasLt.h.
if has build; then
  cuda=${CUDA_HOME:-/usr/local/cuda}
  if [ ! -f "$cuda/include/cublasLt.h" ]; then say "no $cuda/include/cublasLt.h: cuBLASLt ABI unchecked"
  elif g++ -fsyntax-only -std=c++17 -I"$cuda/include" tools/gpu/lt_abi_check.cc >>"$log" 2>&1; then say "cuBLASLt ABI matches cublasLt.h"
  else say "cuBLASLt ABI check FAILED"; tail -20 "$log"; exit 1; fi
fi

# The quant phase's prefill of MODEL at NERVA_QUANT_PREFILL tokens (default 1024; 0: none), once per
# matmul precision of NERVA_PREFILL_PRECISIONS (default "exact bf16") -> $OUT/prefill.jsonl.
quant_prefill() { # label model
  local prec
  [ "${NERVA_QUANT_PREFILL:-1024}" = 0 ] && return 0
  for prec in ${NERVA_PREFILL_PRECISIONS:-exact bf16}; do
    $NODE --enable-source-maps .device/dist/bench_cli.mjs prefill --model "$2" --backend cuda --prompt-len "${NERVA_QUANT_PREFILL:-1024}" \
      --matmul-precision "$prec" --repeats 3 2>>"$log" | tail -1 | tee -a "$log" >> "$OUT/prefill.jsonl" || { say "prefill $1 $prec FAILED"; status=1; }
  done
}
runjs() { # name bundle args...
  local name=$1; shift
  local f=.device/dist/$1; shift
  if [ ! -f "$f" ]; then say "$name: $f missing, skipped"; return 0; fi
  t0=$(date +%s)
  if $NODE --enable-source-maps "$f" "$@" 2>&1 | tee -a "$log"; then say "$name ok ($(( $(date +%s) - t0 )) s)"; else say "$name FAILED"; status=1; fi
}

# The host modules' standalone builds: the pool, the ISA layer and the knob table beside each.
host_inc=(-Ipackages/cuda-backend/native/host -Ipackages/cuda-backend/native/common)
host_base=(packages/cuda-backend/native/host/host_pool.cc packages/cuda-backend/native/host/isa.cc packages/cuda-backend/native/common/knobs.cc)

if has hostmlp; then
  cuda=${CUDA_HOME:-/usr/local/cuda}
  t0=$(date +%s)
  if g++ -O2 -std=c++17 -pthread "${host_inc[@]}" -I"$cuda/include" tools/gpu/host_mlp_bench.cc packages/cuda-backend/native/host/host_mlp.cc "${host_base[@]}" \
      -o /tmp/host_mlp_bench -L"$cuda/lib64" -L"$cuda/targets/x86_64-linux/lib" -lcudart_static -ldl -lrt -lpthread >>"$log" 2>&1; then
    if /tmp/host_mlp_bench > "$OUT/hostmlp.json" 2>>"$log"; then say "hostmlp ok ($(( $(date +%s) - t0 )) s): $(wc -l < "$OUT/hostmlp.json") JSON lines"; else say "hostmlp FAILED"; tail -3 "$OUT/hostmlp.json"; status=1; fi
  else
    say "hostmlp build FAILED"; tail -20 "$log"; status=1
  fi
fi

# ltalgos: the cuBLASLt algorithms that could pin each decode matmul (tools/gpu/lt_candidates.cc):
# per candidate, runs at every row count, ms at n = 2/64/256 and rows bit for bit across n.
if has ltalgos; then
  cuda=${CUDA_HOME:-/usr/local/cuda}
  t0=$(date +%s)
  if g++ -O2 -std=c++17 -I"$cuda/include" tools/gpu/lt_candidates.cc -o /tmp/lt_candidates -L"$cuda/lib64" \
      -L"$cuda/targets/x86_64-linux/lib" -lcublasLt -lcudart >>"$log" 2>&1 && /tmp/lt_candidates > "$OUT/lt_candidates.jsonl" 2>>"$log"; then
    say "ltalgos ok ($(( $(date +%s) - t0 )) s): $(wc -l < "$OUT/lt_candidates.jsonl") candidates"
  else
    say "ltalgos FAILED"; tail -20 "$log"; status=1
  fi
fi

# ltprefill: cublasGemmEx against cuBLASLt's offers for each prompt matmul (tools/gpu/lt_prefill.cu).
if has ltprefill; then
  cuda=${CUDA_HOME:-/usr/local/cuda}
  t0=$(date +%s)
  if nvcc -O2 -std=c++17 -arch=sm_90 tools/gpu/lt_prefill.cu -o /tmp/lt_prefill -L"$cuda/lib64" -L"$cuda/targets/x86_64-linux/lib" \
      -lcublasLt -lcublas >>"$log" 2>&1 && /tmp/lt_prefill > "$OUT/lt_prefill.jsonl" 2>>"$log"; then
    say "ltprefill ok ($(( $(date +%s) - t0 )) s): $(wc -l < "$OUT/lt_prefill.jsonl") lines"
  else
    say "ltprefill FAILED"; tail -20 "$log"; status=1
  fi
fi

if has hostattn; then
  t0=$(date +%s)
  if g++ -O2 -std=c++17 -pthread -DNERVA_HOST_ATTN_NO_CUDA "${host_inc[@]}" tools/gpu/host_attention_bench.cc \
      packages/cuda-backend/native/host/host_attention.cc "${host_base[@]}" -o /tmp/host_attention_bench >>"$log" 2>&1 && /tmp/host_attention_bench > "$OUT/hostattn.json" 2>>"$log"; then
    say "hostattn ok ($(( $(date +%s) - t0 )) s)"; cat "$OUT/hostattn.json" | tee -a "$log"
  else
    say "hostattn FAILED"; status=1
  fi
fi

if has vitest; then
  t0=$(date +%s)
  # node_modules is only here on a dev machine (a dry run); on the GPU machine vitest travels packed.
  [ -e node_modules/vitest ] || { mkdir -p node_modules && xz -dc .device/vitest.tar.xz | tar -xf -; }
  stub=/tmp/nerva-nccl-loader && mkdir -p "$stub"
  cc -shared -fPIC -DSTUB_NO_SEND -o "$stub/libnccl.so.2" packages/cuda-backend/test/fixtures/nccl_stub.c >>"$log" 2>&1 || say "vitest: no stub libnccl.so.2 (cc failed)"
  rm -f /tmp/vitest-raw.json
  NERVA_GPU_TESTS=1 LD_LIBRARY_PATH="$stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" $NODE node_modules/vitest/vitest.mjs run --config tools/gpu/vitest.device.config.ts \
    --reporter=default --reporter=json --outputFile.json=/tmp/vitest-raw.json >>"$log" 2>&1
  if $NODE .device/dist/vitest_report.mjs /tmp/vitest-raw.json "$OUT/vitest.json" 2>&1 | tee -a "$log"; then say "vitest ok ($(( $(date +%s) - t0 )) s)"; else say "vitest FAILED ($(( $(date +%s) - t0 )) s)"; status=1; fi
fi
has conformance && runjs conformance conformance.mjs
# Twice: the default batch-invariant kernels (cuBLASLt pinned, GQA attention), then matmul
# precision bf16 (one term).
if has invariance; then
  runjs invariance batch_invariance.mjs && cp "$OUT/batch_invariance.json" "$OUT/batch_invariance-lt-gqa.json"
  NERVA_MATMUL=bf16 runjs "invariance (NERVA_MATMUL=bf16)" batch_invariance.mjs && cp "$OUT/batch_invariance.json" "$OUT/batch_invariance-lt-gqa-bf16.json"
  rm -f "$OUT/batch_invariance.json"
fi
has checks && runjs checks checks.mjs
has nccl && NCCL_DEBUG=${NCCL_DEBUG:-WARN} runjs nccl nccl_check.mjs
has parity && runjs parity parity.mjs fixtures .device/fixtures/models
has batch && runjs batch parity.mjs batch models/tiny-shakespeare-qwen3
has paged && runjs paged parity.mjs paged $(ls -d .device/fixtures/models/*/) models/tiny-shakespeare-qwen3 && cp "$OUT/paged.json" "$OUT/paged-fixtures.json"
has pipeline && runjs pipeline pipeline.mjs single $(ls -d .device/fixtures/models/*/) models/tiny-shakespeare-qwen3 && cp "$OUT/pipeline.json" "$OUT/pipeline-fixtures.json"
has pipeline2 && NCCL_DEBUG=${NCCL_DEBUG:-WARN} runjs pipeline2 pipeline.mjs multi $(ls -d .device/fixtures/models/*/) models/tiny-shakespeare-qwen3 && cp "$OUT/pipeline-multi.json" "$OUT/pipeline-multi-fixtures.json"
has tiered && runjs tiered parity.mjs tiered $(ls -d .device/fixtures/models/*/) models/tiny-shakespeare-qwen3 && cp "$OUT/tiered.json" "$OUT/tiered-fixtures.json"
has qgemv && runjs qgemv qgemv.mjs ${QGEMV_ARGS:-}
has contexts && runjs contexts contexts.mjs models/tiny-shakespeare-qwen3 $(ls -d .device/fixtures/models/*/ | head -2)
has gguf && runjs gguf gguf_check.mjs $(ls -d .device/fixtures/models/*/) models/tiny-shakespeare-qwen3
has embed && runjs embed embeddings.mjs $(ls -d .device/fixtures/models/*/) models/tiny-shakespeare-qwen3
has cli && { for m in .device/fixtures/models/*/; do $NODE .device/dist/cli.mjs run --model "$m" --backend cuda --prompt-ids 1,2,3 --max-tokens 8 --temperature 0 --json 2>&1 | tail -1; done > "$OUT/cli-runs.jsonl"; say "cli runs: $(grep -c '"backend":"cuda"' "$OUT/cli-runs.jsonl") cuda json lines"; }
for size in ${NERVA_SIZES:-qwen3-0.6b}; do
  dir=/tmp/synth/$size
  # A warm machine keeps /tmp between calls: reuse a checkpoint written by an earlier call.
  if has synth && [ ! -f "$dir/model.safetensors.index.json" ]; then runjs "synth $size" parity.mjs synth ".device/configs/$size.json" "$dir"; fi
  if has oracle; then
    runjs "force $size" parity.mjs force "$dir" 32
    if python3 tools/gpu/oracle_parity.py "$dir" "$OUT/oracle-$size.json" 2>&1 | tail -3 | tee -a "$log"; then say "oracle $size done"; else say "oracle $size FAILED"; status=1; fi
  fi
  has paged && runjs "paged $size" parity.mjs paged "$dir" && cp "$OUT/paged.json" "$OUT/paged-$size.json"
  has pipeline && runjs "pipeline $size" pipeline.mjs single "$dir" && cp "$OUT/pipeline.json" "$OUT/pipeline-$size.json"
  has pipeline2 && NCCL_DEBUG=${NCCL_DEBUG:-WARN} runjs "pipeline2 $size" pipeline.mjs multi "$dir" && cp "$OUT/pipeline-multi.json" "$OUT/pipeline-multi-$size.json"
  has tiered && NERVA_TIERED_PROMPT=600 runjs "tiered $size" parity.mjs tiered "$dir" && cp "$OUT/tiered.json" "$OUT/tiered-$size.json"
  # The limit of a tiered mix uses the DRAM read rate the hostattn phase measured (when it ran).
  if has longctx; then export NERVA_HOST_READ_GBPS=$(grep -o '"read_gbps":[0-9.]*' "$OUT/hostattn.json" 2>/dev/null | cut -d: -f2); for ctx in ${NERVA_LONGCTX_CONTEXT:-1024 4096}; do runjs "long-context $size $ctx" long_context.mjs "$dir" $ctx ${NERVA_LONGCTX_TOKENS:-32} ${NERVA_LONGCTX_RATIOS:-2,4}; done; fi
  has bench && runjs "bench $size" bench.mjs "$dir" 128 256
  if has quant; then
    # Synthetic GGUF files at llama.cpp's type rules (random blocks), decoded like the bf16 checkpoint.
    for t in ${NERVA_QUANT_TYPES:-Q4_K_M Q8_0}; do
      f=/tmp/synth/$size-$t.gguf; mkdir -p /tmp/synth
      [ -f "$f" ] || runjs "synth $size $t" cli.mjs synth --config ".device/configs/$size.json" --out "$f" --gguf "$t"
      runjs "bench $size $t" bench.mjs "$f" 128 256
      # llama.cpp's decode on the same file where its sm_90 build is here (see the header): nerva-bench's
      # llama-cpp probe runs both (128 tokens at batch 1, llama.cpp with every layer on the GPU).
      if [ -x /tmp/peer/llama-bench ]; then
        if LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64 $NODE --enable-source-maps .device/dist/bench_cli.mjs llama-cpp \
            --model "$f" --backend cuda --llama-bench /tmp/peer/llama-bench --tokens 128 --prompt-len 128 2>>"$log" | tail -1 | tee -a "$log" >> "$OUT/llamacpp.jsonl"; then
          say "llama.cpp $size $t: $(tail -1 "$OUT/llamacpp.jsonl" | grep -o '"nerva_over_llama_cpp":[0-9.]*\|"reason":"[^"]*"')"
        else say "llama.cpp $size $t FAILED"; status=1; fi
      fi
      # Prefill over the quantized weights (the bf16 checkpoint's below).
      quant_prefill "$size $t" "$f"
      # Under a VRAM budget (NERVA_QUANT_BUDGET, e.g. 4GiB): the same file through the memory OS, and the bf16 checkpoint beside it.
      [ -n "${NERVA_QUANT_BUDGET:-}" ] && runjs "offload $size $t" offload.mjs "$f" "$NERVA_QUANT_BUDGET" 16 32
    done
    [ -n "${NERVA_QUANT_BUDGET:-}" ] && [ -d "$dir" ] && runjs "offload $size bf16" offload.mjs "$dir" "$NERVA_QUANT_BUDGET" 16 32
    quant_prefill "$size bf16" "$dir"
  fi
  has profile && runjs "profile $size" bench.mjs "$dir" 128 32 --profile
  if has grammar || has soak; then
    # A grammar (and the soak's text prompts) need the vocabulary: the synthetic weights (hard
    # links, same folder rules as the original) with Qwen3's tokenizer (151,669 ids against the
    # config's 151,936 rows, as Qwen ships) in a folder of their own.
    gdir=/tmp/synth/$size-tokenizer
    tz=.device/tokenizers/qwen3/tokenizer.json.xz
    if [ ! -f "$tz" ]; then say "grammar/soak $size: $tz missing (run tools/gpu/prepare.sh)"; status=1
    else
      rm -rf "$gdir" && mkdir -p "$gdir"
      ln "$dir"/* "$gdir"/ 2>/dev/null || cp "$dir"/* "$gdir"/
      xz -dc "$tz" > "$gdir/tokenizer.json" && cp .device/tokenizers/qwen3/tokenizer_config.json "$gdir"/
      has grammar && runjs "grammar $size" grammar_cost.mjs "$gdir" ${NERVA_GRAMMAR_ARGS:-}
      if has soak && [ ! -f /tmp/soak/server.pid ]; then
        # Server and load both in sessions of their own (setsid): a call lasts 10 minutes at most,
        # processes it leaves running are kept only then; soakwait collects the report.
        rm -rf /tmp/soak && mkdir -p /tmp/soak
        setsid $NODE --enable-source-maps .device/dist/cli.mjs serve --model "$gdir" --backend cuda --port 8123 --no-access-log \
          > /tmp/soak/server.log 2>&1 < /dev/null &
        echo $! > /tmp/soak/server.pid
        up() { $NODE -e "fetch('http://127.0.0.1:8123/health').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"; }
        for _ in $(seq 1 180); do up && break; sleep 1; done
        if up; then
          setsid $NODE tools/soak/soak.mjs --url http://127.0.0.1:8123 --pid "$(cat /tmp/soak/server.pid)" --minutes ${NERVA_SOAK_MINUTES:-30} \
            --concurrency ${NERVA_SOAK_CONCURRENCY:-32} --stop-file /tmp/soak/stop --out /tmp/soak/soak.json > /tmp/soak/soak.log 2>&1 < /dev/null &
          say "soak $size started: ${NERVA_SOAK_MINUTES:-30} min, pid $(cat /tmp/soak/server.pid)"
        else say "soak $size: server did not come up"; tail -20 /tmp/soak/server.log | tee -a "$log"; status=1; fi
      fi
    fi
  fi
  if has offload; then
    # The baseline first (it frees the GPU when it exits), then NERVA on the same files, same budget.
    budget=${NERVA_OFFLOAD_BUDGET:-4GiB}
    acc=/tmp/accelerate-$size.json
    rm -f "$acc"
    t0=$(date +%s)
    # accelerate offload of an 8B model decodes at ~0.4 tok/s: few tokens, and a time limit.
    if PYTHONUNBUFFERED=1 timeout 300 python3 tools/gpu/accelerate_offload.py "$dir" --budget "$budget" --prompt-len 16 --new-tokens 8 \
        --out "$acc" --offload-folder "/tmp/accelerate-offload-$size" 2>>"$log" | tee -a "$log"; then
      say "accelerate offload $size ok ($(( $(date +%s) - t0 )) s)"
    else
      say "accelerate offload $size FAILED (see run.log)"; status=1
    fi
    [ -f "$acc" ] || echo "{\"probe\":\"accelerate_offload\",\"model\":\"$dir\",\"tok_s\":null,\"error\":\"no result: timed out after 300 s or crashed (run.log)\"}" > "$acc"
    cat "$acc" >> "$OUT/offload.jsonl"
    NERVA_ACCELERATE_JSON="$acc" runjs "offload $size" offload.mjs "$dir" "$budget" 16 ${NERVA_OFFLOAD_TOKENS:-32}
  fi
  if has fork; then
    # 32 sampled forks of one 512-token prompt at once vs the same 32 requests one by one, per KV
    # dtype and per environment of NERVA_FORK_ENVS (';'-separated VAR=value sets, e.g.
    # ";NERVA_BI_GEMM=0 NERVA_BI_ATTN_GQA=0": each line then starts with "run_env").
    IFS=';' read -ra fenvs <<< "${NERVA_FORK_ENVS:-}"
    [ ${#fenvs[@]} -eq 0 ] && fenvs=("")
    for fe in "${fenvs[@]}"; do
      read -ra fenv <<< "$fe"
      for kv in ${NERVA_FORK_KV:-auto bf16}; do
        t0=$(date +%s)
        rm -f /tmp/nerva-fork.json
        if env "${fenv[@]}" $NODE --enable-source-maps .device/dist/bench_cli.mjs fork --model "$dir" --backend cuda --n ${NERVA_FORK_N:-32} --prompt-len ${NERVA_FORK_PROMPT:-512} \
            --new-tokens ${NERVA_FORK_TOKENS:-128} --kv-cache-dtype $kv ${NERVA_FORK_ARGS:-} > /tmp/nerva-fork.json 2>>"$log"; then
          say "fork $size kv=$kv [$fe] ok ($(( $(date +%s) - t0 )) s): $(tail -1 /tmp/nerva-fork.json | grep -o '"decode_speedup":[0-9.a-z]*\|"decode_speedup_vs_default":[0-9.]*\|"tokens_identical":[a-z]*\|"fork_step_device_ms_p50":[0-9.]*\|"tokens_sha256":"[0-9a-f]*"' | tr '\n' ' ')"
        else
          say "fork $size kv=$kv [$fe] FAILED"; status=1
          echo "{\"probe\":\"fork\",\"model\":\"$dir\",\"kv_cache_dtype\":\"$kv\",\"error\":\"exit status non-zero (run.log)\"}" > /tmp/nerva-fork.json
        fi
        tail -1 /tmp/nerva-fork.json | sed "s/^{/{\"run_env\":\"$fe\",/" >> "$OUT/fork.jsonl"
      done
    done
  fi
  if has throughput; then
    # nano-vllm's workload written once, the PyTorch baseline first (it frees the GPU when it
    # exits), then NERVA on the very same file; every line names the workload's sha256.
    wl=/tmp/throughput-workload-$size.json
    tb=/tmp/torch-throughput-$size.json
    rm -f "$wl" "$tb"
    if ! $NODE .device/dist/bench_cli.mjs throughput --model "$dir" --workload-out "$wl" --workload-only ${NERVA_THROUGHPUT_WORKLOAD_ARGS:-} 2>&1 | tee -a "$log" || [ ! -f "$wl" ]; then
      say "throughput $size: writing the workload FAILED"; status=1
    else
      t0=$(date +%s)
      if PYTHONUNBUFFERED=1 timeout ${NERVA_TORCH_TIMEOUT:-300} python3 tools/gpu/torch_throughput.py --model "$dir" --workload "$wl" --out "$tb" \
          --check-tokens ${NERVA_TORCH_CHECK_TOKENS:-2} ${NERVA_TORCH_ARGS:-} 2>>"$log" | tee -a "$log"; then
        say "torch throughput $size ok ($(( $(date +%s) - t0 )) s)"
      else
        say "torch throughput $size FAILED ($(( $(date +%s) - t0 )) s; see run.log)"; status=1
      fi
      [ -f "$tb" ] || echo "{\"probe\":\"torch_throughput\",\"model\":\"$dir\",\"output_tok_s\":null,\"error\":\"no result: timed out after ${NERVA_TORCH_TIMEOUT:-300} s or crashed (run.log)\"}" > "$tb"
      cat "$tb" >> "$OUT/throughput.jsonl"
      IFS=';' read -ra variants <<< "${NERVA_THROUGHPUT_VARIANTS:---batch-invariant --kv-cache-dtype bf16 --matmul-precision bf16 --max-num-batched-tokens 8192;--kv-cache-dtype bf16;--kv-cache-dtype bf16 --matmul-precision bf16;default}"
      for v in "${variants[@]}"; do
        # A variant's leading VAR=value words are its environment (e.g. "NERVA_BI_GEMM=0 --batch-invariant").
        args=()
        venv=()
        if [ "$v" != default ]; then
          read -ra words <<< "$v"
          for w in "${words[@]}"; do
            if [ ${#args[@]} -eq 0 ] && [[ "$w" =~ ^[A-Z_][A-Z0-9_]*= ]]; then venv+=("$w"); else args+=("$w"); fi
          done
        fi
        t0=$(date +%s)
        if env "${venv[@]}" $NODE --enable-source-maps .device/dist/bench_cli.mjs throughput --model "$dir" --backend ${NERVA_THROUGHPUT_BACKEND:-cuda} --workload "$wl" --baseline "$tb" \
            --verify ${NERVA_THROUGHPUT_VERIFY:-8} "${args[@]}" > /tmp/nerva-throughput.json 2>>"$log"; then
          say "nerva throughput $size [$v] ok ($(( $(date +%s) - t0 )) s)"
        else
          say "nerva throughput $size [$v] FAILED ($(( $(date +%s) - t0 )) s; see run.log)"; status=1
          tail -5 "$log"
          echo "{\"probe\":\"throughput\",\"model\":\"$dir\",\"variant\":\"$v\",\"output_tok_s\":null,\"error\":\"exit status non-zero (run.log)\"}" > /tmp/nerva-throughput.json
        fi
        tail -1 /tmp/nerva-throughput.json | sed "s/^{/{\"run_env\":\"${venv[*]}\",/" | tee -a "$log" >> "$OUT/throughput.jsonl"
      done
    fi
  fi
done
if has prefill; then
  # The issue's acceptance shape (Qwen3-8B, 4096 tokens) unless NERVA_SIZES says otherwise.
  for size in ${NERVA_SIZES:-qwen3-8b}; do
    dir=/tmp/synth/$size
    [ -f "$dir/model.safetensors.index.json" ] || runjs "synth $size" parity.mjs synth ".device/configs/$size.json" "$dir"
    for len in ${NERVA_PREFILL_LEN:-4096}; do
      for prec in ${NERVA_PREFILL_PRECISIONS:-exact bf16}; do
        t0=$(date +%s)
        if $NODE --enable-source-maps .device/dist/bench_cli.mjs prefill --model "$dir" --backend cuda --prompt-len "$len" --matmul-precision "$prec" \
            --repeats ${NERVA_PREFILL_REPEATS:-3} ${NERVA_PREFILL_ARGS:-} > /tmp/nerva-prefill.json 2>>"$log"; then
          say "prefill $size $len $prec ok ($(( $(date +%s) - t0 )) s)"
        else
          say "prefill $size $len $prec FAILED ($(( $(date +%s) - t0 )) s; see run.log)"; status=1
          tail -5 "$log"
          echo "{\"probe\":\"prefill\",\"model\":\"$dir\",\"prompt_len\":$len,\"matmul_precision\":\"$prec\",\"mfu\":null,\"error\":\"exit status non-zero (run.log)\"}" > /tmp/nerva-prefill.json
        fi
        tail -1 /tmp/nerva-prefill.json | tee -a "$log" >> "$OUT/prefill.jsonl"
      done
    done
  done
fi
if has serve; then
  for m in embedded ${NERVA_SIZES:-qwen3-0.6b}; do
    margs=()
    if [ "$m" != embedded ]; then
      dir=/tmp/synth/$m
      [ -f "$dir/model.safetensors.index.json" ] || runjs "synth $m" parity.mjs synth ".device/configs/$m.json" "$dir"
      margs=(--model "$dir")
    fi
    for streams in 1 ${NERVA_SERVE_STREAMS:-64}; do
      extra=(--requests $(( 4 * streams )))
      [ "$streams" = 1 ] && extra+=(--vs-decode)
      t0=$(date +%s)
      if $NODE --enable-source-maps .device/dist/bench_cli.mjs serve --backend ${NERVA_SERVE_BACKEND:-cuda} "${margs[@]}" --concurrency "$streams" --prompt-len ${NERVA_SERVE_PROMPT:-128} \
          --max-tokens ${NERVA_SERVE_TOKENS:-256} "${extra[@]}" ${NERVA_SERVE_ARGS:-} > /tmp/nerva-serve.json 2>>"$log"; then
        say "serve $m x$streams ok ($(( $(date +%s) - t0 )) s): $(grep -o '"stream_decode_tok_s":[0-9.]*\|"stream_over_decode":[0-9.]*\|"itl_p99_over_step":[0-9.]*\|"output_tokens_per_s":[0-9.]*' /tmp/nerva-serve.json | tr '\n' ' ')"
      else
        say "serve $m x$streams FAILED ($(( $(date +%s) - t0 )) s; see run.log)"; status=1
        tail -5 "$log"
        echo "{\"probe\":\"serve\",\"model\":\"$m\",\"concurrency\":$streams,\"error\":\"exit status non-zero (run.log)\"}" > /tmp/nerva-serve.json
      fi
      tee -a "$log" < /tmp/nerva-serve.json >> "$OUT/serve.jsonl"
    done
  done
fi
if has soakwait; then
  # Waits for the soak's report up to NERVA_SOAK_WAIT s (default 560: one call); with
  # NERVA_SOAK_STOP_AFTER s set, asks the load to end after that many seconds of this call.
  t0=$(date +%s)
  while [ ! -f /tmp/soak/soak.json ] && [ $(( $(date +%s) - t0 )) -lt ${NERVA_SOAK_WAIT:-560} ]; do
    [ -n "${NERVA_SOAK_STOP_AFTER:-}" ] && [ $(( $(date +%s) - t0 )) -ge "$NERVA_SOAK_STOP_AFTER" ] && touch /tmp/soak/stop
    sleep 5
  done
  if [ -f /tmp/soak/soak.json ]; then
    cp /tmp/soak/soak.json "$OUT/soak.json"; say "soak done: $(grep -o '"requests": [0-9]*\|"leaked_kv_blocks": [0-9]*\|"minutes_run": [0-9.]*' /tmp/soak/soak.json | tr '\n' ' ')"
    kill "$(cat /tmp/soak/server.pid)" 2>/dev/null
  else say "soak still running: $(tail -c 300 /tmp/soak/soak.log 2>/dev/null)"; fi
  tail -c 200000 /tmp/soak/server.log > "$OUT/soak-server.log" 2>/dev/null
fi
say "done, status $status"
exit $status
