import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { DTYPE_BYTES, type DeviceBackend } from '@nerva/core';
import { Engine, kvDtypeOf, selectBackend, type RequestOutcome, type EngineOptions } from '@nerva/engine';
import { meanStepProfile } from './fork.js';
import { loadModelConfig } from '@nerva/models';
import {
  canonicalWorkloadJson,
  makeWorkload,
  readWorkload,
  WORKLOAD_TOKEN_ID_CAP,
  WorkloadError,
  workloadSha256,
  workloadStats,
  type Workload,
} from '../workload.js';

export interface ThroughputProbeOptions
  extends Pick<
    EngineOptions,
    'numerics' | 'kvCacheDtype' | 'matmulPrecision' | 'batchInvariant' | 'maxNumSeqs' | 'maxNumBatchedTokens' | 'decodePromptBudget' | 'pipelineParallel' | 'pipelineMicroBatches' | 'tensorParallel' | 'allowSingleDeviceStages' | 'stageVramBudgets' | 'vramBudget'
  > {
  model: string;
  backend: 'cpu' | 'cuda' | 'auto';
  /** Workload parameters (nano-vllm's bench.py: 256 requests, lengths 100..1024, seed 0). */
  requests?: number;
  minLen?: number;
  maxInputLen?: number;
  maxOutputLen?: number;
  seed?: number;
  /** Run this workload file (as --workload-out writes it) instead of generating one. */
  workloadFile?: string;
  /** Write the workload here (canonical JSON; tools/gpu/torch_throughput.py reads it). */
  workloadOut?: string;
  /** Write the workload and stop: no engine, one JSON line describing it. */
  workloadOnly?: boolean;
  /** Rerun this many requests alone (evenly spread, the longest included) and compare tokens. */
  verify?: number;
  /** KV cache bytes (default: the whole workload at once, where the device has room). */
  kvCacheBytes?: number;
  /** A JSON line written by tools/gpu/torch_throughput.py on the same workload: the ratio to it. */
  baselineFile?: string;
  /** Write every request's batched tokens here: {"workload_sha256", "tokens": [[...], ...]} (torch_throughput.py --tokens-out writes the same shape). */
  tokensOut?: string;
  /**
   * After the timed run and the verification: the first maxNumSeqs requests again (a salt of
   * their own, short outputs) with every op timed by device events (eager); `profile` in the
   * line is the mean decode step with all of them running, ms by op class. Profiling runs the
   * layers op by op (op attention, not the captured decoder_layers step of the timed run), so the
   * split is that path's: on the H200 a 256-row 0.6B step took 41 ms so, against ~6 ms captured.
   */
  profile?: boolean;
  /**
   * Wraps the backend the probe selected before anything uses it (instrumentation, fault
   * injection); the probe disposes the wrapper when done.
   */
  wrapBackend?: (backend: DeviceBackend) => DeviceBackend;
}

/** Decode steps with every profiled request running, at least (see `profile`). */
const PROFILE_STEPS = 6;

const BLOCK = 16;
const r2 = (v: number): number => Math.round(v * 100) / 100;
const r3 = (v: number): number => Math.round(v * 1000) / 1000;

function percentile(xs: number[], p: number): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return r2(s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]);
}

/** Index of the first token where two sequences differ (the shorter length when one is a prefix of the other), or -1. */
export function firstDivergence(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
}

/**
 * Which requests `--verify K` reruns alone: K indices spread evenly over the workload (first and
 * last included), with the longest request (prompt + max_tokens) always among them.
 */
export function verifyIndices(w: Workload, k: number): number[] {
  const n = w.requests.length;
  if (k <= 0) return [];
  if (k >= n) return w.requests.map((_, i) => i);
  const picked = new Set<number>([workloadStats(w).longestIndex]);
  for (let j = 0; picked.size < k && j < k; j++) picked.add(k === 1 ? 0 : Math.round((j * (n - 1)) / (k - 1)));
  // Rounding may collide with the longest: fill from the start.
  for (let i = 0; picked.size < k; i++) picked.add(i);
  return [...picked].sort((a, b) => a - b);
}

/** What tools/gpu/torch_throughput.py writes (the fields compared here). */
interface BaselineLine {
  probe?: string;
  workload_sha256?: string;
  output_tok_s?: number | null;
  total_s?: number;
  output_tokens?: number;
  mode?: string;
  batch_size?: number;
  error?: string;
  check_tokens?: { index: number; tokens: number[] }[];
}

