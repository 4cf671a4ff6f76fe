/**
 * Where pipeline stages run: the pipeline options checked (`pipelineRequest`), the layers split
 * (balanced by weight bytes, or under VRAM budgets so each stage's share fits its own), each
 * stage's backend made, its weights uploaded, the NCCL communicator made when stages sit on
 * separate GPUs (`prepareStages`). `StagePipeline` (pipeline.ts) runs what this places.
 */
import type { DeviceBackend } from '@nerva/core';
import type { DeviceResidency } from '@nerva/memos';
import { DTYPE_BYTES, NervaError } from '@nerva/core';
import type { ModelSpec, WeightStore } from '@nerva/models';
import { type BackendOptions, selectBackend } from '../backend-select.js';
import { layerLayouts, type ModelWeights, type UploadProgress, uploadWeights } from '../model-weights.js';
import type { NcclPointToPoint } from './links.js';
import { StageResources } from './stage-resources.js';
import { planStages, type StagePlan } from './plan.js';

/** A pipeline option is malformed, or asks for what this machine cannot give. */
export class PipelineConfigError extends NervaError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('PIPELINE_CONFIG', message, options);
  }
}

/** The pipeline fields of EngineOptions. */
export interface PipelineOptions {
  pipelineParallel?: number;
  allowSingleDeviceStages?: boolean;
  stageDevices?: number[];
  pipelineMicroBatches?: number;
  vramBudget?: number;
  stageVramBudgets?: number[];
  hostBudget?: number;
}

/** Validated pipeline options; undefined from `pipelineRequest` when the model runs as one stage. */
export interface PipelineRequest {
  stages: number;
  allowSingleDevice: boolean;
  devices?: number[];
  microBatches?: number;
  /** Each stage's VRAM budget (bytes), when one was given: the stages are placed to fit them, resident. */
  budgets?: number[];
}

/**
 * Check the pipeline options before anything is loaded: a stage count of at least 1, device
 * ordinals that agree with it, a micro-batch count of at least 1, VRAM budgets (one for every
 * stage, or a list of one per stage) and no host budget with more than one stage (paged weights
 * run on a single stage). Undefined for one stage.
 */
export function pipelineRequest(o: PipelineOptions): PipelineRequest | undefined {
  const n = o.pipelineParallel;
  if (n !== undefined && (typeof n !== 'number' || !Number.isInteger(n) || n < 1))
    throw new PipelineConfigError(`pipelineParallel must be a positive integer (the number of pipeline stages), got ${String(n)}`);
  const devices = o.stageDevices;
  if (devices !== undefined) {
    if (!Array.isArray(devices) || devices.length === 0 || devices.some((d) => typeof d !== 'number' || !Number.isInteger(d) || d < 0))
      throw new PipelineConfigError(`stageDevices must list one device ordinal (a non-negative integer) per stage, got ${JSON.stringify(devices)}`);
    if (n !== undefined && devices.length !== n) throw new PipelineConfigError(`stageDevices lists ${devices.length} device(s) for pipelineParallel ${n}: give one per stage`);
  }
  const mb = o.pipelineMicroBatches;
  if (mb !== undefined && (typeof mb !== 'number' || !Number.isInteger(mb) || mb < 1))
    throw new PipelineConfigError(`pipelineMicroBatches must be a positive integer, got ${String(mb)}`);
  const stages = n ?? devices?.length ?? 1;
  const list = o.stageVramBudgets;
  if (list !== undefined) {
    if (!Array.isArray(list) || list.length === 0 || list.some((b) => typeof b !== 'number' || !Number.isSafeInteger(b) || b <= 0))
      throw new PipelineConfigError(`stageVramBudgets must list one budget (a positive byte count) per stage, got ${JSON.stringify(list)}`);
    if (o.vramBudget !== undefined) throw new PipelineConfigError('give vramBudget (the same budget for every stage) or stageVramBudgets (one per stage), not both');
    if (list.length !== stages)
      throw new PipelineConfigError(`stageVramBudgets lists ${list.length} budget(s) for ${stages} pipeline stage(s): give one per stage${stages === 1 ? ' (and pipelineParallel for more than one stage)' : ''}`);
  }
  if (stages === 1) return undefined;
  if (o.hostBudget !== undefined)
    throw new PipelineConfigError(`pipelineParallel ${stages} with a host budget is not supported yet: paged weights (hostBudget) run on a single stage; with VRAM budgets alone the stages hold the model resident`);
  const budgets = list !== undefined ? [...list] : o.vramBudget !== undefined ? new Array<number>(stages).fill(o.vramBudget) : undefined;
  return {
    stages,
    allowSingleDevice: o.allowSingleDeviceStages === true,
    ...(devices ? { devices: [...devices] } : {}),
    ...(mb !== undefined ? { microBatches: mb } : {}),
    ...(budgets ? { budgets } : {}),
  };
}

