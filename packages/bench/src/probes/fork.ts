import { createHash } from 'node:crypto';
import { Engine, type GenerateOptions, type PassProfile, type RequestOutcome, type StepSignals, type EngineOptions } from '@nerva/engine';
import { syntheticPrompt } from '../measure.js';

export interface ForkProbeOptions extends Pick<EngineOptions, 'kvCacheDtype' | 'matmulPrecision' | 'batchInvariant'> {
  model: string;
  backend: 'cpu' | 'cuda' | 'auto';
  /** Forks of the prompt (default 32). */
  n?: number;
  promptLen: number;
  newTokens: number;
  /** Sampling temperature of every fork (0: greedy, the forks are then identical). */
  temperature: number;
  /** Fork i samples with seed + i; its sequential run uses the same seed. */
  seed: number;
  /**
   * Prefix caching (default off: every block the forks share is shared by the fork itself, and
   * each sequential run prefills the whole prompt, as a request would alone).
   */
  prefixCaching?: boolean;
  /**
   * After the timed runs, a few more steps with every op timed by device events (graphs off):
   * `profile` in the line, a mean decode step of the n forks and of one request alone, in ms by
   * op class. The timed runs are not profiled.
   */
  profile?: boolean;
  /**
   * Also time the same n requests one by one on an engine with the default decode path (no batch
   * invariance): `decode_speedup_vs_default`. Default: on for a batch-invariant run, whose own
   * one-by-one runs take the slower batch-invariant one-row path.
   */
  vsDefault?: boolean;
  /**
   * Run the n requests one by one (default true). False: the forks alone, for comparing builds
   * by the fork step and `tokens_sha256` at a fraction of the time; every one-by-one figure
   * (and `tokens_identical`, `vsDefault`) is then null or left out.
   */
  sequential?: boolean;
}

/** Decode steps a profile averages (after the step that samples the first tokens). */
const PROFILE_STEPS = 8;

const r3 = (x: number) => Math.round(x * 1000) / 1000;

function median(xs: number[]): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** Time from a request's first token to its last (its decode), and from arrival to the end. */
function spans(o: RequestOutcome): { decode: number; total: number; first: number; last: number; arrival: number; finished: number } {
  const t = o.times;
  const first = t.firstToken ?? t.arrival;
  const last = t.lastToken ?? t.finished ?? first;
  const finished = t.finished ?? last;
  return { decode: last - first, total: finished - t.arrival, first, last, arrival: t.arrival, finished };
}

/**
 * Median device time of a decode step (after the first token). A token's record holds its share
 * of its step's device time: summed per step index when the outcomes decoded together (forks),
 * per request and step when they ran one by one.
 */
function stepDeviceMs(outcomes: readonly RequestOutcome[], together: boolean): number | null {
  const perStep = new Map<string, number>();
  for (const o of outcomes)
    for (const rec of o.ledger.all()) {
      if (rec.phase !== 'decode' || rec.deviceActiveMs === undefined) continue;
      const key = together ? `${rec.step}` : `${rec.seq}:${rec.step}`;
      perStep.set(key, (perStep.get(key) ?? 0) + rec.deviceActiveMs);
    }
  const m = median([...perStep.values()]);
  return m === null ? null : r3(m);
}

/**
 * The mean of profiled decode steps of `rows` rows: device time, the ops' sum, ms by op class
 * (largest first) and by coarse bucket. Null without such steps.
 */
export function meanStepProfile(steps: readonly PassProfile[], rows: number): Record<string, unknown> | null {
  const sel = steps.filter((st) => st.rows === rows);
  if (sel.length === 0) return null;
  const ms: Record<string, number> = {};
  const buckets: Record<string, number> = {};
  let device = 0;
  for (const st of sel) {
    device += st.deviceMs;
    for (const [k, v] of Object.entries(st.ops)) ms[k] = (ms[k] ?? 0) + v / sel.length;
    for (const [k, v] of Object.entries(st.buckets)) buckets[k] = (buckets[k] ?? 0) + v / sel.length;
  }
  const total = Object.values(ms).reduce((a, b) => a + b, 0);
  return {
    rows,
    steps: sel.length,
    device_ms: r3(device / sel.length),
    op_total_ms: r3(total),
    ms: Object.fromEntries(Object.entries(ms).sort((a, b) => b[1] - a[1]).map(([k, v]) => [k, r3(v)])),
    buckets_ms: Object.fromEntries(Object.entries(buckets).map(([k, v]) => [k, r3(v)])),
  };
}

