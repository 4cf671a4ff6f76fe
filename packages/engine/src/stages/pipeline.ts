/**
 * Pipeline parallelism: the decoder layers split into contiguous ranges (stages), one
 * `ModelRunner` per stage, hidden states handed from stage to stage through `StageLink`s.
 *
 * Where stages run:
 * - one backend object for every stage (the CPU backend by default, one GPU with
 *   `allowSingleDeviceStages`): the stages share the engine's meta buffers, the links are copies
 *   on the one stream, and a decode step is still captured as one graph. This is the mode that
 *   proves the pipeline exact; on one device it cannot be faster than one stage.
 * - a backend per stage (`stageDevices`: one CUDA backend per GPU with NCCL links; on the CPU
 *   backend, one CPU backend per distinct ordinal with host links): each stage has its own meta
 *   buffers, written by the engine for every stage, the sampled tokens (and, when the host
 *   samples, the logits) come back to stage 0, and passes run eagerly.
 *
 * Micro-batches: a pass's sequences are split into up to `microBatches` groups; stage s works on
 * group g while stage s + 1 works on group g - 1 (ops are issued tick by tick, later stages first,
 * so on separate GPUs they overlap). The last stage gathers every group's final hidden rows and
 * runs the final norm, LM head and sampling once over the whole batch, as one stage would.
 */
import type { BackendStats, DeviceBackend, DeviceBuffer, EventHandle } from '@nerva/core';
import { emptySyncCounts, NervaError, SYNC_KINDS, DTYPE_BYTES } from '@nerva/core';
import type { ModelSpec, WeightStore } from '@nerva/models';
import { type BackendOptions, selectBackend } from '../backend-select.js';
import { ModelRunner, PROFILE_BUCKETS, type ProfileBucket, type RunnerLimits, type RunnerMeta } from '../model-runner.js';
import { layerLayouts, type ModelWeights, type UploadProgress, uploadWeights } from '../model-weights.js';
import { makeStageLink, type NcclPointToPoint } from './links.js';
import { StageResources } from './stage-resources.js';
import { planStages, type StageLink, type StagePlan } from './plan.js';

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
const KV_FLOOR_TOKENS = 64;
const MiB = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;

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

/** What the engine drives: one ModelRunner, or a StagePipeline of several. */
export interface PassRunner {
  readonly meta: RunnerMeta;
  readonly logits: DeviceBuffer;
  readonly limits: RunnerLimits;
  readonly kvBytes: number;
  /** Weight bytes of host slices computed near the data, and read in place (paged weights; 0 in a pipeline). */
  hostComputeBytes: number;
  hostReadBytes: number;
  forward(rows: number, nLogits: number): void;
  sampleOnDevice(nLogits: number, out: DeviceBuffer): void;
  advance(rows: number): void;
  /** A captured decode step's tail: sampleOnDevice(rows, out) then advance(rows), in as few ops as the backend takes them. */
  sampleStep(rows: number, out: DeviceBuffer): void;
  setProfiling(on: boolean, maxEvents?: number): void;
  /** Bucket times of the last profiled pass; `ops` gets the time of each op class added (ModelRunner.takeProfile). */
  takeProfile(ops?: Record<string, number>): Record<ProfileBucket, number>;
  dispose(): void;
}

/** The host arrays the engine stages a pass in (Engine's `stage`). */
export interface HostMeta {
  ids: Int32Array;
  pos: Int32Array;
  seq: Int32Array;
  slots: Int32Array;
  tables: Int32Array;
  logitRows: Int32Array;
  params: Float32Array;
  rng: Int32Array;
}

/** One micro-batch of a pass: sequences [seq0, seq1), rows [row0, row1), `logits` of them sampled. */
interface MicroBatch {
  seq0: number;
  seq1: number;
  row0: number;
  row1: number;
  logits: number;
}

/** A description of the pipeline, for reports. */
export interface PipelineDescription {
  stages: { firstLayer: number; endLayer: number; device?: number; backend: string }[];
  links: string[];
  microBatches: number;
  shared: boolean;
  capturable: boolean;
}