/**
 * The VRAM budget of the engine's own backend (stage 0's) under stage budgets: the budgets of the
 * stages that share its device (every stage with allowSingleDeviceStages and no stageDevices),
 * else stage 0's. Undefined without budgets.
 */
export function primaryStageBudget(req: PipelineRequest | undefined, backendChoice: unknown): number | undefined {
  if (!req?.budgets) return undefined;
  const sum = (keep: (s: number) => boolean) => req.budgets!.reduce((t, b, s) => (keep(s) ? t + b : t), 0);
  if (req.devices) return sum((s) => req.devices![s] === req.devices![0]);
  // Stages share one backend on one GPU, or on the CPU without stageDevices.
  if (req.allowSingleDevice || backendChoice === 'cpu') return sum(() => true);
  return req.budgets[0];
}

/** One stage as the pipeline runs it. */
export interface PipelineStage {
  backend: DeviceBackend;
  weights: ModelWeights;
  firstLayer: number;
  endLayer: number;
  /** The stage's device ordinal (CUDA) or CPU backend ordinal, when stages sit on backends of their own. */
  device?: number;
  /** Its NCCL rank, when stages sit on separate GPUs. */
  rank?: number;
}

/** What `prepareStages` made: the stages with their weights, and who frees what. */
export interface PreparedStages {
  plan: StagePlan;
  stages: PipelineStage[];
  /** Every stage on the engine's own backend object. */
  shared: boolean;
  microBatches: number;
  /** Bytes for the whole KV cache (all layers) when the stage backends decided it, else undefined. */
  kvBytes?: number;
  /** Weight bytes over every stage (an embedding a tied head needs on two backends counts twice). */
  weightBytes: number;
  /** Per stage, under VRAM budgets: the budget, what the stage holds besides KV, and its KV share (bytes). */
  budgets?: { budget: number; heldBytes: number; kvBytes: number }[];
  nccl?: NcclPointToPoint;
  notes: string[];
  /** Free what was made here: stage weights on backends other than the engine's, the communicator, those backends. */
  dispose(): void;
}

export interface PrepareStagesArgs {
  request: PipelineRequest;
  /** The engine's backend: stage 0 runs on it. */
  primary: DeviceBackend;
  spec: ModelSpec;
  ckpt: WeightStore;
  /** Options for backends made for other stages (numerics, arena size). */
  backendOptions: BackendOptions;
  /** KV bytes the options fixed (kvCacheBytes, the CPU default); else sized from what each backend has free. */
  kvPlanned: number | undefined;
  /** The engine's rule for the KV cache once weights are in: bytes for a backend with `activationBytes` of runners. */
  kvAfterUpload: (backend: DeviceBackend, activationBytes: number) => number;
  activationBytes: number;
  /** KV bytes a token takes over all layers (placing stages under budgets). */
  kvBytesPerToken: number;
  /** The runners' row and sequence limits: the links' staging and the logits brought home are sized by them. */
  maxRows: number;
  maxNumSeqs: number;
  /** Bytes a backend made under a budget sets aside before its arena (the CUDA workspaces; 0 on the CPU). */
  reservedBytes: number;
  /** The KV bytes were fixed by the user (kvCacheBytes): under budgets they must fit, not shrink. */
  kvExplicit: boolean;
  onProgress?: (p: UploadProgress) => void;
}

/** The fewest tokens of KV a stage must hold beside its weights (the engine's floor under a budget). */
export const KV_FLOOR_TOKENS = 64;
export const MiB = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;

/** How stages fit their VRAM budgets: the split, and the KV cache bytes (all layers) the budgets leave. */
interface BudgetedPlan {
  plan: StagePlan;
  kvBytes: number;
  /** Per stage: its budget, what it holds besides KV (weights, activations), and its share of the KV cache. */
  stages: { budget: number; heldBytes: number; kvBytes: number }[];
}

/**
 * Split the layers so every stage's weights, activations and KV share fit its budget (less what its
 * backend reserves), the load (bytes over budget) as even as it can be: a stage with a smaller
 * budget takes fewer layers. The KV cache is what the tightest stage leaves, spread over the
 * layers (or the user's kvCacheBytes, checked). Throws PipelineConfigError naming the stage and
 * its bytes when the model does not fit.
 */
