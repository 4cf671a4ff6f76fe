/**
 * Exact tensor parallelism: every decoder layer split across N backends of one kind (N GPUs; on
 * the CPU backend, N CPU backends standing in for them), so that tokens and logits equal the
 * one-backend run bit for bit.
 *
 * Column parallel with the activations gathered: each projection is split by its output rows
 * (shard-weights.ts), each shard computes its rows over the whole, replicated input with the op
 * one device runs (shard-runner.ts), and the slices are all-gathered over stage links
 * (all-gather.ts) so every shard holds the whole activation again. Per dense layer:
 *
 *   qkv (the shard's heads) -> RoPE + KV append into the shard's KV heads -> attention over them
 *   -> all-gather the attention output -> o (hidden rows / N) -> all-gather into the stream
 *   -> gate_up (the shard's channels) + SiLU-GLU -> all-gather -> down (hidden rows / N)
 *   -> all-gather into the stream
 *
 * The LM head is split by vocabulary rows too and gathered to shard 0, which samples (its rows
 * are the largest matrix of a small model; computing them whole on shard 0 would leave the other
 * shards idle for that share of every step). The residual add of a fused pass happens inside the
 * accumulating projection on each shard's columns of the stream (see ShardRunner.oProjection), so
 * each stream element gets one device's R(x + R(dot)).
 *
 * With pipeline stages (tensorParallel N x pipelineParallel S) the group is a grid: stage s's
 * layers are split across its own N shards, and shard k of stage s hands its copy of the (whole,
 * replicated) stream to shard k of stage s + 1 over a stage link. Sampling runs on the last
 * stage's shard 0; tokens (and logits the host needs) come home to stage 0's shard 0.
 *
 * Not yet: MoE layers (refused), stageDevices and micro-batches with shards (refused), memory
 * budgets and tiered KV (refused), graph capture of a group's steps (passes run eagerly).
 *
 * On GPUs the same structure holds, with two conditions for bit equality the CPU backend meets by
 * construction (float64 accumulation per element, whatever the output count): a kernel whose
 * reduction order depends on the output count (a GEMV's split-K chosen by outDim, a GEMM's tile
 * shape chosen by N) must be pinned to the one-device choice for the shard's narrower projection,
 * and the gathers (here links and per-row copies) want one NCCL all-gather per exchange or
 * peer-to-peer stores from the producing kernel, inside a captured decode graph.
 */
import type { BackendStats, DeviceBackend, DeviceBuffer } from '@nerva/core';
import { DTYPE_BYTES, NervaError } from '@nerva/core';
import type { DeviceResidency } from '@nerva/memos';
import type { ModelSpec } from '@nerva/models';
import { selectBackend } from '../backend-select.js';
import { type ProfileBucket, type RunnerLimits, type RunnerMeta } from '../model-runner.js';
import { layerLayouts } from '../model-weights.js';
import { type StepBuffers, writeStepMeta } from '../step-batch.js';
import { ShardGather } from './all-gather.js';
import { makeStageLink } from './links.js';
import { StageResources } from './stage-resources.js';
import type { PassRunner } from './pipeline.js';
import { KV_FLOOR_TOKENS, MiB, type PipelineStage, type PreparedStages, type PrepareStagesArgs } from './placement.js';
import { sumBackendStats, sumProfiles } from './pipeline.js';
import { planStages, type StageLink } from './plan.js';
import { ShardRunner } from './shard-runner.js';
import { shardGeometry, shardSpec, TensorParallelConfigError, type ShardGeometry, uploadShardWeights } from './shard-weights.js';

export { TensorParallelConfigError } from './shard-weights.js';

/** The tensor-parallel fields of EngineOptions (and those it does not compose with yet). */
export interface TensorParallelOptions {
  tensorParallel?: number;
  allowSingleDeviceStages?: boolean;
  pipelineParallel?: number;
  stageDevices?: number[];
  pipelineMicroBatches?: number;
  vramBudget?: number;
  stageVramBudgets?: number[];
  hostBudget?: number;
  kvVramBudget?: number;
}

export interface TensorParallelRequest {
  shards: number;
  /** Pipeline stages, each split across its own `shards` shards (1: no pipeline). */
  stages: number;
  allowSingleDevice: boolean;
  /** Each stage's VRAM budget, which every shard of the stage (a GPU each) must fit, when one was given. */
  budgets?: number[];
}

