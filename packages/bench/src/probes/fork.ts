import { Engine, type RequestOutcome } from '@nerva/engine';
import { syntheticPrompt } from '../measure.js';

export interface ForkProbeOptions {
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
  kvCacheDtype?: 'auto' | 'f32' | 'bf16';
  matmulPrecision?: 'exact' | 'bf16';
}

const r3 = (x: number) => Math.round(x * 1000) / 1000;

/** Time from a request's first token to its last (its decode), and from arrival to the end. */
function spans(o: RequestOutcome): { decode: number; total: number; first: number; last: number; arrival: number } {
  const t = o.times;
  const first = t.firstToken ?? t.arrival;
  const last = t.lastToken ?? t.finished ?? first;
  return { decode: last - first, total: (t.finished ?? last) - t.arrival, first, last, arrival: t.arrival };
}

/**
 * Shared-prefix forks: n sequences continue one prompt. The prompt is prefilled once (a warm-up
 * request), so each fork finds the prompt's full KV blocks in the prefix cache and shares them by
 * reference count; only the prompt's last partial block is its own. The n forks run at once
 * (continuous batching puts them in the same decode steps) against the same n requests run one
 * after the other; fork i and sequential run i sample with the same seed, so their tokens must be
 * identical. Decode wall time is first token to last token (the forks: earliest first token to
 * latest last token; sequential: the sum over runs).
 */
export async function forkProbe(o: ForkProbeOptions): Promise<Record<string, unknown>> {
  const n = o.n ?? 32;
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`--n must be a positive integer, got ${n}`);
  const engine = await Engine.create({
    model: o.model,
    backend: o.backend,
    maxNumSeqs: Math.max(8, n),
    maxModelLen: o.promptLen + o.newTokens + 32,
    enablePrefixCaching: true,
    kvCacheDtype: o.kvCacheDtype,
    matmulPrecision: o.matmulPrecision,
  });
  try {
    const prompt = syntheticPrompt(o.promptLen, engine.spec.vocabSize, 7);
    const params = (i: number) => ({ maxTokens: o.newTokens, temperature: o.temperature, seed: o.seed + i, ignoreEos: true });
    // Warm-up: compiles graphs for batch 1 and puts the prompt's full blocks in the prefix cache.
    await engine.submit(prompt, { maxTokens: 2, temperature: 0, ignoreEos: true }).done;
    const sequential: RequestOutcome[] = [];
    for (let i = 0; i < n; i++) sequential.push(await engine.submit(prompt, params(i)).done);
    const before = engine.kv.stats();
    const t0 = performance.now();
    const handles = Array.from({ length: n }, (_, i) => engine.submit(prompt, params(i)));
    // Blocks held right after admission: the shared prompt blocks count once.
    const forks = await Promise.all(handles.map((h) => h.done));
    const wall = performance.now() - t0;
    const after = engine.kv.stats();
    const seq = sequential.map(spans);
    const fk = forks.map(spans);
    const seqDecode = seq.reduce((a, s) => a + s.decode, 0);
    const seqTotal = seq.reduce((a, s) => a + s.total, 0);
    const forkDecode = Math.max(...fk.map((s) => s.last)) - Math.min(...fk.map((s) => s.first));
    const forkTotal = Math.max(...fk.map((s) => s.last)) - Math.min(...fk.map((s) => s.arrival));
    const mismatches = forks.map((f, i) => ({ index: i, first: f.tokenIds.findIndex((t, j) => t !== sequential[i].tokenIds[j]) })).filter((m) => m.first >= 0 || forks[m.index].tokenIds.length !== sequential[m.index].tokenIds.length);
    const bs = engine.kv.blockSize;
    const sharedBlocks = Math.floor(o.promptLen / bs);
    const decodeTokens = forks.reduce((a, f) => a + f.tokenIds.length, 0);
    return {
      probe: 'fork',
      model: o.model,
      backend: engine.backend.name,
      device: engine.backend.capabilities.deviceName,
      numerics: engine.backend.capabilities.numerics ?? 'exact',
      matmul_precision: engine.matmulPrecision,
      kv_cache_dtype: engine.kvDtype,
      n,
      prompt_len: o.promptLen,
      new_tokens: o.newTokens,
      temperature: o.temperature,
      seed: o.seed,
      // The prompt's full blocks every fork shares through the prefix cache (the partial last one is each fork's own).
      shared_prompt_blocks: sharedBlocks,
      prefix_hit_tokens: after.prefixHits - before.prefixHits,
      cached_prompt_tokens: forks.reduce((a, f) => a + f.numCachedTokens, 0),
      sequential_decode_s: r3(seqDecode / 1000),
      fork_decode_s: r3(forkDecode / 1000),
      decode_speedup: r3(seqDecode / forkDecode),
      sequential_total_s: r3(seqTotal / 1000),
      fork_total_s: r3(forkTotal / 1000),
      total_speedup: r3(seqTotal / forkTotal),
      fork_wall_s: r3(wall / 1000),
      fork_decode_tok_s: r3(decodeTokens / (forkDecode / 1000)),
      tokens_identical: mismatches.length === 0,
      mismatches: mismatches.length,
      mismatch_details: mismatches.slice(0, 8),
      distinct_fork_outputs: new Set(forks.map((f) => f.tokenIds.join(','))).size,
      hot_path_allocations: forks.reduce((a, f) => a + (f.ledger.summary().hot_path_allocations ?? 0), 0),
      kv_blocks_free_after: after.freeBlocks,
      kv_blocks_total: after.totalBlocks,
    };
  } finally {
    engine.dispose();
  }
}