function readBaseline(path: string): BaselineLine {
  if (!existsSync(path)) throw new WorkloadError(`baseline ${path} does not exist`);
  const lines = readFileSync(path, 'utf8').split('\n').filter((l) => l.trim().length > 0);
  try {
    return JSON.parse(lines[lines.length - 1] ?? '') as BaselineLine;
  } catch {
    throw new WorkloadError(`baseline ${path}: the last line is not JSON`);
  }
}

/** Bytes of the checkpoint's safetensors files (an upper bound on the device bytes of the weights). */
function checkpointBytes(dir: string): number {
  let n = 0;
  for (const f of readdirSync(dir)) if (f.endsWith('.safetensors')) n += statSync(join(dir, f)).size;
  return n;
}

/**
 * nano-vllm's throughput benchmark: every request of the workload submitted at once to one
 * engine (continuous batching does the rest), timed from the first submit to the last completion;
 * output tokens per second. `verify` requests are then rerun alone and their greedy tokens
 * compared with the batched run's (they must be equal: batching does not change the tokens).
 */
export async function throughputProbe(o: ThroughputProbeOptions): Promise<Record<string, unknown>> {
  const spec = await loadModelConfig(o.model);
  const workload = o.workloadFile
    ? readWorkload(o.workloadFile)
    : makeWorkload({
        seed: o.seed ?? 0,
        requests: o.requests ?? 256,
        minLen: o.minLen ?? 100,
        maxInputLen: o.maxInputLen ?? 1024,
        maxOutputLen: o.maxOutputLen ?? 1024,
        tokenIdLimit: Math.min(WORKLOAD_TOKEN_ID_CAP, spec.vocabSize),
      });
  if (workload.token_id_limit > spec.vocabSize) {
    throw new WorkloadError(`workload token ids go up to ${workload.token_id_limit - 1}, past the model's vocabulary (${spec.vocabSize})`);
  }
  const sha = workloadSha256(workload);
  if (o.workloadOut) writeFileSync(o.workloadOut, canonicalWorkloadJson(workload));
  const stats = workloadStats(workload);
  const base = {
    probe: 'throughput',
    model: o.model,
    workload_sha256: sha,
    seed: workload.seed,
    requests: workload.requests.length,
    min_len: workload.min_len,
    max_input_len: workload.max_input_len,
    max_output_len: workload.max_output_len,
    token_id_limit: workload.token_id_limit,
    prompt_tokens: stats.promptTokens,
    max_output_tokens: stats.maxOutputTokens,
    max_positions: stats.maxPositions,
  };
  if (o.workloadOnly) return { ...base, probe: 'throughput_workload', workload_out: o.workloadOut ?? null };
  if (stats.maxPositions + 1 > spec.maxPositionEmbeddings) {
    throw new WorkloadError(`the longest request needs ${stats.maxPositions + 1} positions; the model has ${spec.maxPositionEmbeddings} (max_position_embeddings)`);
  }
  const verify = o.verify ?? 8;
  if (!Number.isInteger(verify) || verify < 0) throw new WorkloadError(`verify must be a non-negative integer, got ${String(verify)}`);
  const baseline = o.baselineFile ? readBaseline(o.baselineFile) : undefined;
  if (baseline?.workload_sha256 !== undefined && baseline.workload_sha256 !== sha) {
    throw new WorkloadError(`baseline ${o.baselineFile} ran workload ${baseline.workload_sha256}, not this one (${sha}): the ratio would mean nothing`);
  }

  const t0Load = performance.now();
  // The backend first, so the KV cache can be sized from the device's memory before the engine
  // places anything: the whole workload at once where it fits (nano-vllm fills 90 % of the GPU).
  const selected = await selectBackend(o.backend, {
    numerics: o.numerics,
    matmulPrecision: o.matmulPrecision,
    ...(o.batchInvariant !== undefined ? { batchInvariant: o.batchInvariant } : {}),
  });
  const backend = o.wrapBackend ? o.wrapBackend(selected.backend) : selected.backend;
  const backendNotes = selected.notes;
  let engine: Engine | undefined;
  try {
    const kvDtype = kvDtypeOf(backend, o.kvCacheDtype ?? 'auto');
    const kvPerToken = 2 * spec.numLayers * spec.numKvHeads * spec.headDim * DTYPE_BYTES[kvDtype];
    const kvNeeded = workload.requests.reduce((a, r) => a + (Math.ceil((r.prompt_ids.length + r.max_tokens) / BLOCK) + 1) * BLOCK * kvPerToken, 0);
    const kvRoom = kvRoomBytes(backend, checkpointBytes(o.model));
    const kvCacheBytes = o.kvCacheBytes ?? Math.max(BLOCK * 4 * kvPerToken, Math.min(kvNeeded, kvRoom));
    const maxNumSeqs = o.maxNumSeqs ?? 256;
    engine = await Engine.create({
      model: o.model,
      backend,
      kvCacheDtype: o.kvCacheDtype,
      maxNumSeqs,
      maxNumBatchedTokens: o.maxNumBatchedTokens,
      ...(o.decodePromptBudget !== undefined ? { decodePromptBudget: o.decodePromptBudget } : {}),
      kvCacheBytes,
      maxModelLen: stats.maxPositions + BLOCK,
      // Several GPUs: pipeline stages (micro-batched on separate GPUs) or tensor-parallel shards.
      ...(o.pipelineParallel !== undefined ? { pipelineParallel: o.pipelineParallel } : {}),
      ...(o.pipelineMicroBatches !== undefined ? { pipelineMicroBatches: o.pipelineMicroBatches } : {}),
      ...(o.tensorParallel !== undefined ? { tensorParallel: o.tensorParallel } : {}),
      ...(o.allowSingleDeviceStages !== undefined ? { allowSingleDeviceStages: o.allowSingleDeviceStages } : {}),
      ...(o.stageVramBudgets !== undefined ? { stageVramBudgets: o.stageVramBudgets } : {}),
      ...(o.vramBudget !== undefined ? { vramBudget: o.vramBudget } : {}),
    });
    const e = engine;
    const loadS = (performance.now() - t0Load) / 1000;

    // Warm-up outside the figures (nano-vllm runs one short request first): a batch as wide as the
    // engine takes, of short prompts ending at different steps, so the decode graphs of the batch
    // sizes on the way down are captured here rather than in the timed run.
    // Step signals: the engine's preemption count is cumulative (warm-up included).
    let lastPreemptions = 0;
    // Decode steps enqueued ahead and dropped (cumulative, like the preemptions).
    let lastDropped = 0;
    let counting = false;
    let maxRunning = 0;
    let steps = 0;
    let runningSum = 0;
    // Where the run's time went: steps that computed prompt tokens (with any decode rows beside
    // them) against decode-only steps, by the steps' own wall time.
    let promptSteps = 0;
    let promptStepMs = 0;
    const decodeStepMs: number[] = [];
    let decodeRows = 0;
    // Decode-only steps the device had before the host scheduled them (run-ahead), and the wall
    // time of the others, each of which began with the device waiting for the host.
    let decodeAhead = 0;
    let decodeFreshMs = 0;
    const off = e.onStep((s) => {
      lastPreemptions = s.preemptions;
      lastDropped = s.droppedSteps;
      if (!counting) return;
      steps++;
      runningSum += s.running;
      if (s.promptTokens > 0) {
        promptSteps++;
        promptStepMs += s.stepMs;
      } else {
        decodeStepMs.push(s.stepMs);
        decodeRows += s.generationTokens;
        if (s.enqueuedAhead) decodeAhead++;
        else decodeFreshMs += s.stepMs;
      }
      if (s.running > maxRunning) maxRunning = s.running;
    });
    const t0Warm = performance.now();
    const warmN = Math.min(maxNumSeqs, workload.requests.length);
    const vocabCap = workload.token_id_limit;
    await Promise.all(
      Array.from({ length: warmN }, (_, i) =>
        e.submit(
          Array.from({ length: 8 }, (_, t) => (i * 131 + t * 7 + 1) % vocabCap),
          { maxTokens: 1 + (i % 32), temperature: 0, ignoreEos: true, cacheSalt: 'throughput-warmup' },
        ).done,
      ),
    );
    const warmupS = (performance.now() - t0Warm) / 1000;

    const preemptions0 = lastPreemptions;
    const dropped0 = lastDropped;
    counting = true;
    const t0 = performance.now();
    const handles = workload.requests.map((r) => e.submit(r.prompt_ids, { maxTokens: r.max_tokens, temperature: 0, ignoreEos: true }));
    const outcomes: RequestOutcome[] = await Promise.all(handles.map((h) => h.done));
    const totalS = (performance.now() - t0) / 1000;
    counting = false;
    const preemptions = lastPreemptions - preemptions0;
    const droppedSteps = lastDropped - dropped0;
    off();

    const outputTokens = outcomes.reduce((a, x) => a + x.tokenIds.length, 0);
    const failed = outcomes.filter((x) => x.finishReason !== 'length').length;
    // Nothing aborts these requests but an engine failure (it aborts every live request): a
    // figure from such a run would measure the failure.
    const aborted = outcomes.filter((x) => x.finishReason === 'abort').length;
    if (aborted > 0) throw new Error(`throughput: ${aborted} of ${outcomes.length} requests were aborted by an engine failure (it ends their token streams with the error)`);
    let hot = 0;
    let replays = 0;
    let decodeTokens = 0;
    // The device time of the steps that sampled tokens (each step's share in its tokens' ledgers):
    // against total_s, how long the device waited for the host.
    let deviceMs: number | null = null;
    const notes = [...backendNotes];
    for (const x of outcomes) {
      const s = x.ledger.summary();
      hot += s.hot_path_allocations;
      replays += s.graph_replays;
      decodeTokens += s.decode_tokens;
      if (s.device_active_ms_total !== undefined) deviceMs = (deviceMs ?? 0) + s.device_active_ms_total;
      for (const n of s.notes) if (!notes.includes(n)) notes.push(n);
    }
    const ttft = outcomes.flatMap((x) => (x.times.firstToken !== undefined ? [x.times.firstToken - x.times.arrival] : []));

    // Each chosen request again, alone: greedy tokens must be those of the batched run.
    const t0Verify = performance.now();
    const idx = verifyIndices(workload, verify);
    const mismatchDetails: Record<string, unknown>[] = [];
    for (const i of idx) {
      const r = workload.requests[i];
      // A salt of its own: the alone run recomputes its prompt instead of reusing the batch's pages.
      const alone = await e.submit(r.prompt_ids, { maxTokens: r.max_tokens, temperature: 0, ignoreEos: true, cacheSalt: 'throughput-verify' }).done;
      const d = firstDivergence(outcomes[i].tokenIds, alone.tokenIds);
      if (d >= 0) mismatchDetails.push({ index: i, first_divergence: d, batched_tokens: outcomes[i].tokenIds.length, alone_tokens: alone.tokenIds.length });
    }
    const verifyS = (performance.now() - t0Verify) / 1000;

    // --profile: where a decode step of a full batch goes (eager: every op timed).
    let profile: Record<string, unknown> | null = null;
    if (o.profile) {
      const some = workload.requests.slice(0, maxNumSeqs);
      // Long enough that every prompt is in before the first request ends (a step takes about a
      // token budget of prompt tokens), so some decode steps are full width.
      const promptTokens = some.reduce((a, r) => a + r.prompt_ids.length, 0);
      const maxTokens = Math.ceil(promptTokens / e.maxNumBatchedTokens + some.length / 16) + PROFILE_STEPS + 1;
      e.setProfiling(true);
      e.takeProfiles();
      try {
        await Promise.all(some.map((r) => e.submit(r.prompt_ids, { maxTokens: Math.max(1, Math.min(maxTokens, stats.maxPositions - r.prompt_ids.length)), temperature: 0, ignoreEos: true, cacheSalt: 'throughput-profile' }).done));
        profile = meanStepProfile(e.takeProfiles(), some.length);
      } finally {
        e.setProfiling(false);
      }
    }

    const r: Record<string, unknown> = {
      ...base,
      backend: backend.name,
      device: backend.capabilities.deviceName,
      numerics: backend.capabilities.numerics ?? 'exact',
      kv_dtype: e.kvDtype,
      matmul_precision: e.matmulPrecision,
      batch_invariant: backend.capabilities.batchInvariant === true,
      // How the model was split over devices (null: one device).
      pipeline: e.pipelineDescription() ?? null,
      tensor_parallel: e.tensorParallelDescription() ?? null,
      output_tokens: outputTokens,
      total_s: r3(totalS),
      output_tok_s: r2(outputTokens / totalS),
      total_tok_s: r2((stats.promptTokens + outputTokens) / totalS),
      requests_per_s: r3(workload.requests.length / totalS),
      // Requests that did not end at their max_tokens (with ignore_eos every one should).
      unfinished: failed,
      prefill_tokens: stats.promptTokens,
      cached_prompt_tokens: outcomes.reduce((a, x) => a + x.numCachedTokens, 0),
      decode_tokens: decodeTokens,
      ttft_ms_p50: percentile(ttft, 50),
      ttft_ms_p99: percentile(ttft, 99),
      steps,
      max_running: maxRunning,
      mean_running: steps > 0 ? r2(runningSum / steps) : 0,
      prompt_steps: promptSteps,
      prompt_step_s: r3(promptStepMs / 1000),
      decode_steps: decodeStepMs.length,
      decode_step_s: r3(decodeStepMs.reduce((a, v) => a + v, 0) / 1000),
      decode_step_ms_p50: percentile(decodeStepMs, 50),
      decode_rows_mean: decodeStepMs.length > 0 ? r2(decodeRows / decodeStepMs.length) : 0,
      // Decode-only steps enqueued ahead of the host (run-ahead), and the wall time of the others.
      decode_steps_ahead: decodeAhead,
      decode_fresh_step_s: r3(decodeFreshMs / 1000),
      // Decode steps the engine enqueued ahead of the host and then dropped (a request ended, a
      // prompt step came between): device time spent on tokens no request took.
      dropped_steps: droppedSteps,
      device_active_s: deviceMs === null ? null : r3(deviceMs / 1000),
      preemptions,
      graph_replays: replays,
      hot_path_allocations: hot,
      max_num_seqs: maxNumSeqs,
      max_num_batched_tokens: o.maxNumBatchedTokens ?? null,
      decode_prompt_budget: o.decodePromptBudget ?? null,
      kv_cache_bytes: e.kvCacheBytes,
      kv_needed_bytes: kvNeeded,
      kv_blocks: e.numBlocks,
      load_s: r3(loadS),
      warmup_s: r3(warmupS),
      verified: idx.length,
      verify_indices: idx,
      mismatches: mismatchDetails.length,
      mismatch_details: mismatchDetails,
      verify_s: r3(verifyS),
      ...(o.profile ? { profile } : {}),
      notes,
    };
    if (o.tokensOut) writeFileSync(o.tokensOut, JSON.stringify({ workload_sha256: sha, tokens: outcomes.map((x) => x.tokenIds) }));
    if (e.kvCacheBytes < kvNeeded) notes.push(`KV cache ${e.kvCacheBytes} bytes holds less than the whole workload (${kvNeeded}): the scheduler queues or preempts`);
    if (baseline) Object.assign(r, compareBaseline(baseline, outcomes, outputTokens / totalS));
    return r;
  } finally {
    engine?.dispose();
    backend.dispose();
  }
}