/**
 * The VRAM budget of the engine's own backend (stage 0's shard 0) under shard budgets: every
 * shard's where they may share one device (allowSingleDeviceStages), else stage 0's.
 */
export function primaryShardBudget(req: TensorParallelRequest | undefined): number | undefined {
  if (!req?.budgets) return undefined;
  return req.allowSingleDevice ? req.budgets.reduce((t, b) => t + b * req.shards, 0) : req.budgets[0];
}

/**
 * Check the tensor-parallel options before anything loads: a shard count of at least 1, and
 * nothing it does not compose with yet. Undefined for one shard. (Whether the model's heads
 * split N ways is checked once its config is read: `shardGeometry`.)
 */
export function tensorParallelRequest(o: TensorParallelOptions): TensorParallelRequest | undefined {
  const n = o.tensorParallel;
  if (n === undefined) return undefined;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 1) throw new TensorParallelConfigError(`tensorParallel must be a positive integer (the number of shards), got ${String(n)}`);
  if (n === 1) return undefined;
  if (o.stageDevices !== undefined)
    throw new TensorParallelConfigError(`tensorParallel ${n} with stageDevices is not supported yet: with shards, stages take backends (GPUs 0, 1, ...) in order; give pipelineParallel instead`);
  if (o.pipelineMicroBatches !== undefined && o.pipelineMicroBatches > 1)
    throw new TensorParallelConfigError(`tensorParallel ${n} with pipelineMicroBatches ${o.pipelineMicroBatches} is not supported yet: sharded stages run one micro-batch a pass`);
  if (o.hostBudget !== undefined) throw new TensorParallelConfigError(`tensorParallel ${n} with a host budget is not supported yet: paged weights run on one backend`);
  if (o.kvVramBudget !== undefined) throw new TensorParallelConfigError(`tensorParallel ${n} with tiered KV (kvVramBudget) is not supported yet`);
  const stages = o.pipelineParallel ?? 1;
  if (!Number.isInteger(stages) || stages < 1) throw new TensorParallelConfigError(`pipelineParallel must be a positive integer, got ${String(stages)}`);
  // A budget per GPU (vramBudget), or per stage (stageVramBudgets, checked by pipelineRequest): every shard of a stage gets its stage's.
  const budgets = o.stageVramBudgets ?? (o.vramBudget !== undefined ? new Array<number>(stages).fill(o.vramBudget) : undefined);
  if (budgets !== undefined && budgets.length !== stages) throw new TensorParallelConfigError(`stageVramBudgets lists ${budgets.length} budget(s) for ${stages} pipeline stage(s): give one per stage`);
  return { shards: n, stages, allowSingleDevice: o.allowSingleDeviceStages === true, ...(budgets ? { budgets: [...budgets] } : {}) };
}

/**
 * A group's shards, as the model loaded them: PreparedStages' shape, one entry of `stages` per
 * shard, stage-major (stage s, shard k at s * shards + k), each with its stage's layers.
 */
export interface PreparedShards extends PreparedStages {
  tensorParallel: true;
  /** Every stage's shards split alike (ShardGeometry of shard k). */
  geometry: ShardGeometry[];
}

/** What placing the shards takes: the stages' arguments (the same memory plan), with the group's request. */
export interface PrepareShardsArgs extends Omit<PrepareStagesArgs, 'request'> {
  request: TensorParallelRequest;
}

/**
 * Place the shards: check the model splits N ways (and S stages), make a backend per shard of
 * each stage (CPU: a CPU backend each; CUDA: a GPU each, or everything on the engine's GPU with
 * allowSingleDeviceStages), upload each shard's weights of its stage's layers, and make the NCCL
 * communicator when shards sit on separate GPUs.
 */