/**
 * One ModelRunner per stage and the links between them, driven by the engine as it drives one
 * runner: the engine writes the meta (`writeMeta`), runs `forward`, samples on the device
 * (`sampleOnDevice`) or reads `logits` after `logitsHome`, and `advance`s captured decode steps.
 */
export class StagePipeline implements PassRunner {
  readonly runners: ModelRunner[];
  /** links[s] carries hidden states from stage s to stage s + 1. */
  readonly links: StageLink[] = [];
  readonly limits: RunnerLimits;
  readonly kvBytes: number;
  /** Paged weights do not run in a pipeline (a budget is rejected), so nothing is computed near the data. */
  hostComputeBytes = 0;
  hostReadBytes = 0;
  readonly shared: boolean;
  readonly microBatches: number;
  /** A decode step can be captured as one graph: every stage on one backend, one micro-batch. */
  readonly capturable: boolean;
  /** Stage 0's meta (slot 0): what the engine writes, and the token ring it reads. */
  readonly meta: RunnerMeta;
  private readonly stages: PipelineStage[];
  /** Per stage, the meta of each micro-batch (fast mode: every stage shares stage 0's). */
  private readonly slots: RunnerMeta[][] = [];
  private readonly tokenLink: StageLink | undefined;
  private readonly logitsLink: StageLink | undefined;
  private readonly homeLogits: DeviceBuffer | undefined;
  private readonly gathered: DeviceBuffer | undefined;
  private readonly owned: { backend: DeviceBackend; buf: DeviceBuffer }[] = [];
  private readonly distinct: DeviceBackend[];
  /** The split of the pass last written by writeMeta. */
  private split: MicroBatch[] = [];
  private readonly rowSeqScratch: Int32Array;
  /**
   * Eager passes: an event pair per stage and micro-batch around its layers (`compute`, the last
   * stage's head in `head`), and around each handoff it receives (`link`, from stage 1), each on
   * the stage's own backend; made once. `timedGroups`: micro-batches of the last pass.
   */
  private readonly timing: { compute: [EventHandle, EventHandle][][]; link: [EventHandle, EventHandle][][]; head: [EventHandle, EventHandle] } | undefined;
  private timedGroups = 0;
  private disposed = false;

  constructor(spec: ModelSpec, limits: RunnerLimits, prepared: PreparedStages) {
    this.limits = limits;
    this.stages = prepared.stages;
    this.shared = prepared.shared;
    this.microBatches = prepared.microBatches;
    this.capturable = this.shared && this.microBatches === 1;
    this.distinct = [...new Set(this.stages.map((s) => s.backend))];
    this.rowSeqScratch = new Int32Array(limits.maxRows);
    const S = this.stages.length;
    this.runners = [];
    try {
      for (const st of this.stages) this.runners.push(new ModelRunner(st.backend, spec, st.weights, limits, { firstLayer: st.firstLayer, endLayer: st.endLayer }));
      const first = this.runners[0];
      const H = spec.hiddenSize;
      for (let s = 0; s + 1 < S; s++) {
        this.links.push(
          makeStageLink(
            { backend: this.stages[s].backend, rank: this.stages[s].rank },
            { backend: this.stages[s + 1].backend, rank: this.stages[s + 1].rank },
            { fromStage: s, toStage: s + 1, rowWidth: H, maxRows: limits.maxRows, dtype: 'f32' },
            { nccl: prepared.nccl, staged: true },
          ),
        );
      }
      if (this.capturable) {
        // Every stage reads stage 0's meta: the engine's writes, advance_positions and the token ring serve all.
        for (const r of this.runners) r.meta = first.meta;
        this.slots = this.runners.map(() => [first.meta]);
      } else {
        for (let s = 0; s < S; s++) {
          const be = this.stages[s].backend;
          const own = this.runners[s].meta;
          const list = [own];
          for (let g = 1; g < this.microBatches; g++) list.push(this.allocMeta(be, own, `stage${s}.mb${g}`));
          this.slots.push(list);
        }
      }
      const firstBe = this.stages[0].backend;
      const lastBe = this.stages[S - 1].backend;
      if (firstBe !== lastBe) {
        const ends = [
          { backend: lastBe, rank: this.stages[S - 1].rank },
          { backend: firstBe, rank: this.stages[0].rank },
        ] as const;
        this.tokenLink = makeStageLink(ends[0], ends[1], { fromStage: S - 1, toStage: 0, rowWidth: 1, maxRows: limits.maxSeqs, dtype: 'i32' }, { nccl: prepared.nccl });
        this.logitsLink = makeStageLink(ends[0], ends[1], { fromStage: S - 1, toStage: 0, rowWidth: spec.vocabSize, maxRows: limits.maxSeqs, dtype: 'f32' }, { nccl: prepared.nccl });
        this.homeLogits = this.alloc(firstBe, { dtype: 'f32', length: limits.maxSeqs * spec.vocabSize, usage: 'activations', label: 'pipeline.logits' });
      }
      if (this.microBatches > 1) this.gathered = this.alloc(lastBe, { dtype: 'f32', length: limits.maxRows * H, usage: 'activations', label: 'pipeline.gathered_hidden' });
      if (!this.capturable) {
        const pair = (be: DeviceBackend): [EventHandle, EventHandle] => [be.createEvent(), be.createEvent()];
        const perGroup = (be: DeviceBackend) => Array.from({ length: this.microBatches }, () => pair(be));
        this.timing = {
          compute: this.stages.map((st) => perGroup(st.backend)),
          link: this.stages.map((st, s) => (s === 0 ? [] : perGroup(st.backend))),
          head: pair(lastBe),
        };
      }
      this.meta = first.meta;
    } catch (e) {
      this.disposeParts();
      throw e;
    }
    this.kvBytes = this.runners.reduce((t, r) => t + r.kvBytes, 0);
  }

