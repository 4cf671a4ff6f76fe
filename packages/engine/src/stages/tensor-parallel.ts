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
 * Not yet: MoE layers (refused), pipeline stages around a group (refused), memory budgets and
 * tiered KV (refused), graph capture of a group's steps (passes run eagerly).
 *
 * On GPUs the same structure holds, with two conditions for bit equality the CPU backend meets by
 * construction (float64 accumulation per element, whatever the output count): a kernel whose
 * reduction order depends on the output count (a GEMV's split-K chosen by outDim, a GEMM's tile
 * shape chosen by N) must be pinned to the one-device choice for the shard's narrower projection,
 * and the gathers (here links and per-row copies) want one NCCL all-gather per exchange or
 * peer-to-peer stores from the producing kernel, inside a captured decode graph.
 */
import type { BackendStats, DeviceBackend, DeviceBuffer } from '@nerva/core';
import { NervaError } from '@nerva/core';
import type { ModelSpec, WeightStore } from '@nerva/models';
import { backendFactory, type StageCommunicator } from '../backend-registry.js';
import { type BackendOptions, selectBackend } from '../backend-select.js';
import { PROFILE_BUCKETS, type ProfileBucket, type RunnerLimits, type RunnerMeta } from '../model-runner.js';
import { freeWeights, type ModelWeights, type UploadProgress } from '../model-weights.js';
import { type StepBuffers, writeStepMeta } from '../step-batch.js';
import { ShardGather } from './all-gather.js';
import type { PassRunner, PipelineStage, PreparedStages } from './pipeline.js';
import { sumBackendStats } from './pipeline.js';
import { planStages } from './plan.js';
import { ShardRunner } from './shard-runner.js';
import { shardGeometry, shardSpec, TensorParallelConfigError, type ShardGeometry, uploadShardWeights } from './shard-weights.js';

export { TensorParallelConfigError } from './shard-weights.js';

/** The tensor-parallel fields of EngineOptions (and those it does not compose with yet). */
export interface TensorParallelOptions {
  tensorParallel?: number;
  allowSingleDeviceStages?: boolean;
  pipelineParallel?: number;
  stageDevices?: number[];
  vramBudget?: number;
  hostBudget?: number;
  kvVramBudget?: number;
}

export interface TensorParallelRequest {
  shards: number;
  allowSingleDevice: boolean;
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
  if ((o.pipelineParallel !== undefined && o.pipelineParallel > 1) || (o.stageDevices !== undefined && o.stageDevices.length > 1))
    throw new TensorParallelConfigError(`tensorParallel ${n} with pipeline stages is not supported yet: run tensor parallelism or pipeline stages, not both`);
  if (o.vramBudget !== undefined || o.hostBudget !== undefined)
    throw new TensorParallelConfigError(`tensorParallel ${n} with a ${o.vramBudget !== undefined ? 'VRAM' : 'host'} budget is not supported yet: paged weights run on one backend`);
  if (o.kvVramBudget !== undefined) throw new TensorParallelConfigError(`tensorParallel ${n} with tiered KV (kvVramBudget) is not supported yet`);
  return { shards: n, allowSingleDevice: o.allowSingleDeviceStages === true };
}

/** A group's shards, as the model loaded them: PreparedStages' shape, each "stage" one shard of every layer. */
export interface PreparedShards extends PreparedStages {
  tensorParallel: true;
  geometry: ShardGeometry[];
}

export interface PrepareShardsArgs {
  request: TensorParallelRequest;
  /** The engine's backend: shard 0 runs on it (and samples). */
  primary: DeviceBackend;
  spec: ModelSpec;
  ckpt: WeightStore;
  backendOptions: BackendOptions;
  kvPlanned: number | undefined;
  kvAfterUpload: (backend: DeviceBackend, activationBytes: number) => number;
  activationBytes: number;
  onProgress?: (p: UploadProgress) => void;
}

/**
 * Place the shards: check the model splits N ways, make a backend per shard (CPU: a CPU backend
 * each; CUDA: a GPU each, or every shard on the engine's GPU with allowSingleDeviceStages),
 * upload each shard's weights, and make the NCCL communicator when shards sit on separate GPUs.
 */