export async function prepareShards(a: PrepareShardsArgs): Promise<PreparedShards> {
  const { request: req, primary, spec } = a;
  const n = req.shards;
  const S = req.stages;
  const geometry = shardGeometry(spec, n);
  if (S > spec.numLayers) throw new TensorParallelConfigError(`pipelineParallel ${S} exceeds the model's ${spec.numLayers} decoder layers: every stage needs at least one layer`);
  const plan = planStages(spec.numLayers, S);
  const cells = S * n;
  const kind = primary.capabilities.deviceKind;
  const notes: string[] = [];
  // Every shard on the engine's backend object: asked for on the CPU backend (a test of the
  // one-backend links a one-GPU machine uses), forced on a GPU machine with fewer GPUs than shards.
  let shared = kind === 'cpu' && req.allowSingleDevice;
  if (kind !== 'cpu') {
    const count = primary.capabilities.deviceCount;
    const what = S > 1 ? `tensorParallel ${n} x pipelineParallel ${S}` : `tensorParallel ${n}`;
    if (count < cells && !req.allowSingleDevice)
      throw new TensorParallelConfigError(`${what} needs ${cells} GPUs, but ${count} ${count === 1 ? 'is' : 'are'} visible; --allow-single-device-stages places every shard on one GPU, to test the split`);
    shared = count < cells;
  }
  // Under budgets: each shard's fixed bytes (its runner's activations, the gathers' staging, the
  // embedding on a first stage, the gathered logits on the sampling shard), checked before any upload.
  const buffersOf = (i: number): number => {
    // (+ the shard's gathered o and MLP outputs: one H-wide buffer of them is the runner's under a sparse MLP.)
    const staging = a.maxRows * 4 * (spec.numHeads * spec.headDim + (spec.moe ? 3 : 4) * spec.hiddenSize + 2 * spec.intermediateSize);
    const logits = Math.floor(i / n) === S - 1 && i % n === 0 ? a.maxNumSeqs * spec.vocabSize * 4 : 0;
    return a.activationBytes + staging + logits;
  };
  const fixedOf = (i: number): number => buffersOf(i) + (i < n ? spec.vocabSize * spec.hiddenSize * DTYPE_BYTES[primary.capabilities.weightDtype] : 0);
  const capacityOf = (i: number): number => req.budgets![Math.floor(i / n)] - a.reservedBytes;
  if (req.budgets) {
    const layerBytes = layerLayouts(primary, spec, a.ckpt).map((t) => t.reduce((x, d) => x + d.length * DTYPE_BYTES[d.dtype], 0));
    const head = spec.vocabSize * spec.hiddenSize * DTYPE_BYTES[primary.capabilities.weightDtype];
    for (let i = 0; i < cells; i++) {
      const r = plan.stages[Math.floor(i / n)];
      // A shard holds about 1/N of each of its layers (norms whole: a rounding here) and of the LM head.
      const weights = layerBytes.slice(r.firstLayer, r.endLayer).reduce((x, y) => x + y, 0) / n + (r.endLayer === spec.numLayers ? head / n : 0);
      const need = fixedOf(i) + weights + (KV_FLOOR_TOKENS * a.kvBytesPerToken * r.layers) / (spec.numLayers * n);
      if (need > capacityOf(i))
        throw new TensorParallelConfigError(
          `shard ${i % n} of ${S > 1 ? `stage ${r.stage} (layers ${r.firstLayer}-${r.endLayer - 1})` : 'the model'} needs about ${MiB(need)} (weights ${MiB(weights)}, activations, staging${r.stage === 0 ? ' and the embedding' : ''} ${MiB(fixedOf(i))}) ` +
            `but its VRAM budget leaves ${MiB(capacityOf(i))}${a.reservedBytes > 0 ? ` (${MiB(a.reservedBytes)} of workspaces set aside)` : ''}: give more shards or stages, or larger budgets`,
        );
    }
  }
  const res = new StageResources(primary);
  try {
    const backends: DeviceBackend[] = [primary];
    for (let i = 1; i < cells; i++) {
      if (shared) {
        backends.push(primary);
        continue;
      }
      const budget = req.budgets?.[Math.floor(i / n)];
      backends.push(res.own((await selectBackend(kind === 'cpu' ? 'cpu' : 'cuda', { ...a.backendOptions, device: i, ...(budget !== undefined ? { deviceBudgetBytes: budget } : {}) })).backend));
    }
    const stages: PipelineStage[] = [];
    let weightBytes = 0;
    for (let i = 0; i < cells; i++) {
      const r = plan.stages[Math.floor(i / n)];
      const part = { firstLayer: r.firstLayer, endLayer: r.endLayer };
      const w = await uploadShardWeights(backends[i], spec, a.ckpt, geometry[i % n], a.onProgress, part);
      res.uploaded(backends[i], w);
      weightBytes += w.bytes;
      stages.push({ backend: backends[i], weights: w, ...part, ...(shared ? {} : { device: i, rank: i }) });
    }
    if (!shared && kind !== 'cpu') {
      const comm = await res.communicate(kind, backends, (e) => new TensorParallelConfigError(`tensor-parallel shards on GPUs 0-${cells - 1} need NCCL: ${e.message}`, { cause: e }));
      notes.push(`tensor-parallel links: ${comm.description}`);
    }
    let kvBytes = a.kvPlanned;
    let budgets: { budget: number; heldBytes: number; kvBytes: number }[] | undefined;
    if (req.budgets) {
      // What each shard's budget leaves beside its weights (exact now) and fixed bytes holds 1/N of
      // its stage's layers' KV: the tightest shard decides the whole cache.
      const L = spec.numLayers;
      const room = stages.map((st, i) => capacityOf(i) - st.weights.bytes - buffersOf(i));
      const fits = Math.floor(Math.min(...stages.map((st, i) => (room[i] * n * L) / (st.endLayer - st.firstLayer))));
      if (a.kvExplicit) {
        const over = stages.findIndex((st, i) => (a.kvPlanned! * (st.endLayer - st.firstLayer)) / (n * L) > room[i]);
        if (over >= 0) throw new TensorParallelConfigError(`kvCacheBytes ${MiB(a.kvPlanned!)} does not fit the VRAM budgets: shard ${over % n} of stage ${Math.floor(over / n)} has room for ${MiB(Math.max(0, room[over]))} of KV; at most ${MiB(fits)} fits`);
      } else kvBytes = Math.floor(Math.min(0.95 * fits, a.kvPlanned ?? 16 * 2 ** 30));
      budgets = stages.map((st, i) => ({ budget: req.budgets![Math.floor(i / n)], heldBytes: st.weights.bytes + buffersOf(i), kvBytes: Math.floor((kvBytes! * (st.endLayer - st.firstLayer)) / (n * L)) }));
      notes.push(`tensor parallel under VRAM budgets, all resident: ${budgets.map((b, i) => `shard ${i % n}${S > 1 ? ` of stage ${Math.floor(i / n)}` : ''} ${MiB(b.heldBytes + b.kvBytes)} of ${MiB(b.budget)}`).join('; ')}`);
    }
    if (kvBytes === undefined) {
      // Each shard holds 1/N of its stage's layers' KV: the tightest backend decides the whole cache.
      if (shared) kvBytes = Math.floor(a.kvAfterUpload(primary, a.activationBytes * cells));
      else kvBytes = Math.floor(Math.min(...backends.map((b, i) => (a.kvAfterUpload(b, a.activationBytes) * n * spec.numLayers) / plan.stages[Math.floor(i / n)].layers)));
    }
    const where = shared ? `every shard on one ${kind === 'cpu' ? 'backend' : 'GPU'} (allowSingleDeviceStages): a test of the split, not a speedup` : kind === 'cpu' ? `a CPU backend per shard` : `GPUs 0-${cells - 1}`;
    const staged = S > 1 ? ` in each of ${S} pipeline stages (${plan.stages.map((r) => `layers ${r.firstLayer}-${r.endLayer - 1}`).join('; ')})` : '';
    notes.push(
      `tensor parallel: ${n} shards (${geometry[0].qHeads} q / ${geometry[0].kvHeads} KV heads each)${staged}, ${where}; all-gathers after attention, o, gate_up and down; LM head split by vocabulary rows, sampled on shard 0; passes run without graph capture`,
    );
    return { plan, stages, shared, microBatches: 1, kvBytes, weightBytes, ...(budgets ? { budgets } : {}), ...(res.nccl ? { nccl: res.nccl } : {}), notes, dispose: res.dispose, tensorParallel: true, geometry };
  } catch (e) {
    res.abandon();
    throw e;
  }
}