/**
 * Room for the KV cache on this backend: 85 % of what is left of the compute tier once the
 * weights (their checkpoint's bytes, an upper bound) and 1 GiB for activations and workspaces are
 * taken.
 */
function kvRoomBytes(backend: DeviceBackend, weightBytes: number): number {
  const caps = backend.capabilities;
  const total = caps.memory[caps.computeTier] ?? 0;
  const free = total - backend.stats().liveBytes - weightBytes - 2 ** 30;
  return Math.max(0, Math.floor((0.85 * free) / 2 ** 20) * 2 ** 20);
}

/** NERVA's figures beside the PyTorch baseline's, from the same workload. */
function compareBaseline(b: BaselineLine, outcomes: readonly RequestOutcome[], tokS: number): Record<string, unknown> {
  const torchTokS = typeof b.output_tok_s === 'number' ? b.output_tok_s : null;
  const out: Record<string, unknown> = {
    torch_output_tok_s: torchTokS,
    speedup_vs_torch: torchTokS ? r3(tokS / torchTokS) : null,
    torch_mode: b.mode ?? null,
    torch_batch_size: b.batch_size ?? null,
    torch_error: b.error ?? null,
  };
  if (Array.isArray(b.check_tokens)) {
    // bf16 PyTorch against NERVA's numerics on random weights: agreement is informational.
    const cmp = b.check_tokens
      .filter((c) => Number.isInteger(c.index) && c.index >= 0 && c.index < outcomes.length && Array.isArray(c.tokens))
      .map((c) => ({ index: c.index, first_divergence: firstDivergence(outcomes[c.index].tokenIds, c.tokens) }));
    out.torch_tokens_compared = cmp.length;
    out.torch_tokens_equal = cmp.filter((c) => c.first_divergence < 0).length;
    out.torch_first_divergence = cmp;
  }
  return out;
}