export async function prepareShards(a: PrepareShardsArgs): Promise<PreparedShards> {
  const { request: req, primary, spec } = a;
  const n = req.shards;
  const geometry = shardGeometry(spec, n);
  const kind = primary.capabilities.deviceKind;
  const notes: string[] = [];
  // Every shard on the engine's backend object: asked for on the CPU backend (a test of the
  // one-backend links a one-GPU machine uses), forced on a GPU machine with fewer GPUs than shards.
  let shared = kind === 'cpu' && req.allowSingleDevice;
  if (kind !== 'cpu') {
    const count = primary.capabilities.deviceCount;
    if (count < n && !req.allowSingleDevice)
      throw new TensorParallelConfigError(`tensorParallel ${n} needs ${n} GPUs, but ${count} ${count === 1 ? 'is' : 'are'} visible; --allow-single-device-stages places every shard on one GPU, to test the split`);
    shared = count < n;
  }
  const owned: DeviceBackend[] = [];
  const made: { backend: DeviceBackend; weights: ModelWeights }[] = [];
  let primaryWeights: ModelWeights | undefined;
  let nccl: StageCommunicator | undefined;
  let disposed = false;
  const dispose = () => {
    if (disposed) return;
    disposed = true;
    for (const m of made) freeWeights(m.backend, m.weights);
    nccl?.destroy();
    for (const b of owned) b.dispose();
  };
  try {
    const backends: DeviceBackend[] = [primary];
    for (let k = 1; k < n; k++) {
      if (shared) {
        backends.push(primary);
        continue;
      }
      const b = (await selectBackend(kind === 'cpu' ? 'cpu' : 'cuda', { ...a.backendOptions, device: k })).backend;
      owned.push(b);
      backends.push(b);
    }
    const stages: PipelineStage[] = [];
    let weightBytes = 0;
    for (let k = 0; k < n; k++) {
      const w = await uploadShardWeights(backends[k], spec, a.ckpt, geometry[k], a.onProgress);
      if (k === 0) primaryWeights = w;
      else made.push({ backend: backends[k], weights: w });
      weightBytes += w.bytes;
      stages.push({ backend: backends[k], weights: w, firstLayer: 0, endLayer: spec.numLayers, ...(shared ? {} : { device: k, rank: k }) });
    }
    if (!shared && kind !== 'cpu') {
      const communicator = backendFactory(kind)?.communicator;
      try {
        if (!communicator) throw new Error(`the ${kind} backend registers no communicator`);
        nccl = await communicator(backends);
        notes.push(`tensor-parallel links: ${nccl.description}`);
      } catch (e) {
        throw new TensorParallelConfigError(`tensor-parallel shards on GPUs 0-${n - 1} need NCCL: ${(e as Error).message}`, { cause: e });
      }
    }
    let kvBytes = a.kvPlanned;
    if (kvBytes === undefined) {
      // Each shard holds 1/N of every layer's KV: the tightest backend decides the whole cache.
      const per = shared ? a.kvAfterUpload(primary, a.activationBytes * n) : Math.min(...backends.map((b) => a.kvAfterUpload(b, a.activationBytes)));
      kvBytes = Math.floor(shared ? per : per * n);
    }
    const where = shared ? `every shard on one ${kind === 'cpu' ? 'backend' : 'GPU'} (allowSingleDeviceStages): a test of the split, not a speedup` : kind === 'cpu' ? `a CPU backend per shard` : `GPUs 0-${n - 1}`;
    notes.push(
      `tensor parallel: ${n} shards (${geometry[0].qHeads} q / ${geometry[0].kvHeads} KV heads each), ${where}; all-gathers after attention, o, gate_up and down; LM head split by vocabulary rows, sampled on shard 0; passes run without graph capture`,
    );
    return { plan: planStages(spec.numLayers, 1), stages, shared, microBatches: 1, kvBytes, weightBytes, ...(nccl ? { nccl } : {}), notes, dispose, tensorParallel: true, geometry };
  } catch (e) {
    dispose();
    if (primaryWeights) freeWeights(primary, primaryWeights);
    throw e;
  }
}

/** Whether prepared stages are a tensor-parallel group's shards. */
export function isPreparedShards(p: PreparedStages): p is PreparedShards {
  return (p as Partial<PreparedShards>).tensorParallel === true;
}

/** What a group reports: its shards' backends and slices. */
export interface TensorParallelDescription {
  shards: { backend: string; device?: number; qHeads: [number, number]; kvHeads: [number, number]; hidden: [number, number]; inter: [number, number]; vocab: [number, number]; weightBytes: number; kvBytes: number }[];
  links: string[];
  shared: boolean;
}

/**
 * A tensor-parallel group driven by the engine as it drives one runner (see PassRunner): the
 * engine writes the meta (every shard gets it), runs `forward`, and samples on shard 0 or reads
 * shard 0's logits.
 */
export class TensorParallelGroup implements PassRunner {
  readonly runners: ShardRunner[] = [];
  readonly limits: RunnerLimits;
  readonly kvBytes: number;
  hostComputeBytes = 0;
  hostReadBytes = 0;
  /** Passes interleave shards and gathers on the host: no decode graph. */
  readonly capturable = false;
  readonly meta: RunnerMeta;
  private readonly shards: PipelineStage[];
  private readonly geometry: ShardGeometry[];
  private readonly gathers: ShardGather[] = [];
  private readonly attnGather: ShardGather;
  private readonly hiddenGather: ShardGather;
  private readonly mlpGather: ShardGather;
  private readonly headGather: ShardGather;
  private readonly distinct: DeviceBackend[];
  private disposed = false;