/** What each shard holds, for the memory report: its layers, weights, KV heads' bytes, and its budget where one was given. */
export function shardResidency(group: TensorParallelGroup, prepared: PreparedStages): DeviceResidency[] {
  return group.describe().shards.map((s, i) => {
    const b = prepared.budgets?.[i];
    return { backend: s.backend, ...(s.device !== undefined ? { device: s.device } : {}), layers: s.layers, weightBytes: s.weightBytes, kvBytes: s.kvBytes, ...(b ? { budgetBytes: b.budget } : {}) };
  });
}

/** Whether prepared stages are a tensor-parallel group's shards. */
export function isPreparedShards(p: PreparedStages): p is PreparedShards {
  return (p as Partial<PreparedShards>).tensorParallel === true;
}

/** What a group reports: its shards' backends and slices (stage-major with pipeline stages), and its links. */
export interface TensorParallelDescription {
  stages: number;
  shards: {
    stage: number;
    layers: [number, number];
    backend: string;
    device?: number;
    qHeads: [number, number];
    kvHeads: [number, number];
    hidden: [number, number];
    inter: [number, number];
    vocab: [number, number];
    weightBytes: number;
    kvBytes: number;
  }[];
  links: string[];
  shared: boolean;
}

/** The gathers of one stage's shards (they sit on that stage's backends). */
interface StageGathers {
  attn: ShardGather;
  hidden: ShardGather;
  mlp: ShardGather;
}