  private alloc(backend: DeviceBackend, spec: Parameters<DeviceBackend['alloc']>[0]): DeviceBuffer {
    const buf = backend.alloc(spec);
    this.owned.push({ backend, buf });
    return buf;
  }

  /** A micro-batch's meta: its own per-row buffers, the stage's token ring. */
  private allocMeta(be: DeviceBackend, own: RunnerMeta, label: string): RunnerMeta {
    const { maxRows, maxSeqs, maxBlocksPerSeq } = this.limits;
    const i32 = (length: number, what: string) => this.alloc(be, { dtype: 'i32', length, usage: 'io', label: `${label}.${what}` });
    return {
      ids: i32(maxRows, 'ids'),
      positions: i32(maxRows, 'positions'),
      rowSeq: i32(maxRows, 'row_seq'),
      slots: i32(maxRows, 'slots'),
      blockTables: i32(maxSeqs * maxBlocksPerSeq, 'block_tables'),
      logitRows: i32(maxSeqs, 'logit_rows'),
      sampleParams: own.sampleParams,
      rng: own.rng,
      sampled: own.sampled,
      ring: own.ring,
      ringCursor: own.ringCursor,
    };
  }

  /** The logits the engine reads: on stage 0's backend (brought home by `logitsHome` when the last stage is elsewhere). */
  get logits(): DeviceBuffer {
    return this.homeLogits ?? this.runners[this.runners.length - 1].logits;
  }

  /** Where the stages run and how they are linked. */
  describe(): PipelineDescription {
    return {
      stages: this.stages.map((s) => ({ firstLayer: s.firstLayer, endLayer: s.endLayer, backend: s.backend.name, ...(s.device !== undefined ? { device: s.device } : {}) })),
      links: this.links.map((l) => l.kind),
      microBatches: this.microBatches,
      shared: this.shared,
      capturable: this.capturable,
    };
  }