/**
 * Shared-prefix forks (Engine.submitFork): n sequences continue one prompt. The prompt is
 * prefilled once, its last position sampled once per fork (fork i with seed + i), then the forks
 * share the prompt's full KV blocks by reference count (each copies only the partial last block)
 * and decode together in the same batched steps. Against: the same n requests run one after the
 * other (`submit`, seed + i), which must give every fork's tokens exactly.
 *
 * Decode wall time is first token to last token: for the forks, from their common first token to
 * the last fork's last token; sequentially, the sum over the runs. Total wall time adds the
 * prefill (arrival to the end). Graphs for batch 1 and for n rows are captured in a warm-up.
 */
export async function forkProbe(o: ForkProbeOptions): Promise<Record<string, unknown>> {
  const n = o.n ?? 32;
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`--n must be a positive integer, got ${n}`);
  if (o.sequential === false && o.vsDefault === true) throw new RangeError('--vs-default needs the one-by-one runs (drop --no-sequential)');
  const { line, forkDecodeMs } = await forkRuns(o, n);
  if (o.sequential === false) return line;
  // Batch-invariant forks: also the engine's default path one by one at the same context, the
  // baseline a user without the flag has (its one-row decode is faster than the batch-invariant
  // one, so this ratio is the smaller, honest one).
  if (o.vsDefault ?? line.batch_invariant === true) {
    const d = await defaultSequential(o, n);
    line.default_sequential_decode_s = r3(d.decodeMs / 1000);
    line.default_sequential_decode_tok_s = r3(d.tokens / (d.decodeMs / 1000));
    line.decode_speedup_vs_default = r3(d.decodeMs / forkDecodeMs);
  }
  return line;
}

/**
 * The n requests one after the other on an engine with the default decode path (no batch
 * invariance; the same cache type and matmul precision): their decode time, first token to last,
 * summed, after a warm-up that captures the batch-1 graph.
 */
async function defaultSequential(o: ForkProbeOptions, n: number): Promise<{ decodeMs: number; tokens: number }> {
  const engine = await Engine.create({
    model: o.model,
    backend: o.backend,
    maxNumSeqs: 8,
    maxModelLen: o.promptLen + o.newTokens + 32,
    enablePrefixCaching: o.prefixCaching ?? false,
    kvCacheDtype: o.kvCacheDtype,
    matmulPrecision: o.matmulPrecision,
    batchInvariant: false,
  });
  try {
    const prompt = syntheticPrompt(o.promptLen, engine.spec.vocabSize, 7);
    await engine.submit(prompt, { maxTokens: Math.min(4, o.newTokens), temperature: 0, ignoreEos: true }).done;
    let decodeMs = 0;
    let tokens = 0;
    for (let i = 0; i < n; i++) {
      const out = await engine.submit(prompt, { maxTokens: o.newTokens, temperature: o.temperature, seed: o.seed + i, ignoreEos: true }).done;
      decodeMs += spans(out).decode;
      tokens += out.tokenIds.length;
    }
    return { decodeMs, tokens };
  } finally {
    engine.dispose();
  }
}