/**
 * A tensor-parallel group driven by the engine as it drives one runner (see PassRunner): the
 * engine writes the meta (every shard gets it), runs `forward`, and samples on the last stage's
 * shard 0 or reads the logits brought to stage 0's shard 0.
 */
export class TensorParallelGroup implements PassRunner {
  /** Every shard's runner, stage-major. */
  readonly runners: ShardRunner[] = [];
  /** grid[s][k]: shard k of stage s. */
  readonly grid: ShardRunner[][] = [];
  readonly limits: RunnerLimits;
  readonly kvBytes: number;
  hostComputeBytes = 0;
  hostReadBytes = 0;
  /** Passes interleave shards and gathers on the host: no decode graph. */
  readonly capturable = false;
  readonly meta: RunnerMeta;
  private readonly cells: PipelineStage[];
  private readonly geometry: ShardGeometry[];
  private readonly gathers: ShardGather[] = [];
  private readonly stageGathers: StageGathers[] = [];
  private readonly headGather: ShardGather;
  /** handoffs[s][k]: shard k's stream from stage s to stage s + 1. */
  private readonly handoffs: StageLink[][] = [];
  private readonly tokenLink: StageLink | undefined;
  private readonly logitsLink: StageLink | undefined;
  private readonly homeLogits: DeviceBuffer | undefined;
  private readonly distinct: DeviceBackend[];
  /** A one-device runner would run the whole stack as one op (decode batches take the fused path at any size). */
  private readonly stackable: boolean;
  private disposed = false;

