import { Engine, type PassProfile, type EngineOptions } from '@nerva/engine';
import type { ModelSpec } from '@nerva/models';
import { prefillFlops, prefillFlopsByClass } from '../flops.js';
import { type GemmRate, type GemmShape, measureGemmRate, syntheticPrompt, withScratchBackend } from '../measure.js';

export interface PrefillProbeOptions extends Pick<EngineOptions, 'matmulPrecision' | 'numerics' | 'kvCacheDtype' | 'vramBudget' | 'batchInvariant'> {
  model: string;
  backend: 'cpu' | 'cuda' | 'auto';
  /** Prompt tokens of each timed prefill. */
  promptLen: number;
  /** Timed prefills (default 3), each of a distinct prompt. */
  repeats?: number;
  /** Largest prefill chunk (the engine's maxNumBatchedTokens); default promptLen: the prompt is one chunk. */
  chunk?: number;
  /** GEMM shapes of the rate measurement (default: defaultGemmShapes of the backend). */
  gemmShapes?: readonly GemmShape[];
  /** Device time of each shape's timed products, at least (default 200 ms). */
  gemmMinMs?: number;
  /**
   * After the timed prefills, one more with every op bracketed by device events (Engine.setProfiling):
   * `profile` in the line, the device time by op class (profileSummary). The timed prefills are not profiled.
   */
  profile?: boolean;
}

/**
 * The op-level device times of one profiled prefill (its steps: one per chunk), summed over the
 * steps: `ms` by op class (the matmuls by projection, lm_head, else the op's name), largest
 * first; `op_total_ms` their sum, `device_ms` the steps' own device time and `gaps_ms` the
 * difference (launch gaps between ops, events); `buckets_ms` by coarse bucket; `tflops` the rate
 * of each GEMM class and of attention (its FLOPs, prefillFlopsByClass, over its time), and
 * `share` each class's part of `op_total_ms`.
 */
export function profileSummary(spec: ModelSpec, tokens: number, steps: readonly PassProfile[]): Record<string, unknown> {
  const ms: Record<string, number> = {};
  const buckets: Record<string, number> = {};
  let device = 0;
  for (const st of steps) {
    device += st.deviceMs;
    for (const [k, v] of Object.entries(st.ops)) ms[k] = (ms[k] ?? 0) + v;
    for (const [k, v] of Object.entries(st.buckets)) buckets[k] = (buckets[k] ?? 0) + v;
  }
  const total = Object.values(ms).reduce((a, b) => a + b, 0);
  const sorted = Object.entries(ms).sort((a, b) => b[1] - a[1]);
  const flops = prefillFlopsByClass(spec, tokens);
  const tflops: Record<string, number> = {};
  for (const [k, f] of Object.entries(flops)) if (ms[k] > 0 && f > 0) tflops[k] = sig4(f / (ms[k] / 1000) / 1e12);
  return {
    steps: steps.length,
    rows: steps.reduce((a, s) => a + s.rows, 0),
    device_ms: r3(device),
    op_total_ms: r3(total),
    gaps_ms: r3(device - total),
    ms: Object.fromEntries(sorted.map(([k, v]) => [k, r3(v)])),
    share: Object.fromEntries(sorted.map(([k, v]) => [k, total > 0 ? r3(v / total) : 0])),
    buckets_ms: Object.fromEntries(Object.entries(buckets).map(([k, v]) => [k, r3(v)])),
    tflops,
  };
}

/**
 * Dense bf16 tensor-core peaks (TFLOP/s, without sparsity) from the vendors' data sheets, by a
 * pattern of the device name; an MFU against them is reported beside the one against the rate
 * measured in the run.
 */
const NOMINAL_BF16_PEAKS: readonly { pattern: RegExp; name: string; tflops: number }[] = [
  { pattern: /H200/i, name: 'H200 SXM', tflops: 989 },
  { pattern: /H100.*PCIe/i, name: 'H100 PCIe', tflops: 756 },
  { pattern: /H100.*NVL/i, name: 'H100 NVL', tflops: 835 },
  { pattern: /H100/i, name: 'H100 SXM', tflops: 989 },
  { pattern: /A100/i, name: 'A100', tflops: 312 },
];

