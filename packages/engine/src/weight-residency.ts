import type { DeviceBackend, Tier } from '@nerva/core';
import { DTYPE_BYTES } from '@nerva/core';
import { fmt, importanceKey, type MemoryReport, checkOffloadDir, planResidency, type ResidencyPlan, type TierUsage, WeightPager, WorkingSetTooLargeError } from '@nerva/memos';
import type { ModelSpec, WeightStore } from '@nerva/models';
import { type HostSplit, type KvCacheDtype, kvDtypeOf, type ModelWeights, weightBlocks, weightSlots } from './model-weights.js';

/**
 * How the deployment mode is chosen (MemoryReport.deployment). Every mode computes the same model
 * (exact, or exact with respect to the dequantized weights of a quantized file): layers are never
 * skipped, which would change the output.
 */
export const DEPLOYMENT_RULE =
  'resident when every weight fits the VRAM budget beside the KV cache and activations (or no budget is set); else paged: ' +
  'the most important layers stay hot and the rest stream from host memory, and from disk past the host budget; ' +
  '+quant where the checkpoint is block-quantized (GGUF), held and streamed in its blocks, so more of it fits; no layer is ever skipped';

/** What the memory OS was asked for (EngineOptions' residency fields). */
export interface ResidencyOptions {
  vramBudget?: number;
  hostBudget?: number;
  offloadDir?: string;
}

/** The shapes the runner is built with, known before any weight is placed. */
export interface RunnerShape {
  maxRows: number;
  maxNumSeqs: number;
  activationBytes: number;
  kvBytesPerToken: number;
}

/** Reject malformed residency options before anything is created. */
export function validateResidency(o: ResidencyOptions): void {
  for (const [k, v] of [
    ['vramBudget', o.vramBudget],
    ['hostBudget', o.hostBudget],
  ] as const) {
    if (v !== undefined && (!Number.isSafeInteger(v) || v <= 0)) throw new RangeError(`${k} must be a positive whole number of bytes, got ${String(v)}`);
  }
  const hc = (o as { hostCompute?: unknown }).hostCompute;
  if (hc !== undefined && hc !== 'auto' && hc !== 'off' && !(typeof hc === 'number' && hc > 0 && hc < 1)) {
    throw new RangeError(`hostCompute must be 'auto', 'off' or a fraction in (0, 1), got ${String(hc)}`);
  }
  if (o.offloadDir !== undefined) {
    if (typeof o.offloadDir !== 'string' || o.offloadDir === '') throw new RangeError(`offloadDir must be a directory path, got ${String(o.offloadDir)}`);
    // Checked up front whether or not a block ends up on disk: a bad dir is a configuration error.
    checkOffloadDir(o.offloadDir);
  }
}

/**
 * Place the weights for a budget: plan hot and streamed blocks from what the compute tier has
 * left after the KV cache and activations, and create the pager the upload stores streamed
 * blocks through. Undefined when everything fits (resident).
 */