  /**
   * Write a pass's meta from the engine's host arrays. Shared mode: stage 0's buffers, as the
   * engine writes one runner's. Otherwise: split the sequences into micro-batches and write each
   * stage's buffers for each (ids to stage 0, rows rebased to the micro-batch), and the logit rows
   * and sampling parameters of the whole pass to the last stage.
   */
  writeMeta(h: HostMeta, rows: number, nl: number, withSampling: boolean): void {
    const mb = this.limits.maxBlocksPerSeq;
    let seqs = 0;
    for (let r = 0; r < rows; r++) seqs = Math.max(seqs, h.seq[r] + 1);
    if (this.capturable) {
      const be = this.stages[0].backend;
      const m = this.meta;
      be.write(m.ids, h.ids.subarray(0, rows));
      be.write(m.positions, h.pos.subarray(0, rows));
      be.write(m.rowSeq, h.seq.subarray(0, rows));
      be.write(m.slots, h.slots.subarray(0, rows));
      be.write(m.blockTables, h.tables.subarray(0, seqs * mb));
      if (nl > 0) be.write(m.logitRows, h.logitRows.subarray(0, nl));
      if (withSampling && nl > 0) {
        be.write(m.sampleParams, h.params.subarray(0, nl * 4));
        be.write(m.rng, h.rng.subarray(0, nl * 2));
      }
      this.split = [{ seq0: 0, seq1: seqs, row0: 0, row1: rows, logits: nl }];
      return;
    }
    // Sequences in even groups; a sequence's rows are contiguous and in sequence order.
    const groups = Math.max(1, Math.min(this.microBatches, seqs));
    const split: MicroBatch[] = [];
    let row = 0;
    let li = 0;
    for (let g = 0; g < groups; g++) {
      const seq0 = Math.floor((g * seqs) / groups);
      const seq1 = Math.floor(((g + 1) * seqs) / groups);
      const row0 = row;
      while (row < rows && h.seq[row] < seq1) row++;
      let logits = 0;
      while (li < nl && h.logitRows[li] < row) {
        li++;
        logits++;
      }
      split.push({ seq0, seq1, row0, row1: row, logits });
    }
    const S = this.stages.length;
    for (let s = 0; s < S; s++) {
      const be = this.stages[s].backend;
      split.forEach((p, g) => {
        const m = this.slots[s][g];
        const n = p.row1 - p.row0;
        if (s === 0) be.write(m.ids, h.ids.subarray(p.row0, p.row1));
        be.write(m.positions, h.pos.subarray(p.row0, p.row1));
        for (let r = 0; r < n; r++) this.rowSeqScratch[r] = h.seq[p.row0 + r] - p.seq0;
        be.write(m.rowSeq, this.rowSeqScratch.subarray(0, n));
        be.write(m.slots, h.slots.subarray(p.row0, p.row1));
        be.write(m.blockTables, h.tables.subarray(p.seq0 * mb, p.seq1 * mb));
      });
    }
    // The head runs once over the whole pass on the last stage: its logit rows are absolute.
    const be = this.stages[S - 1].backend;
    const m = this.slots[S - 1][0];
    if (nl > 0) be.write(m.logitRows, h.logitRows.subarray(0, nl));
    if (withSampling && nl > 0) {
      be.write(m.sampleParams, h.params.subarray(0, nl * 4));
      be.write(m.rng, h.rng.subarray(0, nl * 2));
    }
    this.split = split;
  }