/** The nominal dense bf16 peak of a device, when its name is one of NOMINAL_BF16_PEAKS. */
export function nominalBf16Peak(deviceName: string): { name: string; tflops: number } | undefined {
  const hit = NOMINAL_BF16_PEAKS.find((p) => p.pattern.test(deviceName));
  return hit ? { name: hit.name, tflops: hit.tflops } : undefined;
}

const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const h = s.length >> 1;
  return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2;
};
const r3 = (x: number) => Math.round(x * 1000) / 1000;
/** Four significant digits (rates span 1e-3 TFLOP/s on the CPU to 1e3 on a GPU). */
const sig4 = (x: number) => Number(x.toPrecision(4));

/**
 * Prefill speed against the GEMM rate measured in the same run. The engine takes the prompt as
 * one chunk (maxNumBatchedTokens = promptLen unless `chunk`), prefix caching is off and every
 * prefill has a prompt of its own, so each one computes every token. After a warm-up prefill of
 * the same length, `repeats` requests with maxTokens 1 are timed one after the other: the time of
 * a prefill is the device time the ledger records for the step that ends the prompt when the
 * prompt is one chunk (`timing: 'device'`), else the time to first token (`timing: 'wall'`).
 * MFU = model FLOPs per prefill (src/flops.ts) / that time / the GEMM rate measured on a backend
 * of the same matmul precision (the engine's own, or a scratch backend under a VRAM budget).
 */