export function placeWeights(
  backend: DeviceBackend,
  spec: ModelSpec,
  ckpt: WeightStore,
  kvDefault: number,
  shape: RunnerShape,
  o: ResidencyOptions,
  reservedBytes = 0,
  /** Compute near data: given a streamed layer's attention and MLP bytes, the MLP channels the host computes. */
  splitFor?: (attnBytes: number, mlpBytes: number) => number,
  /** Per-layer importance (the calibrated profile): the most important layers stay hot first. */
  importance?: readonly number[],
  /** The smallest KV cache the engine accepts when `kvBytes` was its own default (not the user's). */
  kvFloor?: number,
): { pager?: WeightPager; split?: HostSplit; kvBytes: number } | undefined {
  if (o.vramBudget === undefined && o.hostBudget === undefined) return undefined;
  const tier = backend.capabilities.computeTier;
  const capacity = backend.capabilities.memory[tier] ?? 0;
  // Arena sub-allocations round up to 256 bytes: room for that on every buffer the engine makes.
  const margin = 256 * (16 * spec.numLayers + 64);
  // A default KV cache shrinks to its floor before the weights are refused.
  const kvChoices = kvFloor !== undefined && kvFloor < kvDefault ? [kvDefault, kvFloor] : [kvDefault];
  let kvBytes = kvDefault;
  let deviceBytes = 0;
  const hostTier: Tier = 'pinned';
  const hostCap = backend.capabilities.memory[hostTier] ?? Number.POSITIVE_INFINITY;
  // Without a host budget, the host tier less what the runner keeps there (the token ring, meta).
  const hostBytes = o.hostBudget ?? Math.max(0, hostCap - 64 * 2 ** 20);
  let { blocks, layout } = weightBlocks(backend, spec, ckpt, importance);
  let fixed = 0;
  let largest = blocks.reduce((m, b) => (b.order !== undefined ? Math.max(m, b.bytes) : m), 0);
  // With a disk tier, blocks read from disk pass through host bounce buffers, one slot's worth
  // each: the host budget holds them too (reserved up front, so the minimum budget is one number).
  const plan = (slots: number): ResidencyPlan =>
    planResidency({ blocks, deviceBytes, hostBytes: o.offloadDir !== undefined && o.hostBudget !== undefined ? Math.max(0, hostBytes - slots * largest) : hostBytes, slots, disk: o.offloadDir !== undefined });
  const attempt = (kv: number): ResidencyPlan => {
    kvBytes = kv;
    deviceBytes = Math.max(0, capacity - kv - shape.activationBytes - margin);
    fixed = kv + shape.activationBytes + margin + reservedBytes;
    let p: ResidencyPlan;
    try {
      p = plan(2);
    } catch (e) {
      if (!(e instanceof WorkingSetTooLargeError) || e.budgetBytes !== deviceBytes) throw e;
      try {
        // One slot still runs, exactly, without overlapping a layer's load with the layer before.
        p = plan(1);
        p.notes.push('one staging slot: loads do not overlap compute (a budget one layer larger allows two)');
      } catch (e1) {
        if (!(e1 instanceof WorkingSetTooLargeError) || e1.budgetBytes !== deviceBytes) throw e1;
        // Say what the whole budget must be: the smallest weight working set plus KV, activations, workspaces.
        // A backend with reserved workspaces (CUDA) carves its arena in whole MiB: round up to one,
        // so this exact figure is accepted.
        const unit = reservedBytes > 0 ? 2 ** 20 : 1;
        throw new WorkingSetTooLargeError(
          o.vramBudget ?? capacity,
          Math.ceil((e1.minimumBytes + fixed) / unit) * unit,
          `weights need at least ${fmt(e1.minimumBytes)} (always-hot tensors and one staging slot), KV cache ${fmt(kvBytes)}, activations ${fmt(shape.activationBytes)}, workspaces and margin ${fmt(fixed - kvBytes - shape.activationBytes)}`,
        );
      }
    }
    return p;
  };
  let p: ResidencyPlan;
  try {
    p = attempt(kvChoices[0]);
  } catch (e) {
    if (!(e instanceof WorkingSetTooLargeError) || kvChoices.length === 1) throw e;
    p = attempt(kvChoices[1]);
  }
  if (p.mode === 'resident') return { kvBytes };
  let split: HostSplit | undefined;
  if (splitFor && p.diskBytes === 0) {
    const mlp = layout.filter((t) => t.name === 'gateUp' || t.name === 'down').reduce((t, x) => t + x.length * DTYPE_BYTES[x.dtype], 0);
    const all = layout.reduce((t, x) => t + x.length * DTYPE_BYTES[x.dtype], 0);
    const inter = splitFor(all - mlp, mlp);
    if (inter > 0) {
      // Re-plan with the smaller streamed blocks: the ring shrinks, more layers may stay hot.
      const before = p;
      ({ blocks, layout } = weightBlocks(backend, spec, ckpt, importance, inter));
      largest = blocks.reduce((m, b) => (b.order !== undefined ? Math.max(m, b.bytes) : m), 0);
      try {
        p = plan(before.slots);
        split = { inter, tier: hostTier };
      } catch {
        // The split plan needs what the unsplit one did not (host room for the slices): keep the unsplit one.
        p = before;
        ({ blocks, layout } = weightBlocks(backend, spec, ckpt, importance));
      }
      if (p.mode === 'resident') return { kvBytes };
    }
  }
  const planDone = p;
  if (split) planDone.notes.push(`compute near data: the host computes ${split.inter} of ${spec.intermediateSize} MLP channels of each streamed layer`);
  const pager = new WeightPager({ backend, plan: planDone, layout, hostTier, ...(o.offloadDir !== undefined ? { offloadDir: o.offloadDir } : {}) });
  return { pager, kvBytes, ...(split ? { split } : {}) };
}

/** The importance-profile key of a loaded checkpoint: its spec, tensor table and norm weights' bytes. */
export async function checkpointImportanceKey(spec: ModelSpec, ckpt: WeightStore): Promise<string> {
  const names = ckpt.names();
  const samples: Uint8Array[] = [];
  const slots = weightSlots(spec);
  for (const n of [slots.finalNorm.name, slots.layers[0].inputNorm.name]) if (ckpt.has(n)) samples.push(await ckpt.readRaw(n));
  return importanceKey({ config: spec, tensors: names.map((n) => ({ name: n, dtype: ckpt.info(n).dtype, shape: ckpt.info(n).shape })), samples });
}