  /**
   * One forward pass through every stage: logits of the pass's `nLogits` rows on the last stage.
   * Micro-batches are issued tick by tick: at tick t, stage s runs micro-batch t - s, the last
   * stage first, so a stage's handoff of group g is received before it starts on group g + 1.
   */
  forward(rows: number, nLogits: number): void {
    const S = this.runners.length;
    if (this.capturable) {
      for (let s = 0; s < S; s++) {
        const r = this.runners[s];
        if (s > 0) this.links[s - 1].recv(r.hidden, rows);
        r.forward(rows, nLogits);
        if (s + 1 < S) this.links[s].send(r.hidden, rows);
      }
      return;
    }
    const split = this.split;
    if (split.length === 0 || split[split.length - 1].row1 !== rows) throw new NervaError('PIPELINE_STATE', `pipeline forward of ${rows} rows without its meta (writeMeta first)`);
    const G = split.length;
    const last = this.runners[S - 1];
    for (let t = 0; t < G + S - 1; t++) {
      for (let s = S - 1; s >= 0; s--) {
        const g = t - s;
        if (g < 0 || g >= G) continue;
        const r = this.runners[s];
        const p = split[g];
        const n = p.row1 - p.row0;
        r.meta = this.slots[s][g];
        const be = this.stages[s].backend;
        const time = this.timing!;
        if (s > 0) {
          be.record(time.link[s][g][0]);
          this.links[s - 1].recv(r.hidden, n);
          be.record(time.link[s][g][1]);
        }
        be.record(time.compute[s][g][0]);
        if (s + 1 < S) {
          r.forward(n, p.logits, undefined, false);
          be.record(time.compute[s][g][1]);
          this.links[s].send(r.hidden, n);
        } else if (G === 1) {
          r.forward(n, p.logits);
          be.record(time.compute[s][g][1]);
        } else {
          r.forward(n, p.logits, undefined, false);
          be.record(time.compute[s][g][1]);
          be.copy(this.gathered!, r.hidden, n * last.spec.hiddenSize, p.row0 * last.spec.hiddenSize, 0);
        }
      }
    }
    for (let s = 0; s < S; s++) this.runners[s].meta = this.slots[s][0];
    const lastBe = this.stages[S - 1].backend;
    lastBe.record(this.timing!.head[0]);
    if (G > 1) last.head(rows, nLogits, this.gathered!);
    lastBe.record(this.timing!.head[1]);
    this.timedGroups = G;
  }

  /**
   * The last eager pass's device time per stage (its layers, and the last stage's head) and per
   * handoff (entry s - 1: the time stage s's stream spent receiving from stage s - 1, its wait
   * included), from the events each stage's backend recorded. Read once the pass has completed
   * (the step's tokens are home); undefined for a captured pipeline or before any eager pass.
   */
  stageTimes(): { stageMs: number[]; linkMs: number[] } | undefined {
    const t = this.timing;
    if (!t || this.timedGroups === 0) return undefined;
    const G = this.timedGroups;
    this.timedGroups = 0;
    const S = this.stages.length;
    const span = (s: number, pairs: [EventHandle, EventHandle][]) => pairs.slice(0, G).reduce((sum, [a, b]) => sum + this.stages[s].backend.elapsedMs(a, b), 0);
    const stageMs = this.stages.map((_, s) => span(s, t.compute[s]));
    stageMs[S - 1] += this.stages[S - 1].backend.elapsedMs(t.head[0], t.head[1]);
    return { stageMs, linkMs: this.stages.slice(1).map((_, i) => span(i + 1, t.link[i + 1])) };
  }

  /**
   * Sample the pass's logit rows on the last stage into `out` (a buffer of stage 0's meta: the
   * engine passes meta.ids in a captured decode step, meta.sampled otherwise) and push them into
   * stage 0's token ring. From another backend the tokens travel home over the token link.
   */
  sampleOnDevice(nLogits: number, out: DeviceBuffer): void {
    const S = this.runners.length;
    const last = this.runners[S - 1];
    if (this.capturable) {
      last.sampleOnDevice(nLogits, out);
      return;
    }
    const lastBe = this.stages[S - 1].backend;
    const lm = this.slots[S - 1][0];
    const fm = this.meta;
    const into = this.tokenLink ? lm.sampled : out;
    lastBe.run('sample', { logits: last.logits, params: lm.sampleParams, rng: lm.rng, out: into, rows: nLogits, vocab: last.spec.vocabSize, ...(last.sampleLimit < last.spec.vocabSize ? { limit: last.sampleLimit } : {}) });
    if (this.tokenLink) {
      this.tokenLink.send(lm.sampled, nLogits);
      this.tokenLink.recv(out, nLogits);
    }
    this.stages[0].backend.run('ring_push', { src: out, ring: fm.ring, cursor: fm.ringCursor, rows: nLogits, capacity: this.limits.ringCapacity });
  }

  /** Bring the last stage's logits to stage 0's backend, where the engine reads them (a no-op when they are there). */
  logitsHome(nLogits: number): void {
    if (!this.logitsLink || nLogits === 0) return;
    const last = this.runners[this.runners.length - 1];
    this.logitsLink.send(last.logits, nLogits);
    this.logitsLink.recv(this.homeLogits!, nLogits);
  }