  constructor(spec: ModelSpec, limits: RunnerLimits, prepared: PreparedShards) {
    this.limits = limits;
    this.cells = prepared.stages;
    this.geometry = prepared.geometry;
    this.distinct = [...new Set(this.cells.map((s) => s.backend))];
    const n = this.geometry.length;
    const S = prepared.plan.numStages;
    const hd = spec.headDim;
    const H = spec.hiddenSize;
    const end = (i: number) => ({ backend: this.cells[i].backend, ...(this.cells[i].rank !== undefined ? { rank: this.cells[i].rank } : {}) });
    try {
      for (let s = 0; s < S; s++) {
        const row: ShardRunner[] = [];
        for (let k = 0; k < n; k++) {
          const c = this.cells[s * n + k];
          const r = new ShardRunner(c.backend, spec, shardSpec(spec, this.geometry[k]), c.weights, limits, this.geometry[k], { firstLayer: c.firstLayer, endLayer: c.endLayer });
          row.push(r);
          this.runners.push(r);
        }
        this.grid.push(row);
      }
      const g = this.geometry;
      const make = (s: number, slices: { offset: number; width: number }[], total: number, rows: number, label: string, to?: number[]) => {
        const ends = Array.from({ length: n }, (_, k) => end(s * n + k));
        const x = new ShardGather(ends, slices, total, rows, `${label}${S > 1 ? `.stage${s}` : ''}`, to, prepared.nccl);
        this.gathers.push(x);
        return x;
      };
      for (let s = 0; s < S; s++) {
        this.stageGathers.push({
          attn: make(s, g.map((x) => ({ offset: x.qHeadOffset * hd, width: x.qHeads * hd })), spec.numHeads * hd, limits.maxRows, 'tp.attn'),
          hidden: make(s, g.map((x) => x.hidden), H, limits.maxRows, 'tp.hidden'),
          mlp: make(s, g.map((x) => x.inter), spec.intermediateSize, limits.maxRows, 'tp.mlp'),
        });
      }
      // Logits are gathered to the last stage's shard 0 only: it samples.
      this.headGather = make(S - 1, g.map((x) => x.vocab), spec.vocabSize, limits.maxSeqs, 'tp.logits', [0]);
      for (let s = 0; s + 1 < S; s++)
        this.handoffs.push(
          Array.from({ length: n }, (_, k) =>
            makeStageLink(end(s * n + k), end((s + 1) * n + k), { fromStage: s, toStage: s + 1, rowWidth: H, maxRows: limits.maxRows, dtype: 'f32' }, { nccl: prepared.nccl, staged: true }),
          ),
        );
      const home = this.grid[0][0];
      const last = this.grid[S - 1][0];
      if (home.backend !== last.backend) {
        const ends = [end((S - 1) * n), end(0)] as const;
        this.tokenLink = makeStageLink(ends[0], ends[1], { fromStage: S - 1, toStage: 0, rowWidth: 1, maxRows: limits.maxSeqs, dtype: 'i32' }, { nccl: prepared.nccl });
        this.logitsLink = makeStageLink(ends[0], ends[1], { fromStage: S - 1, toStage: 0, rowWidth: spec.vocabSize, maxRows: limits.maxSeqs, dtype: 'f32' }, { nccl: prepared.nccl });
        this.homeLogits = home.backend.alloc({ dtype: 'f32', length: limits.maxSeqs * spec.vocabSize, usage: 'activations', label: 'tp.home_logits' });
      }
    } catch (e) {
      this.disposeParts();
      throw e;
    }
    this.meta = this.grid[0][0].meta;
    this.stackable = this.grid.every((row) => row[0].stackable);
    this.kvBytes = this.runners.reduce((t, r) => t + r.kvBytes, 0);
  }

  /** The logits the engine reads: on stage 0's shard 0 (brought home by `logitsHome` when the last stage is elsewhere). */
  get logits(): DeviceBuffer {
    return this.homeLogits ?? this.grid[this.grid.length - 1][0].logits;
  }

  /** Every shard gets the pass's meta (positions, slots, block tables: its KV slice is paged alike); the sampler's parameters go to the last stage's shard 0. */
  writeMeta(h: StepBuffers, rows: number, nl: number, withSampling: boolean): void {
    const S = this.grid.length;
    this.grid.forEach((row, s) => row.forEach((r, k) => writeStepMeta(r.backend, r, h, rows, nl, withSampling && k === 0 && s === S - 1)));
  }

  forward(rows: number, nLogits: number): void {
    const S = this.grid.length;
    // Every shard decides alike (same rows, logits, capabilities); shard 0 of stage 0 speaks for them.
    const fused = this.grid[0][0].fusedPass(rows, nLogits, this.stackable);
    for (let s = 0; s < S; s++) {
      const R = this.grid[s];
      const G = this.stageGathers[s];
      if (s === 0) for (const r of R) r.embed(rows);
      else
        R.forEach((r, k) => {
          // Each shard's copy of the stream goes to the same shard of the next stage.
          this.handoffs[s - 1][k].send(this.grid[s - 1][k].hidden, rows);
          this.handoffs[s - 1][k].recv(r.hidden, rows);
        });
      for (let l = R[0].firstLayer; l < R[0].endLayer; l++) {
        for (const r of R) r.attention(l, rows, fused);
        G.attn.gather(R.map((r) => r.attnPart), R.map((r) => r.attnFull), rows);
        for (const r of R) r.oProjection(l, rows, fused);
        // Fused: the accumulated columns go back into the stream; else the o output is gathered whole.
        G.hidden.gather(R.map((r) => r.hiddenPart), R.map((r) => (fused ? r.hidden : r.oFull)), rows);
        for (const r of R) r.gateUp(l, rows, fused);
        G.mlp.gather(R.map((r) => r.mlpPart), R.map((r) => r.mlpFull), rows);
        for (const r of R) r.down(l, rows, fused);
        G.hidden.gather(R.map((r) => r.hiddenPart), R.map((r) => (fused ? r.hidden : r.mlpOut)), rows);
      }
      if (s + 1 < S) for (const r of R) r.finishStage(rows, fused);
    }
    if (nLogits === 0) return;
    const R = this.grid[S - 1];
    for (const r of R) r.headSlice(rows, nLogits, fused);
    this.headGather.gather(R.map((r) => r.headPart), [R[0].logits], nLogits);
  }