  constructor(spec: ModelSpec, limits: RunnerLimits, prepared: PreparedShards) {
    this.limits = limits;
    this.shards = prepared.stages;
    this.geometry = prepared.geometry;
    this.distinct = [...new Set(this.shards.map((s) => s.backend))];
    const hd = spec.headDim;
    try {
      this.shards.forEach((st, k) => this.runners.push(new ShardRunner(st.backend, spec, shardSpec(spec, this.geometry[k]), st.weights, limits, this.geometry[k])));
      const ends = this.shards.map((s) => ({ backend: s.backend, ...(s.rank !== undefined ? { rank: s.rank } : {}) }));
      const g = this.geometry;
      const make = (slices: { offset: number; width: number }[], total: number, rows: number, label: string, to?: number[]) => {
        const x = new ShardGather(ends, slices, total, rows, label, to, prepared.nccl);
        this.gathers.push(x);
        return x;
      };
      this.attnGather = make(g.map((x) => ({ offset: x.qHeadOffset * hd, width: x.qHeads * hd })), spec.numHeads * hd, limits.maxRows, 'tp.attn');
      this.hiddenGather = make(g.map((x) => x.hidden), spec.hiddenSize, limits.maxRows, 'tp.hidden');
      this.mlpGather = make(g.map((x) => x.inter), spec.intermediateSize, limits.maxRows, 'tp.mlp');
      // Logits are gathered to shard 0 only: it samples, and the engine reads its logits.
      this.headGather = make(g.map((x) => x.vocab), spec.vocabSize, limits.maxSeqs, 'tp.logits', [0]);
    } catch (e) {
      this.disposeParts();
      throw e;
    }
    this.meta = this.runners[0].meta;
    this.kvBytes = this.runners.reduce((t, r) => t + r.kvBytes, 0);
  }

  get logits(): DeviceBuffer {
    return this.runners[0].logits;
  }

  /** Every shard gets the pass's meta (positions, slots, block tables: its KV slice is paged alike). */
  writeMeta(h: StepBuffers, rows: number, nl: number, withSampling: boolean): void {
    this.runners.forEach((r, k) => writeStepMeta(this.shards[k].backend, r, h, rows, nl, withSampling && k === 0));
  }

  forward(rows: number, nLogits: number): void {
    const R = this.runners;
    // Every shard decides alike (same rows, logits, capabilities); shard 0 speaks for them.
    const fused = R[0].fusedPass(rows, nLogits);
    for (const r of R) r.embed(rows);
    const L = R[0].spec.numLayers;
    for (let l = 0; l < L; l++) {
      for (const r of R) r.attention(l, rows, fused);
      this.attnGather.gather(R.map((r) => r.attnPart), R.map((r) => r.attnFull), rows);
      for (const r of R) r.oProjection(l, rows, fused);
      // Fused: the accumulated columns go back into the stream; else the o output is gathered whole.
      this.hiddenGather.gather(R.map((r) => r.hiddenPart), R.map((r) => (fused ? r.hidden : r.oFull)), rows);
      for (const r of R) r.gateUp(l, rows, fused);
      this.mlpGather.gather(R.map((r) => r.mlpPart), R.map((r) => r.mlpFull), rows);
      for (const r of R) r.down(l, rows, fused);
      this.hiddenGather.gather(R.map((r) => r.hiddenPart), R.map((r) => (fused ? r.hidden : r.mlpOut)), rows);
    }
    if (nLogits === 0) return;
    for (const r of R) r.headSlice(rows, nLogits, fused);
    this.headGather.gather(R.map((r) => r.headPart), [R[0].logits], nLogits);
  }

  sampleOnDevice(nLogits: number, out: DeviceBuffer): void {
    this.runners[0].sampleOnDevice(nLogits, out);
  }

  /** The logits are on shard 0 (the engine's backend) after forward. */
  logitsHome(_nLogits: number): void {}

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
    const out = Object.fromEntries(PROFILE_BUCKETS.map((b) => [b, 0])) as Record<ProfileBucket, number>;
    for (const r of this.runners) for (const [k, v] of Object.entries(r.takeProfile(ops))) out[k as ProfileBucket] += v;
    return out;
  }

  stats(): BackendStats {
    return sumBackendStats(this.distinct);
  }

  /** Each shard's backend, slices, weight and KV bytes (its residency), and the links between shards. */
  describe(): TensorParallelDescription {
    const span = (o: number, w: number): [number, number] => [o, o + w];
    return {
      shards: this.shards.map((s, k) => {
        const g = this.geometry[k];
        return {
          backend: s.backend.name,
          ...(s.device !== undefined ? { device: s.device } : {}),
          qHeads: span(g.qHeadOffset, g.qHeads),
          kvHeads: span(g.kvHeadOffset, g.kvHeads),
          hidden: span(g.hidden.offset, g.hidden.width),
          inter: span(g.inter.offset, g.inter.width),
          vocab: span(g.vocab.offset, g.vocab.width),
          weightBytes: s.weights.bytes,
          kvBytes: this.runners[k].kvBytes,
        };
      }),
      links: this.hiddenGather.linkKinds,
      shared: this.distinct.length === 1,
    };
  }

  private disposeParts(): void {
    for (const g of this.gathers) g.close();
    this.gathers.length = 0;
    for (const r of this.runners) r.dispose();
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.disposeParts();
  }
}