  /** The device side of a captured decode step (shared mode only: the stages share stage 0's meta). */
  advance(rows: number): void {
    if (!this.capturable) throw new NervaError('PIPELINE_STATE', 'advance is part of a captured decode step; this pipeline runs its passes eagerly');
    this.runners[0].advance(rows);
  }

  /** The tail of a captured decode step: the stages' ops as they are (stage 0 advances). */
  sampleStep(rows: number, out: DeviceBuffer): void {
    this.sampleOnDevice(rows, out);
    this.advance(rows);
  }

  setProfiling(on: boolean, maxEvents?: number): void {
    for (const r of this.runners) r.setProfiling(on, maxEvents);
  }

  takeProfile(ops?: Record<string, number>): Record<ProfileBucket, number> {
    return sumProfiles(this.runners, ops);
  }

  /** Counters summed over the stages' backends (each counted once). */
  stats(): BackendStats {
    return sumBackendStats(this.distinct);
  }

  private disposeParts(): void {
    for (const l of [...this.links, this.tokenLink, this.logitsLink]) l?.close();
    const t = this.timing;
    if (t) {
      this.stages.forEach((st, s) => [...t.compute[s], ...t.link[s]].forEach(([a, b]) => (st.backend.destroyEvent(a), st.backend.destroyEvent(b))));
      const lastBe = this.stages[this.stages.length - 1].backend;
      lastBe.destroyEvent(t.head[0]);
      lastBe.destroyEvent(t.head[1]);
    }
    for (const { backend, buf } of this.owned) backend.free(buf);
    this.owned.length = 0;
    for (const r of this.runners) r.dispose();
  }

  /** Free the runners, links and buffers (what prepareStages made, the model frees). */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.disposeParts();
  }
}

/** The device time by bucket of several runners' passes, summed (each runner's profile taken). */
export function sumProfiles(runners: readonly ModelRunner[], ops?: Record<string, number>): Record<ProfileBucket, number> {
  const out = Object.fromEntries(PROFILE_BUCKETS.map((b) => [b, 0])) as Record<ProfileBucket, number>;
  for (const r of runners) for (const [k, v] of Object.entries(r.takeProfile(ops))) out[k as ProfileBucket] += v;
  return out;
}

/** Counters summed over several backends (each given once): a pipeline's stages, a tensor-parallel group's shards. */
export function sumBackendStats(distinct: readonly DeviceBackend[]): BackendStats {
  if (distinct.length === 1) return distinct[0].stats();
  const all = distinct.map((b) => b.stats());
  const sum = (k: Exclude<keyof BackendStats, 'syncs' | 'hostComputeMsByOp'>) => all.reduce((t, s) => t + (s[k] ?? 0), 0);
  const byOp = all.filter((s) => s.hostComputeMsByOp !== undefined).map((s) => s.hostComputeMsByOp!);
  const syncs = emptySyncCounts();
  for (const s of all) for (const k of SYNC_KINDS) syncs[k] += s.syncs[k];
  return {
    liveBuffers: sum('liveBuffers'),
    liveBytes: sum('liveBytes'),
    allocCalls: sum('allocCalls'),
    freeCalls: sum('freeCalls'),
    hotPathAllocations: sum('hotPathAllocations'),
    h2dBytes: sum('h2dBytes'),
    d2hBytes: sum('d2hBytes'),
    d2dBytes: sum('d2dBytes'),
    launches: sum('launches'),
    graphReplays: sum('graphReplays'),
    syncs,
    ...(all.some((s) => s.hostComputeMs !== undefined) ? { hostComputeMs: sum('hostComputeMs') } : {}),
    ...(byOp.length ? { hostComputeMsByOp: { mlp_slice: byOp.reduce((t, b) => t + (b.mlp_slice ?? 0), 0), attention: byOp.reduce((t, b) => t + (b.attention ?? 0), 0) } } : {}),
  };
}