/** KV bytes per token of the model on this backend (every layer's keys and values). */
export function kvBytesPerToken(backend: DeviceBackend, spec: ModelSpec, kvDtype: KvCacheDtype = kvDtypeOf(backend)): number {
  return 2 * spec.numLayers * spec.numKvHeads * spec.headDim * DTYPE_BYTES[kvDtype];
}

/** The memory OS report for an engine's weights, KV cache and backend. */
export function memoryReport(
  backend: DeviceBackend,
  weights: ModelWeights,
  kvBytes: number,
  budgets: ResidencyOptions,
  host: { computeBytes: number; readBytes: number } = { computeBytes: 0, readBytes: 0 },
): MemoryReport {
  const caps = backend.capabilities;
  const stats = backend.stats();
  const pager = weights.pager;
  const plan = pager?.plan;
  const ps = pager?.stats();
  const computeTier = caps.computeTier;
  const staging = pager?.slotBytes ?? 0;
  // Host tier: weights held there (streamed blocks' copies, a mapped embedding, host slices) and the
  // disk tier's bounce buffers.
  const hostWeights = weights.bytes - weights.hotBytes - (plan?.diskBytes ?? 0);
  const bounce = pager ? pager.hostBytes - ((plan?.streamedBytes ?? 0) - (plan?.diskBytes ?? 0)) : 0;
  const tiers: TierUsage[] = [
    {
      tier: computeTier,
      budgetBytes: budgets.vramBudget ?? caps.memory[computeTier] ?? 0,
      weightBytes: weights.hotBytes,
      stagingBytes: staging,
      kvBytes,
      otherBytes: Math.max(0, stats.liveBytes - weights.hotBytes - staging - kvBytes - (computeTier === 'pinned' ? 0 : hostWeights + Math.max(0, bounce))),
    },
  ];
  if (plan) {
    tiers.push({ tier: 'pinned', budgetBytes: budgets.hostBudget ?? caps.memory.pinned ?? 0, weightBytes: hostWeights, stagingBytes: Math.max(0, bounce), kvBytes: 0, otherBytes: 0 });
    if (plan.diskBytes > 0) tiers.push({ tier: 'disk', budgetBytes: plan.diskBytes, weightBytes: plan.diskBytes, stagingBytes: 0, kvBytes: 0, otherBytes: 0 });
  }
  const streamedBlocks = plan?.streamed.length ?? 0;
  const quant = weights.format?.exact === false ? '+quant' : '';
  const diskBlocks = plan ? plan.streamed.filter((id) => plan.placements.get(id)?.home === 'disk').length : 0;
  return {
    fabric: caps.fabric,
    mode: plan ? 'paged' : 'resident',
    deployment: { mode: plan ? `paged${quant}` : `resident${quant}`, rule: DEPLOYMENT_RULE },
    tiers,
    weights: {
      totalBytes: weights.bytes,
      hotBytes: weights.hotBytes,
      streamedBytes: plan?.streamedBytes ?? 0,
      diskBytes: plan?.diskBytes ?? 0,
      // The planner's blocks: one per layer, the embedding, the final norm, and an untied LM head.
      hotBlocks: plan
        ? [...plan.placements.values()].filter((p) => p.placement === 'hot').length
        : weights.layers.length + 2 + (weights.lmHead !== undefined && weights.lmHead !== weights.embed ? 1 : 0),
      streamedBlocks,
      diskBlocks,
      slots: plan?.slots ?? 0,
      slotBytes: plan?.slotBytes ?? 0,
      streamedIds: [...(plan?.streamed ?? [])],
      format: weights.format,
    },
    moved: {
      // Loads into staging slots, plus host slices the device read in place (prefill).
      h2d: { bytes: (ps?.h2dBytes ?? 0) + host.readBytes, ms: 0 },
      diskRead: { bytes: ps?.diskReadBytes ?? 0, ms: ps?.diskReadMs ?? 0 },
      // The host MLP's time alone where the backend splits it from host attention (tiered KV's).
      cpuCompute: { bytes: host.computeBytes, ms: stats.hostComputeMsByOp?.mlp_slice ?? stats.hostComputeMs ?? 0 },
    },
    streamedBytesPerPass: plan?.streamedBytes ?? 0,
    prefetch: { hits: ps?.hits ?? 0, stalls: ps?.stalls ?? 0, stallMs: 0 },
    notes: plan?.notes ?? [],
  };
}