function planBudgetedStages(a: PrepareStagesArgs, budgets: readonly number[], layerBytes: readonly number[], embedBytes: number, kvDefault: number | undefined): BudgetedPlan {
  const { spec } = a;
  const n = budgets.length;
  const L = spec.numLayers;
  const kvLayerToken = a.kvBytesPerToken / L;
  const capacity = budgets.map((b) => b - a.reservedBytes);
  // Besides its runner's activations: the embedding on stage 0; a link's staging rows at each end
  // of a handoff; on separate backends the logits brought home to stage 0 and the last stage's
  // gathered micro-batch rows.
  const rowsBytes = a.maxRows * spec.hiddenSize * 4;
  const fixed = budgets.map(
    (_, s) => a.activationBytes + (s === 0 ? embedBytes + a.maxNumSeqs * spec.vocabSize * 4 : 0) + (s > 0 ? rowsBytes : 0) + (s + 1 < n ? rowsBytes : 0) + (s === n - 1 ? rowsBytes : 0),
  );
  const bad = capacity.findIndex((c, s) => c <= fixed[s]);
  if (bad >= 0)
    throw new PipelineConfigError(
      `stage ${bad}'s VRAM budget (${MiB(budgets[bad])}) does not cover its fixed buffers: ${MiB(fixed[bad])} of activations and staging${bad === 0 ? ' and the embedding' : ''}${a.reservedBytes > 0 ? ` plus ${MiB(a.reservedBytes)} of workspaces` : ''}`,
    );
  // Each layer carries its KV floor, so the split leaves every stage room for it.
  const withFloor = layerBytes.map((b) => b + KV_FLOOR_TOKENS * kvLayerToken);
  const plan = planStages(L, n, withFloor, { capacity, fixed });
  const weightsOf = (r: { firstLayer: number; endLayer: number }) => layerBytes.slice(r.firstLayer, r.endLayer).reduce((x, y) => x + y, 0);
  if (plan.maxLoad > 1) {
    const worst = plan.stages.reduce((w, r) => ((fixed[r.stage] + r.bytes) / capacity[r.stage] > (fixed[w.stage] + w.bytes) / capacity[w.stage] ? r : w));
    const s = worst.stage;
    const total = layerBytes.reduce((x, y) => x + y, 0) + embedBytes;
    throw new PipelineConfigError(
      `the model does not fit ${n} stages under VRAM budgets of ${budgets.map(MiB).join(', ')}: stage ${s} (layers ${worst.firstLayer}-${worst.endLayer - 1}) needs ${MiB(fixed[s] + worst.bytes)} ` +
        `(weights ${MiB(weightsOf(worst) + (s === 0 ? embedBytes : 0))}, activations and staging ${MiB(fixed[s] - (s === 0 ? embedBytes : 0))}, KV for ${KV_FLOOR_TOKENS} tokens ${MiB(KV_FLOOR_TOKENS * kvLayerToken * worst.layers)}) ` +
        `but its budget leaves ${MiB(capacity[s])}${a.reservedBytes > 0 ? ` (${MiB(a.reservedBytes)} of workspaces set aside)` : ''}; the weights are ${MiB(total)} in all: give more stages or larger budgets, or run one stage under vramBudget (the memory OS streams what does not fit)`,
    );
  }
  // KV: each stage holds its layers' share; the tightest stage decides the whole cache.
  const room = plan.stages.map((r) => capacity[r.stage] - fixed[r.stage] - weightsOf(r));
  const fits = Math.floor(Math.min(...plan.stages.map((r, i) => (room[i] * L) / r.layers)));
  let kvBytes: number;
  if (a.kvExplicit) {
    kvBytes = a.kvPlanned!;
    const over = plan.stages.findIndex((r, i) => (kvBytes * r.layers) / L > room[i]);
    if (over >= 0)
      throw new PipelineConfigError(
        `kvCacheBytes ${MiB(kvBytes)} does not fit the VRAM budgets: stage ${over} would hold ${MiB((kvBytes * plan.stages[over].layers) / L)} of it beside ${MiB(budgets[over] - room[over])} of weights, activations and workspaces, over its ${MiB(budgets[over])}; at most ${MiB(fits)} fits`,
      );
  } else {
    // What the budgets leave, less a slack for the allocator's alignment, at most the default.
    kvBytes = Math.floor(Math.min(0.95 * fits, kvDefault ?? Infinity));
  }
  return { plan, kvBytes, stages: plan.stages.map((r, i) => ({ budget: budgets[i], heldBytes: budgets[i] - room[i], kvBytes: Math.floor((kvBytes * r.layers) / L) })) };
}