  /**
   * Sample the logit rows on the last stage's shard 0 into `out` (stage 0's meta buffer) and push
   * them into stage 0's token ring; from another backend the tokens travel over the token link.
   */
  sampleOnDevice(nLogits: number, out: DeviceBuffer): void {
    const last = this.grid[this.grid.length - 1][0];
    const home = this.grid[0][0];
    if (last === home) {
      home.sampleOnDevice(nLogits, out);
      return;
    }
    const lm = last.meta;
    const into = this.tokenLink ? lm.sampled : out;
    const V = last.spec.vocabSize;
    last.backend.run('sample', { logits: last.logits, params: lm.sampleParams, rng: lm.rng, out: into, rows: nLogits, vocab: V, ...(last.sampleLimit < V ? { limit: last.sampleLimit } : {}) });
    if (this.tokenLink) {
      this.tokenLink.send(lm.sampled, nLogits);
      this.tokenLink.recv(out, nLogits);
    }
    home.backend.run('ring_push', { src: out, ring: this.meta.ring, cursor: this.meta.ringCursor, rows: nLogits, capacity: this.limits.ringCapacity });
  }

  /** Bring the last stage's logits to stage 0's shard 0, where the engine reads them (a no-op when they are there). */
  logitsHome(nLogits: number): void {
    if (!this.logitsLink || nLogits === 0) return;
    this.logitsLink.send(this.grid[this.grid.length - 1][0].logits, nLogits);
    this.logitsLink.recv(this.homeLogits!, nLogits);
  }

  advance(_rows: number): void {
    throw new NervaError('TENSOR_PARALLEL_STATE', 'advance is part of a captured decode step; a tensor-parallel group runs its passes eagerly');
  }

  sampleStep(_rows: number, _out: DeviceBuffer): void {
    throw new NervaError('TENSOR_PARALLEL_STATE', 'sampleStep is part of a captured decode step; a tensor-parallel group runs its passes eagerly');
  }

  setProfiling(on: boolean, maxEvents?: number): void {
    for (const r of this.runners) r.setProfiling(on, maxEvents);
  }

  takeProfile(ops?: Record<string, number>): Record<ProfileBucket, number> {
    return sumProfiles(this.runners, ops);
  }

  stats(): BackendStats {
    return sumBackendStats(this.distinct);
  }

  /** Each shard's stage, backend, slices, weight and KV bytes (its residency), and the links between shards. */
  describe(): TensorParallelDescription {
    const span = (o: number, w: number): [number, number] => [o, o + w];
    const n = this.geometry.length;
    return {
      stages: this.grid.length,
      shards: this.cells.map((c, i) => {
        const g = this.geometry[i % n];
        return {
          stage: Math.floor(i / n),
          layers: [c.firstLayer, c.endLayer] as [number, number],
          backend: c.backend.name,
          ...(c.device !== undefined ? { device: c.device } : {}),
          qHeads: span(g.qHeadOffset, g.qHeads),
          kvHeads: span(g.kvHeadOffset, g.kvHeads),
          hidden: span(g.hidden.offset, g.hidden.width),
          inter: span(g.inter.offset, g.inter.width),
          vocab: span(g.vocab.offset, g.vocab.width),
          weightBytes: c.weights.bytes,
          kvBytes: this.runners[i].kvBytes,
        };
      }),
      links: [...new Set([...this.gathers.flatMap((x) => x.linkKinds), ...this.handoffs.flat().map((l) => l.kind)])],
      shared: this.distinct.length === 1,
    };
  }

  private disposeParts(): void {
    for (const g of this.gathers) g.close();
    this.gathers.length = 0;
    for (const l of [...this.handoffs.flat(), this.tokenLink, this.logitsLink]) l?.close();
    if (this.homeLogits) this.grid[0][0].backend.free(this.homeLogits);
    for (const r of this.runners) r.dispose();
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.disposeParts();
  }
}