async function forkRuns(o: ForkProbeOptions, n: number): Promise<{ line: Record<string, unknown>; forkDecodeMs: number }> {
  const prefixCaching = o.prefixCaching ?? false;
  const engine = await Engine.create({
    model: o.model,
    backend: o.backend,
    maxNumSeqs: Math.max(8, n),
    maxModelLen: o.promptLen + o.newTokens + 32,
    enablePrefixCaching: prefixCaching,
    kvCacheDtype: o.kvCacheDtype,
    matmulPrecision: o.matmulPrecision,
    ...(o.batchInvariant !== undefined ? { batchInvariant: o.batchInvariant } : {}),
  });
  try {
    const prompt = syntheticPrompt(o.promptLen, engine.spec.vocabSize, 7);
    const params: GenerateOptions = { maxTokens: o.newTokens, temperature: o.temperature, seed: o.seed, ignoreEos: true };
    // Warm-up: captures the decode graphs of batch 1 and of the n forks.
    const warm = { maxTokens: Math.min(4, o.newTokens), temperature: 0, ignoreEos: true };
    await engine.submit(prompt, warm).done;
    await Promise.all(engine.submitFork(prompt, n, warm).map((h) => h.done));

    const runSequential = o.sequential !== false;
    const sequential: RequestOutcome[] = [];
    for (let i = 0; runSequential && i < n; i++) sequential.push(await engine.submit(prompt, { ...params, seed: o.seed + i }).done);

    const steps: StepSignals[] = [];
    let peakUsed = 0;
    let peakShared = 0;
    const off = engine.onStep((s) => {
      steps.push(s);
      const k = engine.kv.stats();
      peakUsed = Math.max(peakUsed, k.usedBlocks - 1);
      peakShared = Math.max(peakShared, k.sharedBlocks);
    });
    let forks: RequestOutcome[];
    try {
      forks = await Promise.all(engine.submitFork(prompt, n, params).map((h) => h.done));
    } finally {
      off();
    }
    const after = engine.kv.stats();
    // --profile: where a step's device time goes, n forks against one row (eager, every op timed).
    let profile: Record<string, unknown> | null = null;
    if (o.profile) {
      const short = { ...params, maxTokens: Math.min(o.newTokens, PROFILE_STEPS + 1) };
      engine.setProfiling(true);
      engine.takeProfiles();
      try {
        await Promise.all(engine.submitFork(prompt, n, short).map((h) => h.done));
        const forkSteps = engine.takeProfiles();
        await engine.submit(prompt, short).done;
        const single = engine.takeProfiles().filter((st) => st.rows === 1);
        const forkStep = n > 1 ? meanStepProfile(forkSteps, n) : meanStepProfile(single, 1);
        const oneStep = meanStepProfile(single, 1);
        profile = {
          fork_step: forkStep,
          single_step: oneStep,
          // A step of n rows against n steps of one: what the decode speedup would be from device time alone.
          device_speedup:
            forkStep && oneStep && (forkStep.device_ms as number) > 0 ? r3((n * (oneStep.device_ms as number)) / (forkStep.device_ms as number)) : null,
        };
      } finally {
        engine.setProfiling(false);
      }
    }
    const seq = sequential.map(spans);
    const fk = forks.map(spans);
    const seqDecode = seq.reduce((a, s) => a + s.decode, 0);
    const seqTotal = seq.reduce((a, s) => a + s.total, 0);
    const forkDecode = Math.max(...fk.map((s) => s.last)) - Math.min(...fk.map((s) => s.first));
    const forkTotal = Math.max(...fk.map((s) => s.finished)) - Math.min(...fk.map((s) => s.arrival));
    // Without the one-by-one runs: null where a figure needs them.
    const seqOr = <T>(v: T): T | null => (runSequential ? v : null);
    const mismatches = (runSequential ? forks : [])
      .map((f, i) => ({ index: i, first_difference: f.tokenIds.findIndex((t, j) => t !== sequential[i].tokenIds[j]), fork_tokens: f.tokenIds.length, sequential_tokens: sequential[i].tokenIds.length }))
      .filter((m) => m.first_difference >= 0 || m.fork_tokens !== m.sequential_tokens);
    const bs = engine.kv.blockSize;
    const decodeTokens = forks.reduce((a, f) => a + f.tokenIds.length, 0);
    // Decode steps: every step after the one that prefilled the prompt and sampled the n first tokens.
    const decodeSteps = steps.filter((s) => s.promptTokens === 0 && s.generationTokens > 0);
    const stepCallMs = median(decodeSteps.map((s) => s.stepMs));
    const summaries = forks.map((f) => f.ledger.summary());
    const seqSummaries = sequential.map((f) => f.ledger.summary());
    const mean = (xs: number[]) => (xs.length ? r3(xs.reduce((a, x) => a + x, 0) / xs.length) : null);
    const nodes = engine.graphNodes();
    const bucket = Object.keys(nodes)
      .map(Number)
      .filter((b) => b >= n)
      .sort((a, b) => a - b)[0];
    const line: Record<string, unknown> = {
      probe: 'fork',
      model: o.model,
      backend: engine.backend.name,
      device: engine.backend.capabilities.deviceName,
      numerics: engine.backend.capabilities.numerics ?? 'exact',
      matmul_precision: engine.matmulPrecision,
      batch_invariant: engine.backend.capabilities.batchInvariant === true,
      kv_cache_dtype: engine.kvDtype,
      prefix_caching: prefixCaching,
      n,
      prompt_len: o.promptLen,
      new_tokens: o.newTokens,
      temperature: o.temperature,
      seed: o.seed,
      // Decode (first token to last) and total (arrival to end) wall time, sequential vs forks.
      sequential_decode_s: seqOr(r3(seqDecode / 1000)),
      fork_decode_s: r3(forkDecode / 1000),
      decode_speedup: seqOr(r3(seqDecode / forkDecode)),
      sequential_total_s: seqOr(r3(seqTotal / 1000)),
      fork_total_s: r3(forkTotal / 1000),
      total_speedup: seqOr(r3(seqTotal / forkTotal)),
      fork_decode_tok_s: r3(decodeTokens / (forkDecode / 1000)),
      sequential_decode_tok_s: seqOr(r3(sequential.reduce((a, f) => a + f.tokenIds.length, 0) / (seqDecode / 1000))),
      tokens_identical: seqOr(mismatches.length === 0),
      mismatches: seqOr(mismatches.length),
      mismatch_details: mismatches.slice(0, 8),
      distinct_fork_outputs: new Set(forks.map((f) => f.tokenIds.join(','))).size,
      // Every fork's tokens in fork order: equal digests across builds mean the same bits sampled.
      tokens_sha256: createHash('sha256').update(forks.map((f) => f.tokenIds.join(',')).join(';')).digest('hex').slice(0, 16),
      // The prompt was prefilled once for all forks (prefill tokens computed during the fork run).
      fork_prefill_tokens: steps.reduce((a, s) => a + s.promptTokens, 0),
      fork_steps: steps.length,
      // KV: the prompt's full blocks every fork shares by reference (the partial last one is copied per fork).
      block_size: bs,
      shared_prompt_blocks: Math.floor(o.promptLen / bs),
      kv_shared_blocks_peak: peakShared,
      kv_blocks_used_peak: peakUsed,
      // What n separate sequences of prompt + new tokens would hold.
      kv_blocks_unshared: n * Math.ceil((o.promptLen + o.newTokens) / bs),
      // Per decode step: blocks read by 2+ forks, and the reads of them beyond the first (what a
      // kernel reading each shared block once for all forks would save).
      prefix_blocks_read_per_step: median(decodeSteps.map((s) => s.sharedBlocks)),
      redundant_block_reads_per_step: median(decodeSteps.map((s) => s.sharedBlockReads)),
      decode_rows_per_step: median(decodeSteps.map((s) => s.scheduledTokens)),
      // Where a step's wall time goes: the interval between decode steps (fork decode time over
      // the steps), the host's step call (scheduling, launch or replay, the wait, accepting
      // tokens) and the device time between its events; sequentially the same per token.
      fork_step_interval_ms: decodeSteps.length > 0 ? r3(forkDecode / decodeSteps.length) : null,
      fork_step_call_ms_p50: stepCallMs === null ? null : r3(stepCallMs),
      fork_step_device_ms_p50: stepDeviceMs(forks, true),
      sequential_token_interval_ms: seqOr(r3(seqDecode / Math.max(1, sequential.reduce((a, f) => a + f.tokenIds.length - 1, 0)))),
      sequential_token_device_ms_p50: seqOr(stepDeviceMs(sequential, false)),
      graph_nodes: bucket !== undefined ? nodes[bucket] : null,
      graph_bucket: bucket ?? null,
      graph_replays_per_decode_token: mean(summaries.map((s) => s.graph_replays_per_decode_token)),
      sequential_graph_replays_per_decode_token: seqOr(mean(seqSummaries.map((s) => s.graph_replays_per_decode_token))),
      syncs_per_decode_token: summaries[0]?.syncs_per_decode_token ?? null,
      hot_path_allocations: [...summaries, ...seqSummaries].reduce((a, s) => a + (s.hot_path_allocations ?? 0), 0),
      kv_blocks_free_after: after.freeBlocks,
      kv_blocks_total: after.totalBlocks,
      notes: summaries[0]?.notes ?? [],
      ...(o.profile ? { profile } : {}),
    };
    return { line, forkDecodeMs: forkDecode };
  } finally {
    engine.dispose();
  }
}
