import { existsSync, readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { Engine, type WorkerEngineStats, type EngineOptions } from '@nerva/engine';
import { GgufCheckpoint, isGgufPath, loadModelConfig, type ModelSpec } from '@nerva/models';
import { measureH2dBandwidth, syntheticPrompt, withScratchBackend } from '../measure.js';

type MemoryReport = WorkerEngineStats['memory'];

export interface OffloadProbeOptions extends Pick<EngineOptions, 'hostBudget' | 'offloadDir' | 'numerics' | 'hostCompute'> {
  model: string;
  backend: 'cpu' | 'cuda' | 'auto';
  /** Compute-tier bytes the engine may use (weights, staging slots, KV, activations). */
  vramBudget: number;
  promptLen: number;
  newTokens: number;
  /** KV cache bytes (default {@link offloadKvCacheBytes}: one sequence of the probe's length). */
  kvCacheBytes?: number;
  /** A JSON line written by tools/gpu/accelerate_offload.py . */
  accelerateJson?: string;
}

/** Block size the probe's engine uses (the engine's default). */
const BLOCK = 16;

/**
 * KV bytes for one sequence of `maxModelLen` tokens plus two spare blocks, at 4 bytes an element
 * (an upper bound: CUDA keeps bf16 KV). The probe runs one request at a time, so the budget goes
 * to weights rather than to a KV cache sized for a server.
 */
export function offloadKvCacheBytes(spec: ModelSpec, maxModelLen: number): number {
  const perToken = 2 * spec.numLayers * spec.numKvHeads * spec.headDim * 4;
  return (Math.ceil(maxModelLen / BLOCK) + 2) * BLOCK * perToken;
}

const r3 = (v: number): number => Math.round(v * 1000) / 1000;

/** What tools/gpu/accelerate_offload.py wrote, the fields the probe compares. */
interface AccelerateLine {
  tok_s?: number | null;
  budget_bytes?: number;
  model?: string;
  prompt_ids?: number[];
  token_ids?: number[];
  error?: string;
}

function readAccelerate(path: string, notes: string[]): AccelerateLine | undefined {
  if (!existsSync(path)) {
    notes.push(`accelerate baseline ${path} does not exist; no accelerate comparison`);
    return undefined;
  }
  const lines = readFileSync(path, 'utf8').split('\n').filter((l) => l.trim().length > 0);
  try {
    return JSON.parse(lines[lines.length - 1] ?? '') as AccelerateLine;
  } catch {
    notes.push(`${path}: the last line is not JSON; no accelerate comparison`);
    return undefined;
  }
}

/**
 * Batch-1 greedy decode under a VRAM budget (the memory OS streams the weights that do not fit):
 * speed, what moved per token by which path, prefetch, and the fraction of the limit the
 * host-to-device link sets, `h2d rate / streamed bytes per token`, with the rate measured in the
 * same run on the same backend. With an accelerate baseline line (same checkpoint, same budget),
 * the speed ratio to it.
 */
export async function offloadProbe(o: OffloadProbeOptions): Promise<Record<string, unknown>> {
  const notes: string[] = [];
  // A GGUF file carries its config in its metadata.
  const spec = isGgufPath(o.model) ? await ggufSpecOf(o.model) : await loadModelConfig(o.model);
  // The link's rate, measured first on a short-lived backend of the same kind with room for a
  // 256 MiB copy: the engine's own arenas are sized to the budget and left nearly full by design.
  let h2d = o.backend === 'cpu' ? null : ((await withScratchBackend(o.backend, (b) => measureH2dBandwidth(b))) ?? null);
  const maxModelLen = o.promptLen + o.newTokens + 16;
  const kvCacheBytes = o.kvCacheBytes ?? offloadKvCacheBytes(spec, maxModelLen);
  const engine = await Engine.create({
    model: o.model,
    backend: o.backend,
    numerics: o.numerics,
    vramBudget: o.vramBudget,
    hostBudget: o.hostBudget,
    offloadDir: o.offloadDir !== undefined ? resolve(o.offloadDir) : undefined,
    maxNumSeqs: 1,
    maxNumBatchedTokens: Math.max(16, o.promptLen),
    maxModelLen,
    kvCacheBytes,
    hostCompute: o.hostCompute,
  });
  try {
    // Else on the engine's backend, before any request (allocations are refused on the hot path).
    if (h2d === null) h2d = measureH2dBandwidth(engine.backend);
    const prompt = syntheticPrompt(o.promptLen, engine.spec.vocabSize);
    await engine.submit(prompt.slice(0, Math.min(8, o.promptLen)), { maxTokens: 2, temperature: 0, ignoreEos: true }).done;
    const before = engine.memoryReport();
    const out = await engine.submit(prompt, { maxTokens: o.newTokens, temperature: 0, ignoreEos: true }).done;
    const after = engine.memoryReport();
    const s = out.ledger.summary();
    // Every generated token cost one pass over the weights (the prefill pass gives the first).
    const tokens = Math.max(1, out.tokenIds.length);
    const per = (a: number, b: number): number => Math.round((a - b) / tokens);
    const perMs = (a: number, b: number): number => r3((a - b) / tokens);
    const m = (r: MemoryReport) => r.moved;
    const h2dPerToken = per(m(after).h2d.bytes, m(before).h2d.bytes);
    const w = after.weights;

    const cpuPerToken = per(m(after).cpuCompute.bytes, m(before).cpuCompute.bytes);
    // Both paths at once: the streamed bytes split between the link and the host's compute, each at
    // its measured rate (the host MLP's rate is the engine's start-up measurement, taken while
    // copies ran). Undefined when the host computed nothing or no host rate was measured.
    const hostRate = engine.measuredRates?.hostMlpGBs;
    let limitBoth: number | null = null;
    let limit: number | null = null;
    if (h2d === null) {
      notes.push(
        engine.backend.capabilities.deviceKind === 'cpu'
          ? 'CPU backend: weights never cross a host-to-device link, so the limit (h2d rate / streamed bytes per token) is not defined'
          : 'could not allocate a pinned and a compute-tier buffer to time the host-to-device copy; no limit',
      );
    } else if (h2dPerToken <= 0) {
      notes.push('no bytes crossed the host-to-device link during the decode (every weight is hot): the limit is the resident decode roofline (nerva-bench decode)');
    } else {
      limit = h2d.bytesPerS / h2dPerToken;
      if (cpuPerToken > 0 && hostRate !== undefined && hostRate > 0) limitBoth = (h2d.bytesPerS + hostRate * 1e9) / (h2dPerToken + cpuPerToken);
      else if (cpuPerToken > 0)
        notes.push('the host computed part of each streamed layer at a forced split (no start-up rates measured): the limit is the link alone, for this split');
      if (after.moved.diskRead.bytes > before.moved.diskRead.bytes) notes.push('disk reads also feed the streamed blocks; the limit counts the host-to-device link alone');
    }
    const tokS = s.decode_tokens_per_s;
    const r: Record<string, unknown> = {
      probe: 'offload',
      model: o.model,
      backend: engine.backend.name,
      device: engine.backend.capabilities.deviceName,
      numerics: engine.backend.capabilities.numerics ?? 'exact',
      vram_budget_bytes: o.vramBudget,
      host_budget_bytes: o.hostBudget ?? null,
      offload_dir: o.offloadDir ?? null,
      kv_cache_bytes: engine.kvCacheBytes,
      mode: after.mode,
      fabric: after.fabric,
      prompt_len: o.promptLen,
      new_tokens: out.tokenIds.length,
      tok_s: tokS,
      ms_per_token_p50: s.ms_per_token_p50,
      ms_per_token_p99: s.ms_per_token_p99,
      // Deltas of the memory OS counters over the timed request, per generated token.
      h2d_bytes_per_token: h2dPerToken,
      disk_read_bytes_per_token: per(m(after).diskRead.bytes, m(before).diskRead.bytes),
      cpu_compute_bytes_per_token: cpuPerToken,
      h2d_ms_per_token: perMs(m(after).h2d.ms, m(before).h2d.ms),
      disk_read_ms_per_token: perMs(m(after).diskRead.ms, m(before).diskRead.ms),
      cpu_compute_ms_per_token: perMs(m(after).cpuCompute.ms, m(before).cpuCompute.ms),
      stall_ms_per_token: perMs(after.prefetch.stallMs, before.prefetch.stallMs),
      prefetch_hits: after.prefetch.hits - before.prefetch.hits,
      prefetch_stalls: after.prefetch.stalls - before.prefetch.stalls,
      streamed_bytes_per_pass: after.streamedBytesPerPass,
      weight_bytes: w.totalBytes,
      hot_bytes: w.hotBytes,
      streamed_bytes: w.streamedBytes,
      disk_bytes: w.diskBytes,
      hot_blocks: w.hotBlocks,
      streamed_blocks: w.streamedBlocks,
      disk_blocks: w.diskBlocks,
      slots: w.slots,
      h2d_gbs: h2d === null ? null : Math.round(h2d.bytesPerS / 1e7) / 100,
      h2d_copy_bytes: h2d?.bytes ?? null,
      host_compute: o.hostCompute ?? 'auto',
      host_mlp_gbs: hostRate === undefined ? null : Math.round(hostRate * 100) / 100,
      // The link alone: h2d rate / bytes it carried per token.
      limit_h2d_tok_s: limit === null ? null : Math.round(limit * 100) / 100,
      // The limit: with compute near data, both paths at their measured rates at once; else the link's.
      limit_tok_s: limitBoth !== null ? Math.round(limitBoth * 100) / 100 : limit === null ? null : Math.round(limit * 100) / 100,
      fraction_of_limit: limitBoth !== null ? r3(tokS / limitBoth) : limit === null ? null : r3(tokS / limit),
      // How the pinned arena (the host tier the host computes from) was allocated, CUDA only.
      pinned_pages: (engine.backend as { info?: () => { pinnedPages?: string } }).info?.().pinnedPages ?? null,
      hot_path_allocations: s.hot_path_allocations,
      syncs_per_token: s.syncs_per_decode_token,
      token_ids: out.tokenIds,
    };
    const accPath = o.accelerateJson;
    if (accPath) {
      const acc = readAccelerate(accPath, notes);
      if (acc) {
        const accTok = typeof acc.tok_s === 'number' && acc.tok_s > 0 ? acc.tok_s : null;
        r.accelerate_tok_s = accTok;
        r.speedup_vs_accelerate = accTok === null ? null : Math.round((tokS / accTok) * 100) / 100;
        if (acc.error) notes.push(`accelerate baseline: ${acc.error}`);
        if (acc.budget_bytes !== undefined && acc.budget_bytes !== o.vramBudget) notes.push(`accelerate ran with a budget of ${acc.budget_bytes} bytes, not ${o.vramBudget}`);
        if (acc.model !== undefined && resolve(acc.model) !== resolve(o.model)) notes.push(`accelerate ran on ${acc.model}, not ${o.model}`);
        if (acc.prompt_ids !== undefined && acc.token_ids !== undefined) {
          const same = acc.prompt_ids.length === prompt.length && acc.prompt_ids.every((t, i) => t === prompt[i]);
          r.accelerate_same_prompt = same;
          if (same) {
            let k = 0;
            while (k < out.tokenIds.length && k < acc.token_ids.length && out.tokenIds[k] === acc.token_ids[k]) k++;
            // Greedy tokens both runs agree on from the start (transformers bf16 vs NERVA's numerics).
            r.accelerate_agreeing_tokens = k;
          }
        }
      }
    }
    r.notes = [...s.notes, ...after.notes.filter((n) => !s.notes.includes(n)), ...notes];
    return r;
  } finally {
    engine.dispose();
  }
}

async function ggufSpecOf(path: string): Promise<ModelSpec> {
  const c = await GgufCheckpoint.open(path);
  await c.close();
  return c.spec;
}