/** A decoder layer's weight bytes; the LM head counts toward the last layer (its stage runs it every pass). */
function layerWeights(backend: DeviceBackend, spec: ModelSpec, ckpt: WeightStore): number[] {
  const bytes = layerLayouts(backend, spec, ckpt).map((t) => t.reduce((s, x) => s + x.length * DTYPE_BYTES[x.dtype], 0));
  const dt = backend.capabilities.weightDtype;
  bytes[bytes.length - 1] += spec.vocabSize * spec.hiddenSize * DTYPE_BYTES[dt];
  return bytes;
}

/**
 * Place the stages: split the layers (balanced by weight bytes, `planStages`), decide each
 * stage's backend (the engine's, or one per device for `stageDevices` or for N visible GPUs),
 * check what the machine allows, upload each backend's share of the weights, and make the NCCL
 * communicator when stages sit on separate GPUs.
 */
export async function prepareStages(a: PrepareStagesArgs): Promise<PreparedStages> {
  const { request: req, primary, spec } = a;
  const n = req.stages;
  if (n > spec.numLayers)
    throw new PipelineConfigError(`pipelineParallel ${n} exceeds the model's ${spec.numLayers} decoder layers: every stage needs at least one layer`);
  const kind = primary.capabilities.deviceKind;
  const notes: string[] = [];
  let devices = req.devices;
  if (kind === 'cpu') {
    // Any number of stages: they share host memory. Distinct ordinals ask for a CPU backend each.
    if (!devices) notes.push(`pipeline on the CPU backend: ${n} stages share one backend and its host memory (in-process links)`);
  } else {
    const count = primary.capabilities.deviceCount;
    if (devices) {
      for (const d of devices) if (d >= count) throw new PipelineConfigError(`stageDevices names device ${d}, but ${count} ${kind} device(s) are visible`);
      const dup = devices.find((d, i) => devices!.indexOf(d) !== i);
      if (dup !== undefined && !req.allowSingleDevice)
        throw new PipelineConfigError(`stageDevices places two stages on device ${dup}; stages that share a device need allowSingleDeviceStages (--allow-single-device-stages)`);
    } else if (!req.allowSingleDevice) {
      if (count < n)
        throw new PipelineConfigError(
          `pipelineParallel ${n} needs ${n} GPUs, but ${count} ${count === 1 ? 'is' : 'are'} visible; --allow-single-device-stages (allowSingleDeviceStages) places every stage on one GPU, to test the pipeline`,
        );
      devices = Array.from({ length: n }, (_, i) => i);
    }
    if (!devices) notes.push(`pipeline stages share one GPU (allowSingleDeviceStages): device-copy links; a test of the pipeline, not a speedup`);
  }
  const layerBytes = layerWeights(primary, spec, a.ckpt);
  const embedBytes = spec.vocabSize * spec.hiddenSize * DTYPE_BYTES[primary.capabilities.weightDtype];
  const kvDefault = a.kvPlanned ?? Math.min(16 * 2 ** 30, (primary.capabilities.memory[primary.capabilities.computeTier] ?? Infinity) * 0.6);
  const budgeted = req.budgets ? planBudgetedStages(a, req.budgets, layerBytes, embedBytes, kvDefault) : undefined;
  const plan = budgeted?.plan ?? planStages(spec.numLayers, n, layerBytes);

  // One backend per distinct device; the engine's backend is stage 0's.
  const byDevice = new Map<number, DeviceBackend>();
  const backends: DeviceBackend[] = [];
  // The engine frees stage 0's weights once it has them; until then (a failure here) they are ours.
  const res = new StageResources(primary);
  try {
    if (devices) byDevice.set(devices[0], primary);
    for (let s = 0; s < n; s++) {
      if (!devices) {
        backends.push(primary);
        continue;
      }
      let b = byDevice.get(devices[s]);
      if (!b) {
        const choice = kind === 'cpu' ? 'cpu' : 'cuda';
        // Under budgets a device's backend gets the budgets of its stages (on CUDA its arena).
        const budget = req.budgets ? req.budgets.reduce((t, x, i) => (devices![i] === devices![s] ? t + x : t), 0) : undefined;
        b = res.own((await selectBackend(choice, { ...a.backendOptions, device: devices[s], ...(budget !== undefined ? { deviceBudgetBytes: budget } : {}) })).backend);
        byDevice.set(devices[s], b);
      }
      backends.push(b);
    }
    const distinct = [...new Set(backends)];
    const shared = distinct.length === 1;
    // Weights: the whole model on a shared backend, else each backend's share.
    const weights = new Map<DeviceBackend, ModelWeights>();
    let weightBytes = 0;
    for (const b of distinct) {
      const mine = plan.stages.filter((_, s) => backends[s] === b);
      const part = shared ? undefined : { firstLayer: Math.min(...mine.map((r) => r.firstLayer)), endLayer: Math.max(...mine.map((r) => r.endLayer)) };
      const w = await uploadWeights(b, spec, a.ckpt, a.onProgress, undefined, part);
      res.uploaded(b, w);
      weights.set(b, w);
      weightBytes += w.bytes;
    }
    if (!shared && kind !== 'cpu') {
      // Separate GPUs: one NCCL communicator over them, rank i on distinct[i].
      const comm = await res.communicate(kind, distinct, (e) => new PipelineConfigError(`pipeline stages on GPUs ${[...byDevice.keys()].join(', ')} need NCCL: ${e.message}`, { cause: e }));
      notes.push(`pipeline links: ${comm.description}`);
    }
    const microBatches = req.microBatches ?? (shared ? 1 : n);
    const stages: PipelineStage[] = plan.stages.map((r, s) => ({
      backend: backends[s],
      weights: weights.get(backends[s])!,
      firstLayer: r.firstLayer,
      endLayer: r.endLayer,
      ...(devices ? { device: devices[s] } : {}),
      ...(!shared ? { rank: distinct.indexOf(backends[s]) } : {}),
    }));
    let kvBytes = budgeted?.kvBytes ?? a.kvPlanned;
    if (kvBytes === undefined) {
      // Per backend, what it has free after its weights (its runners' activations set aside),
      // scaled to the whole model by the share of layers whose KV it holds; the tightest one wins.
      kvBytes = Infinity;
      for (const b of distinct) {
        const mine = plan.stages.filter((_, s) => backends[s] === b);
        const layers = mine.reduce((t, r) => t + r.layers, 0);
        kvBytes = Math.min(kvBytes, (a.kvAfterUpload(b, a.activationBytes * mine.length) * spec.numLayers) / layers);
      }
      kvBytes = Math.floor(kvBytes);
    }
    const where = (s: number) => (devices ? `${kind === 'cpu' ? 'cpu backend' : 'GPU'} ${devices[s]}` : kind === 'cpu' ? 'cpu' : 'one GPU');
    notes.push(
      `pipeline: ${n} stages (${plan.stages.map((r, s) => `${r.layers === 1 ? `layer ${r.firstLayer}` : `layers ${r.firstLayer}-${r.endLayer - 1}`} on ${where(s)}`).join('; ')}), ${microBatches} micro-batch${microBatches === 1 ? '' : 'es'} per pass`,
    );
    if (!shared || microBatches > 1) notes.push('pipeline stages on separate backends or micro-batched: decode steps run without graph capture');
    if (budgeted)
      notes.push(
        `pipeline under VRAM budgets, all resident: ${budgeted.stages.map((b, s) => `stage ${s} ${MiB(b.heldBytes + b.kvBytes)} of ${MiB(b.budget)} (KV ${MiB(b.kvBytes)})`).join('; ')}`,
      );
    return {
      plan,
      stages,
      shared,
      microBatches,
      kvBytes,
      weightBytes,
      ...(budgeted ? { budgets: budgeted.stages } : {}),
      ...(res.nccl ? { nccl: res.nccl } : {}),
      notes,
      dispose: res.dispose,
    };
  } catch (e) {
    res.abandon();
    throw e;
  }
}

/**
 * What each pipeline stage holds, for the memory report: its layers, weights and share of the KV
 * cache (`kvBytes` over all layers), and its budget where one was given. A stage alone on its
 * backend holds that backend's weights; stages sharing a backend count their layers' bytes.
 */
export function stageResidency(prepared: PreparedStages, kvBytes: number, numLayers: number): DeviceResidency[] {
  return prepared.stages.map((st, i) => {
    const b = prepared.budgets?.[i];
    return {
      backend: st.backend.name,
      ...(st.device !== undefined ? { device: st.device } : {}),
      layers: [st.firstLayer, st.endLayer] as [number, number],
      weightBytes: prepared.stages.filter((x) => x.backend === st.backend).length === 1 ? st.weights.bytes : prepared.plan.stages[i].bytes,
      kvBytes: Math.round((kvBytes * (st.endLayer - st.firstLayer)) / numLayers),
      ...(b ? { budgetBytes: b.budget } : {}),
    };
  });
}