export async function prefillProbe(o: PrefillProbeOptions): Promise<Record<string, unknown>> {
  const repeats = o.repeats ?? 3;
  if (!Number.isSafeInteger(o.promptLen) || o.promptLen < 1) throw new RangeError(`prompt length must be a positive integer, got ${o.promptLen}`);
  if (!Number.isSafeInteger(repeats) || repeats < 1) throw new RangeError(`repeats must be a positive integer, got ${repeats}`);
  const chunk = o.chunk ?? o.promptLen;
  if (!Number.isSafeInteger(chunk) || chunk < 1) throw new RangeError(`chunk must be a positive integer, got ${o.chunk}`);
  const budgeted = o.vramBudget !== undefined;
  // Under a budget the engine's arenas have no room for the GEMM's buffers: time it first, on a
  // scratch backend of the same precision.
  let gemm: GemmRate | undefined;
  if (budgeted) {
    gemm = await withScratchBackend(o.backend, (b) => measureGemmRate(b, o.gemmShapes, o.gemmMinMs), { numerics: o.numerics, matmulPrecision: o.matmulPrecision });
    if (gemm === undefined) throw new Error(`prefill: no ${o.backend} backend for the GEMM rate measurement`);
  }
  const engine = await Engine.create({
    model: o.model,
    backend: o.backend,
    numerics: o.numerics,
    matmulPrecision: o.matmulPrecision,
    kvCacheDtype: o.kvCacheDtype,
    maxNumSeqs: 1,
    maxNumBatchedTokens: Math.min(chunk, o.promptLen),
    maxModelLen: o.promptLen + 8,
    enablePrefixCaching: false,
    ...(budgeted ? { vramBudget: o.vramBudget } : {}),
    ...(o.batchInvariant !== undefined ? { batchInvariant: o.batchInvariant } : {}),
  });
  try {
    if (o.promptLen + 1 > engine.maxModelLen)
      throw new RangeError(`prompt length ${o.promptLen} does not fit the model: its longest sequence is ${engine.maxModelLen} tokens (max_position_embeddings), and the prefill samples one more`);
    if (gemm !== undefined && gemm.matmulPrecision !== engine.matmulPrecision)
      throw new Error(`prefill: the GEMM rate ran at matmul precision ${gemm.matmulPrecision}, the engine at ${engine.matmulPrecision}`);
    gemm ??= measureGemmRate(engine.backend, o.gemmShapes, o.gemmMinMs);
    const V = engine.spec.vocabSize;
    const run = async (seed: number) => {
      const out = await engine.submit(syntheticPrompt(o.promptLen, V, seed), { maxTokens: 1, temperature: 0, ignoreEos: true }).done;
      const rec = out.ledger.all().find((r) => r.phase === 'prefill');
      if (out.error) throw new Error(`prefill: the request failed: ${out.error.message}`);
      if (!rec || out.times.firstToken === undefined) throw new Error('prefill: the request produced no prefill token');
      return { wallMs: out.times.firstToken - out.times.arrival, deviceMs: rec.deviceActiveMs, allocs: rec.allocatorCalls + rec.hotPathAllocations, notes: out.ledger.summary().notes };
    };
    await run(1); // warm-up: first-use costs of this shape (GEMM heuristics, kernel loads)
    const runs = [];
    for (let r = 0; r < repeats; r++) runs.push(await run(2 + r));
    let profile: Record<string, unknown> | null = null;
    if (o.profile) {
      engine.setProfiling(true);
      engine.takeProfiles();
      try {
        await run(2 + repeats);
        profile = profileSummary(engine.spec, o.promptLen, engine.takeProfiles());
      } finally {
        engine.setProfiling(false);
      }
    }
    const oneChunk = chunk >= o.promptLen;
    const useDevice = oneChunk && runs.every((r) => r.deviceMs !== undefined && r.deviceMs > 0);
    const times = runs.map((r) => (useDevice ? r.deviceMs! : r.wallMs));
    const ms = median(times);
    const msMin = Math.min(...times);
    const flops = prefillFlops(engine.spec, o.promptLen, 1);
    const achieved = flops.total / (ms / 1000) / 1e12;
    const caps = engine.backend.capabilities;
    const peak = nominalBf16Peak(caps.deviceName);
    return {
      probe: 'prefill',
      model: o.model,
      backend: engine.backend.name,
      device: caps.deviceName,
      matmul_precision: engine.matmulPrecision,
      batch_invariant: engine.backend.capabilities.batchInvariant === true,
      numerics: caps.numerics ?? 'exact',
      kv_cache_dtype: engine.kvDtype,
      prompt_len: o.promptLen,
      chunk: Math.min(chunk, o.promptLen),
      chunks: Math.ceil(o.promptLen / chunk),
      repeats,
      timing: useDevice ? 'device' : 'wall',
      tokens_per_s: Math.round((o.promptLen / (ms / 1000)) * 100) / 100,
      ms_median: r3(ms),
      ms_min: r3(msMin),
      ms_all: times.map(r3),
      wall_ms_median: r3(median(runs.map((r) => r.wallMs))),
      device_ms_median: oneChunk && runs.every((r) => r.deviceMs !== undefined) ? r3(median(runs.map((r) => r.deviceMs!))) : null,
      // Model FLOPs of one prefill (src/flops.ts): 2·T·P_layers + 2·H·V (the last row's logits), and
      // causal attention Σ_layers 4·n_q·d·Σ_p min(p + 1, window).
      flops_gemm: flops.gemm,
      flops_attention: flops.attention,
      flops_total: flops.total,
      layer_matmul_params: flops.layerMatmulParams,
      achieved_tflops: sig4(achieved),
      // The GEMM rate of op matmul (bf16 weights, rows = M) on a backend of this precision, this run.
      gemm_tflops: sig4(gemm.tflops),
      gemm_matmul_precision: gemm.matmulPrecision,
      gemm_shapes: gemm.shapes.map((s) => ({ m: s.m, k: s.k, n: s.n, tflops: sig4(s.tflops), ms: sig4(s.ms), iters: s.iters })),
      gemm_on: budgeted ? 'scratch backend' : 'engine backend',
      mfu: sig4(achieved / gemm.tflops),
      mfu_best: sig4(flops.total / (msMin / 1000) / 1e12 / gemm.tflops),
      peak_tflops_nominal: peak?.tflops ?? null,
      peak_name: peak?.name ?? null,
      mfu_vs_peak: peak ? sig4(achieved / peak.tflops) : null,
      weight_bytes: engine.weightBytes,
      // Allocator calls during the timed prefills (after the warm-up): the hot path makes none.
      hot_path_allocations: runs.reduce((a, r) => a + r.allocs, 0),
      vram_budget_bytes: o.vramBudget ?? null,
      // --profile: one more prefill, every op timed with events (not one of the timed ones).
      profile,
      notes: runs[0].notes,
    };
  } finally {
    engine.dispose();
  }
}
