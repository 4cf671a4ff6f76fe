import type { BackendStats, DeviceBackend, EventHandle, GraphHandle, MatmulPrecision, Numerics, TokenLedgerRecord } from '@nerva/core';
import { emptySyncCounts, LedgerAggregator, MATMUL_PRECISIONS, NervaError, NUMERICS, SYNC_KINDS } from '@nerva/core';
import { KvCacheManager } from '@nerva/kv';
import type { ModelSpec, NervaTokenizer } from '@nerva/models';
import { createDetokenizer, kvReadWindow, loadModelDir } from '@nerva/models';
import { type BackendChoice, selectBackend } from './backend-select.js';
import { HostSampler } from './host-sampler.js';
import { ModelRunner } from './model-runner.js';
import { type PassRunner, type PipelineDescription, pipelineRequest, type PreparedStages, prepareStages, StagePipeline } from './pipeline.js';
import { freeWeights, KV_CACHE_DTYPES, type KvCacheDtype, kvDtypeOf, type ModelWeights, type UploadProgress, uploadWeights } from './model-weights.js';
import { type FinishReason, Request, type TokenEvent } from './request.js';
import { type RequestLimits, validateForkCount, validateRequest } from './request-validation.js';
import { isDeviceSamplable, type SamplingParams } from './sampling-params.js';
import { Scheduler, type SchedulerOutput } from './scheduler.js';
import { TokenStream } from './token-stream.js';
import { hostChannels, measureRates, type MeasuredRates } from './rates.js';
import { planKvTiers, stageSpan, TieredKv, validateKvTiers } from './kv-tiering.js';
import { checkpointImportanceKey, kvBytesPerToken, memoryReport, placeWeights, type RunnerShape, validateResidency } from './weight-residency.js';
import { defaultImportanceDir, ImportanceCache, ImportanceMeter, type ImportanceProfile, type MemoryReport, type PagerStats, type WeightPager } from '@nerva/memos';

export interface EngineOptions {
  /** A model folder (config.json + safetensors [+ tokenizer.json]). */
  model: string;
  /** 'auto' tries CUDA, then falls back to the CPU reference (recorded in every ledger). */
  backend?: BackendChoice | DeviceBackend;
  maxNumSeqs?: number;
  /** Token budget of one scheduler step (also the largest prefill chunk). */
  maxNumBatchedTokens?: number;
  blockSize?: number;
  /** Bytes reserved for the paged KV cache. */
  kvCacheBytes?: number;
  /**
   * KV cache element type: 'auto' (default: f32 under exact numerics, bf16 under bf16 numerics),
   * 'f32', or 'bf16' (keys and values rounded once when stored, half the bytes a token: twice the
   * tokens in the same memory, and half the bytes decode attention reads). See kvDtypeOf.
   */
  kvCacheDtype?: 'auto' | KvCacheDtype;
  maxModelLen?: number;
  enablePrefixCaching?: boolean;
  /** Replay captured decode graphs where the backend supports them (default true). */
  useGraphs?: boolean;
  /**
   * Enqueue the next decode step's graph before waiting for this step's tokens, so the device
   * never idles while the host accepts tokens and schedules (default: on where the device
   * computes apart from the host, computeTier 'vram', and the backend has synchronizeEvent). The
   * step ahead is taken when the next step is the same pass (same rows, no request waiting, none
   * at its last token; a row whose next position starts a KV block gets the block one step
   * early); otherwise it is waited for and dropped, which costs device time, never results: the
   * host then rewrites the step state the device advanced.
   */
  runAhead?: boolean;
  /**
   * Decode steps one graph replay enqueued ahead may run (default 4): a replay of k steps is the
   * step's graph captured k times in a row, so the ~4 us between two replays (and the timed event
   * between them) falls on one step of k. Steps of a replay are timed together (each gets the
   * replay's device time / k) and their tokens are seen together. The engine keeps up to 2k - 1
   * steps enqueued; a request arriving meanwhile is admitted when they are done (they are kept,
   * not dropped), so k is also bounded by `runAheadMs`. 1: one step a replay, as before.
   */
  runAheadSteps?: number;
  /**
   * Device time (ms) the steps enqueued ahead may hold (default 8): replays run `runAheadSteps`
   * steps only while 2 * runAheadSteps - 1 steps of the last step's device time fit, else one.
   * So a model whose steps take milliseconds (an 8B) runs one step a replay and an arriving
   * request waits at most one step more, while a 0.6B's ~0.6 ms steps run four a replay.
   * Infinity: always `runAheadSteps`.
   */
  runAheadMs?: number;
  /** Split device time per token into buckets (disables graphs: ops are timed one by one). */
  profile?: boolean;
  /** Upload progress, for a progress bar. */
  onProgress?: (p: UploadProgress) => void;
  /** Bytes of device memory the CUDA backend reserves, when the engine creates it. */
  deviceArenaBytes?: number;
  /**
   * Pipeline stages (default 1): the decoder layers split into this many contiguous ranges, each
   * run by a stage of its own, hidden states passed between them (`StagePipeline`). On CUDA, N > 1
   * needs N visible GPUs (one backend per GPU, NCCL links) unless `allowSingleDeviceStages`. The
   * CPU backend allows any N: its stages share one backend and host memory. N may not exceed the
   * model's layers, and memory budgets (`vramBudget`, `hostBudget`) are not supported with N > 1.
   */
  pipelineParallel?: number;
  /** Place every stage on one GPU (device-copy links): tests the pipeline on a one-GPU machine. */
  allowSingleDeviceStages?: boolean;
  /**
   * The device of each stage (CUDA ordinals; sets pipelineParallel). On the CPU backend, distinct
   * ordinals give stages CPU backends of their own (the multi-backend path, with host links).
   */
  stageDevices?: number[];
  /** Micro-batches per pipelined pass (default: 1 when stages share a backend, N otherwise). */
  pipelineMicroBatches?: number;
  /**
   * Activation rounding of the backend the engine creates (default 'exact'). 'bf16' reproduces
   * transformers' bf16 eager forward rounding for rounding (weights and KV then bf16); see
   * `Numerics` in @nerva/core. With a backend object, its own numerics apply and this must agree.
   */
  numerics?: Numerics;
  /**
   * Precision of matmuls over more than 8 rows (prefill chunks, large decode batches) on the
   * backend the engine creates: 'exact' (the default; f32-grade, on CUDA two split-bf16 tensor-core
   * GEMMs) or 'bf16' (activations rounded to bf16 once before the product, fp32 accumulation, one
   * GEMM: PyTorch bf16's rounding, about twice the prefill GEMM rate; on CUDA the prefill
   * attention's tensor-core products run in plain bf16 too). Default from NERVA_MATMUL when set.
   * See `MatmulPrecision` in @nerva/core. With a backend object, its own precision applies and
   * this must agree.
   */
  matmulPrecision?: MatmulPrecision;
  /**
   * Batch-invariant decode on the CUDA backend the engine creates (default: NERVA_BATCH_INVARIANT,
   * else off): each decode row, and each sampled logit row, is computed bit for bit as the request
   * would compute it alone, whatever else shares the step, so N forks of a prompt decoded
   * together give the tokens of N runs one by one. Large decode batches lose the tensor-core
   * GEMMs (see CudaBackendOptions.batchInvariant). With a backend object, true must agree with
   * its capabilities.batchInvariant. The CPU backend ignores it.
   */
  batchInvariant?: boolean;
  /**
   * Bytes of compute-tier memory (VRAM on CUDA) the engine may use for everything: hot weights,
   * weight staging slots, KV cache and activations. When the weights do not fit, the memory OS
   * (`@nerva/memos`) keeps some layers hot and streams the rest through a ring of staging slots,
   * ahead of use; the result is the same tokens as the fully resident run.
   */
  vramBudget?: number;
  /** Bytes of host memory (pinned on CUDA) for streamed weight blocks; beyond it blocks spill to `offloadDir`. */
  hostBudget?: number;
  /** Directory for the disk tier: weight blocks the host budget cannot hold are spilled here. */
  offloadDir?: string;
  /**
   * Compute near data for streamed layers: part of each streamed layer's MLP is computed on the
   * host CPU, where its weights lie, while the rest streams to the device. 'auto' (the default)
   * splits by rates measured at start-up (host-to-device copies against the host computing, run
   * together) on a device backend with bf16 weights; 'off' streams everything; a number in (0, 1)
   * forces that fraction of the MLP channels (tests, experiments). Float32 math either way; only
   * the order of one sum changes.
   */
  hostCompute?: 'auto' | 'off' | number;
  /**
   * Directory of cached per-layer importance profiles (MCAP-style; default
   * $XDG_CACHE_HOME/nerva/importance), or false for none. Under a budget the planner keeps the
   * most important layers hot; a paged engine without a profile calibrates one at start (one
   * short prompt) and saves it for the next start.
   */
  importanceCache?: string | false;
  /**
   * Tiered KV (KV pages as virtual memory): bytes of the hot KV pool in the compute tier (VRAM on
   * CUDA). Pages that do not fit are demoted to a warm pool in pinned host memory
   * (`kvHostBudget`) and, past it, to disk (`kvOffloadDir`); the attention sinks and the recent
   * window stay hot. Attention over warm pages runs on the host where they lie and is merged with
   * the device's partial by the online-softmax rule, so the tokens are those of the all-hot run.
   * Sets the KV cache size (overrides `kvCacheBytes`).
   */
  kvVramBudget?: number;
  /** Bytes of the warm KV pool (pinned host memory). Default with `kvVramBudget`: 8x the hot pool. */
  kvHostBudget?: number;
  /** Directory for cold KV pages (swapped-out sequences); checked up front like `offloadDir`. */
  kvOffloadDir?: string;
  /**
   * Tiered KV: the share (0..1) of the warm pool that the device attends over itself (its
   * leading slots; warm slots are handed out lowest first) while the host CPU computes over the
   * pages in the slots above. Those pages stream through VRAM: each layer's are copied over the
   * link from the pinned pool one layer ahead by the copy engine (a stream of their own, two
   * staging buffers of that share of the warm pool each), so the copy overlaps the layers before.
   * The three partials (hot, staged, host) merge by the online-softmax rule, so the tokens stay
   * those of the all-hot run. Default where the compute tier is VRAM: as much of the warm pool as
   * a staging of a quarter of kvVramBudget holds (1, every warm page staged and no host round
   * trip, when the whole pool fits); 0 on a backend that computes in host memory. A page that several
   * sequences share is staged once.
   */
  kvWarmLinkShare?: number;
  /**
   * Sliding-window models whose every layer slides (ModelSpec.layerWindows): give KV pages that
   * fell wholly behind every layer's window back to the pool as sequences advance (default true),
   * so a sequence holds about window / blockSize + 1 pages however long it runs. The tokens are
   * those of the run that keeps every page. No effect when some layer attends to every position
   * (nothing is ever out of its reach) or the model has no window.
   */
  kvFreeOutsideWindow?: boolean;
}

export interface GenerateOptions extends SamplingParams {
  /** Lower values run first (vLLM's convention). */
  priority?: number;
  signal?: AbortSignal;
  /** Separates the prefix cache between tenants. */
  cacheSalt?: string;
  /** Keep the raw logits of the last prompt position in the outcome (`promptLogits`). */
  returnPromptLogits?: boolean;
  /** Keep the raw logits of every generated position in the outcome (`stepLogits`). */
  returnStepLogits?: boolean;
  /**
   * Teacher forcing: emit these tokens instead of sampling (scoring and parity checks); the
   * request ends after them. Logits are still computed at every step.
   */
  forceTokens?: readonly number[];
}

export interface StepSignals {
  time: number;
  running: number;
  waiting: number;
  kvUsage: number;
  prefixQueries: number;
  prefixHits: number;
  preemptions: number;
  scheduledTokens: number;
  promptTokens: number;
  generationTokens: number;
  stepMs: number;
  /**
   * KV blocks in this step's block tables that two or more of its sequences read (shared-prefix
   * forks, prefix-cache hits): what a kernel reading each shared block once per step for all its
   * readers (block-projection batching) would read once.
   */
  sharedBlocks: number;
  /** Reads of those blocks beyond the first, summed: the block reads such a kernel would save in this step. */
  sharedBlockReads: number;
  /**
   * Decode steps enqueued ahead and dropped since the engine started (EngineOptions.runAhead):
   * device time spent on tokens no request took (a request that stopped on a token, an abort).
   */
  droppedSteps: number;
}

export interface RequestOutcome {
  requestId: number;
  promptIds: readonly number[];
  tokenIds: number[];
  text: string;
  finishReason: FinishReason;
  stopReason?: string | number;
  numCachedTokens: number;
  /** Raw logits at the last prompt position, when asked for with `returnPromptLogits`. */
  promptLogits?: Float32Array;
  /** Raw logits before each generated token, when asked for with `returnStepLogits`. */
  stepLogits?: Float32Array[];
  times: Request['times'];
  ledger: LedgerAggregator;
}

export interface RequestHandle {
  readonly id: number;
  readonly events: AsyncIterable<TokenEvent>;
  readonly done: Promise<RequestOutcome>;
  abort(): void;
}

export class EngineError extends NervaError {}

/** Profiled steps Engine.takeProfiles keeps between calls (the latest). */
export const PROFILES_KEPT = 1024;

/** Device time of one profiled step by op (Engine.setProfiling, Engine.takeProfiles). */
export interface PassProfile {
  /** Token rows of the step. */
  rows: number;
  /** Device time of the whole step (its start and end events). */
  deviceMs: number;
  /** By coarse bucket (PROFILE_BUCKETS). */
  buckets: Record<string, number>;
  /** By op class: the projection of each matmul (gemm_qkv, gemm_o, gemm_gate_up, gemm_down, lm_head), else the op's name. */
  ops: Record<string, number>;
}

interface Live {
  req: Request;
  stream: TokenStream<TokenEvent>;
  resolve: (o: RequestOutcome) => void;
  detok?: ReturnType<typeof createDetokenizer>;
  text: string;
  emitted: number;
  ledger: LedgerAggregator;
  cleanup?: () => void;
  wantPromptLogits: boolean;
  promptLogits?: Float32Array;
  stepLogits?: Float32Array[];
  forced?: readonly number[];
}

const BUCKETS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256];
/** The most steps one decode replay runs (EngineOptions.runAheadSteps): each is a graph copy of the step. */
const MAX_RUN_AHEAD_STEPS = 16;

/** A decode step enqueued ahead: the pass it is (its schedule's key) and the events that time it. */
interface AheadStep {
  key: string;
  bucket: number;
  start: EventHandle;
  end: EventHandle;
  /** Steps of its replay (they share start and end). */
  share: number;
}

/**
 * The inference VM: a model on a backend, a paged KV cache, a continuous-batching scheduler and
 * a step loop. `generate` streams tokens of one request; any number run concurrently and are
 * batched together, with results identical to running alone (same seed).
 */
export class Engine {
  readonly spec: ModelSpec;
  readonly tokenizer: NervaTokenizer | undefined;
  readonly backend: DeviceBackend;
  readonly notes: string[];
  /**
   * The rates compute near data was planned from (measured at start-up, host-to-device copies and
   * the host MLP together), when the engine measured them: paged weights with hostCompute 'auto'.
   */
  readonly measuredRates?: MeasuredRates;
  readonly modelDir: string;
  readonly maxModelLen: number;
  /** The KV cache's element type (EngineOptions.kvCacheDtype resolved against the backend). */
  readonly kvDtype: KvCacheDtype;
  /** Many-row matmul precision the backend runs (EngineOptions.matmulPrecision; capabilities.matmulPrecision). */
  readonly matmulPrecision: MatmulPrecision;
  readonly eosTokenIds: readonly number[];
  readonly kv: KvCacheManager;
  readonly weightBytes: number;
  /** Sampling defaults from the model's generation_config.json (used by front ends when a request leaves them out). */
  readonly generationDefaults: Pick<SamplingParams, 'temperature' | 'topK' | 'topP' | 'minP' | 'repetitionPenalty'>;
  private readonly runner: PassRunner;
  /** The stages, when the model runs as a pipeline (pipelineParallel > 1); `runner` is then this. */
  private readonly pipeline: StagePipeline | undefined;
  private readonly weights: ModelWeights;
  private readonly pager: WeightPager | undefined;
  private readonly budgets: { vramBudget?: number; hostBudget?: number; offloadDir?: string };
  private readonly scheduler: Scheduler;
  /** Tiered KV (kvVramBudget): the page policy and its moves; undefined when all KV is hot. */
  private readonly kvTiers: TieredKv | undefined;
  /** Every layer slides and pages behind this window are freed (0: none are). */
  private readonly kvWindow: number;
  private readonly sampler: HostSampler;
  /** Ids sampled are below this: the tokenizer's id space within the checkpoint's vocab. */
  private readonly sampleLimit: number;
  private readonly live = new Map<number, Live>();
  /** Captured decode graphs by bucket, tiered or not, and (tiered) the staging span they copy. */
  private readonly graphs = new Map<string, GraphHandle>();
  /** Host-slice weight bytes one replay of each captured bucket computes. */
  private readonly replayHostBytes = new Map<string, number>();
  private readonly useGraphs: boolean;
  private profile: boolean;
  /** The op-level device times of the profiled steps since takeProfiles (at most PROFILES_KEPT, the latest). */
  private profiles: PassProfile[] = [];
  private readonly stepListeners = new Set<(s: StepSignals) => void>();
  private readonly finishListeners = new Set<(o: RequestOutcome) => void>();
  private nextId = 1;
  /** Per-step marks of the KV blocks the step's tables read (StepSignals.sharedBlocks), by block id. */
  private readonly blockSeen: Int32Array;
  private readonly blockTwice: Int32Array;
  private blockStamp = 0;
  /** The engine created its backend (rather than being handed one), so it disposes it too. */
  private readonly ownsBackend: boolean;
  private looping = false;
  private disposed = false;
  private ringRead = 0;
  private graphKey: string | undefined;
  private totalPreemptions = 0;
  private readonly stage: {
    ids: Int32Array;
    pos: Int32Array;
    seq: Int32Array;
    slots: Int32Array;
    tables: Int32Array;
    /** Tiered KV: the warm slot of each block (-1 where it is not warm). */
    warmTables?: Int32Array;
    /** Tiered KV with kvWarmLinkShare: the staging index (its warm slot) of each block staged into VRAM (-1 elsewhere). */
    linkTables?: Int32Array;
    logitRows: Int32Array;
    params: Float32Array;
    rng: Int32Array;
  };
  /**
   * The step's device time is taken between these two events, over `stepShare` steps (a step
   * adopted from a replay of several takes that replay's events).
   */
  private startEv: EventHandle;
  private endEv: EventHandle;
  private stepShare = 1;
  /** Every event the engine made, each once (the fields above and `ahead` alias them). */
  private readonly events: EventHandle[];
  /** Whether decode steps are enqueued ahead of the host (EngineOptions.runAhead, resolved). */
  readonly runAhead: boolean;
  /** EngineOptions.runAheadSteps and runAheadMs, resolved. */
  readonly runAheadSteps: number;
  readonly runAheadMs: number;
  /** Device time of the last decode step taken from the graph path (ms; 0 before the first). */
  private lastDecodeMs = 0;
  /**
   * Decode steps enqueued ahead, oldest first (see EngineOptions.runAhead). A replay of k steps
   * gives k entries sharing its events: its start is the end event of whatever was enqueued
   * before it (no event of its own between two replays), its end is recorded after it.
   */
  private ahead: AheadStep[] = [];
  /** StepSignals.droppedSteps. */
  private droppedSteps = 0;

  private constructor(
    init: {
      dir: string;
      spec: ModelSpec;
      tokenizer?: NervaTokenizer;
      backend: DeviceBackend;
      notes: string[];
      weights: ModelWeights;
      eos: number[];
      generationConfig?: Record<string, unknown>;
      ownsBackend: boolean;
      shape: RunnerShape;
      kvBytes: number;
      stages?: PreparedStages;
      measuredRates?: MeasuredRates;
    },
    o: EngineOptions,
  ) {
    this.ownsBackend = init.ownsBackend;
    this.measuredRates = init.measuredRates;
    this.modelDir = init.dir;
    this.spec = init.spec;
    this.tokenizer = init.tokenizer;
    this.backend = init.backend;
    this.notes = init.notes;
    this.matmulPrecision = init.backend.capabilities.matmulPrecision ?? 'exact';
    if (this.matmulPrecision === 'bf16') {
      const attn = init.backend.capabilities.deviceKind === 'cuda' ? '; prefill attention runs plain bf16 tensor-core products' : '';
      this.notes.push(`matmul precision bf16: matmuls over more than 8 rows round their activations to bf16 once (fp32 accumulation)${attn}`);
    }
    this.weights = init.weights;
    this.weightBytes = init.stages?.weightBytes ?? init.weights.bytes;
    this.eosTokenIds = init.eos;
    this.generationDefaults = generationDefaults(init.generationConfig);
    const s = init.spec;
    const blockSize = o.blockSize ?? 16;
    this.maxModelLen = Math.min(s.maxPositionEmbeddings, o.maxModelLen ?? 4096);
    this.kvDtype = kvDtypeOf(this.backend, o.kvCacheDtype);
    const { maxRows, maxNumSeqs, kvBytesPerToken } = init.shape;
    const kvBytes = init.kvBytes;
    this.budgets = { vramBudget: o.vramBudget, hostBudget: o.hostBudget, offloadDir: o.offloadDir };
    if (o.kvVramBudget !== undefined && !this.backend.capabilities.ops.includes('attention_merge')) {
      throw new RangeError(`tiered KV (kvVramBudget) needs op attention_merge, which backend ${this.backend.name} does not have yet`);
    }
    // With KV in VRAM the device reads the warm pages itself over the link by default (as many as
    // a staging of a quarter of the hot budget holds): staged by the copy engine, it overlaps the
    // step and does not depend on the host's DRAM rate or cores (session 14, H100, 8B at 4096
    // tokens with KV 4x the hot budget: 0.81-0.85 of all-hot at share 1, 0.42 at 0). Where the
    // compute tier is host memory there is no link: the host attends.
    const tierPlan =
      o.kvVramBudget !== undefined
        ? planKvTiers(o, kvBytesPerToken * blockSize, this.backend.capabilities.computeTier === 'vram' ? { numLayers: s.numLayers } : undefined)
        : undefined;
    const numBlocks = tierPlan?.hotSlots ?? Math.max(2, Math.floor(kvBytes / (kvBytesPerToken * blockSize)));
    const maxBlocksPerSeq = Math.ceil(this.maxModelLen / blockSize);
    const limits = {
      maxRows,
      maxSeqs: maxNumSeqs,
      blockSize,
      numBlocks,
      maxBlocksPerSeq,
      ringCapacity: Math.max(4096, 4 * maxNumSeqs),
      ...(tierPlan ? { warmBlocks: Math.max(1, tierPlan.warmSlots) } : {}),
      // The link share: that share of the warm pool (its leading slots) is staged into VRAM, per
      // layer (two layers' worth in VRAM).
      ...(tierPlan && tierPlan.linkPages > 0 ? { linkPages: tierPlan.linkPages, linkOnly: tierPlan.linkPages >= Math.max(1, tierPlan.warmSlots) } : {}),
      kvDtype: this.kvDtype,
    };
    this.pipeline = init.stages ? new StagePipeline(s, limits, init.stages) : undefined;
    this.runner = this.pipeline ?? new ModelRunner(this.backend, s, this.weights, limits);
    // A checkpoint may have more embedding rows than its tokenizer has ids (Qwen pads to a
    // multiple of 128): ids past the tokenizer's are never sampled, on the device or the host.
    this.sampleLimit = Math.min(s.vocabSize, init.tokenizer?.vocabSize ?? s.vocabSize);
    for (const r of this.pipeline ? this.pipeline.runners : [this.runner as ModelRunner]) r.sampleLimit = this.sampleLimit;
    // With tiers, the manager's pages are every tier's slots; KvTiers maps each to its tier.
    const pages = tierPlan ? tierPlan.hotSlots + tierPlan.warmSlots + tierPlan.coldSlots : numBlocks;
    this.kv = new KvCacheManager({ numBlocks: pages, blockSize, enablePrefixCaching: o.enablePrefixCaching ?? true, maxBlocksPerSeq });
    try {
      this.kvTiers = tierPlan ? new TieredKv(this.kv.pool, tierPlan, this.backend, o.kvOffloadDir) : undefined;
    } catch (e) {
      this.runner.dispose();
      throw e;
    }
    const tiers = this.kvTiers?.tiers;
    // Every layer slides: pages behind the widest window are never read again (with a
    // full-attention layer anywhere, every page stays readable and nothing is freed early).
    this.kvWindow = (o.kvFreeOutsideWindow ?? true) ? kvReadWindow(s) : 0;
    if (this.kvWindow > 0) this.notes.push(`sliding window of ${this.kvWindow} tokens in every layer: KV pages behind it go back to the pool`);
    this.scheduler = new Scheduler(
      {
        maxNumBatchedTokens: maxRows,
        maxNumSeqs,
        // A prefill chunk writes its pages hot: at most what the hot pool has beside the window.
        ...(tiers ? { longPrefillTokenThreshold: (tiers.hotSlots - 1 - 2) * blockSize, kvFits: (held: number, written: number) => tiers.fits(held, written) } : {}),
        ...(this.kvWindow > 0 ? { kvReadWindow: this.kvWindow } : {}),
        // A batch-invariant backend: steps of decode rows only, or one prompt chunk alone.
        ...(init.backend.capabilities.batchInvariant === true ? { batchInvariant: true } : {}),
      },
      this.kv,
    );
    if (tierPlan) {
      this.notes.push(
        `tiered KV: ${tierPlan.hotSlots - 1} hot pages, ${tierPlan.warmSlots} warm (pinned host), ${tierPlan.coldSlots} cold (disk) of ${blockSize} tokens; attention over warm pages runs on the host and is merged exactly` +
          (tierPlan.linkShare > 0 ? ` (the device reads ${+tierPlan.linkShare.toFixed(3)} of the warm pool itself over the link)` : ''),
      );
    }
    this.sampler = new HostSampler(s.vocabSize, this.sampleLimit);
    this.profile = o.profile ?? false;
    this.pager = init.weights.pager;
    // Disk-tier reads are host work a replayed graph would skip: such a plan runs eagerly.
    this.useGraphs = (o.useGraphs ?? true) && this.backend.capabilities.graphCapture && !this.profile && (this.pager?.capturable ?? true) && (this.pipeline?.capturable ?? true);
    if (this.pager && !this.pager.capturable) this.notes.push('paged weights with a disk tier: decode steps run without graph capture');
    if (this.pager) for (const n of this.pager.plan.notes) this.notes.push(n);
    if (this.profile) this.runner.setProfiling(true);
    this.stage = {
      ids: new Int32Array(maxRows),
      pos: new Int32Array(maxRows),
      seq: new Int32Array(maxRows),
      slots: new Int32Array(maxRows),
      tables: new Int32Array(maxNumSeqs * maxBlocksPerSeq),
      ...(this.kvTiers ? { warmTables: new Int32Array(maxNumSeqs * maxBlocksPerSeq) } : {}),
      ...(limits.linkPages ? { linkTables: new Int32Array(maxNumSeqs * maxBlocksPerSeq) } : {}),
      logitRows: new Int32Array(maxNumSeqs),
      params: new Float32Array(maxNumSeqs * 4),
      rng: new Int32Array(maxNumSeqs * 2),
    };
    this.blockSeen = new Int32Array(pages);
    this.blockTwice = new Int32Array(pages);
    this.events = [0, 1].map(() => this.backend.createEvent());
    [this.startEv, this.endEv] = this.events;
    this.runAhead = this.useGraphs && this.backend.synchronizeEvent !== undefined && (o.runAhead ?? this.backend.capabilities.computeTier === 'vram');
    this.runAheadSteps = o.runAheadSteps ?? 4;
    this.runAheadMs = o.runAheadMs ?? 8;
  }

  /** Load a model folder onto a backend. Errors name the file and the problem. */
  static async create(o: EngineOptions): Promise<Engine> {
    // Pipeline options are checked before anything loads.
    const pipe = pipelineRequest(o);
    if (o.matmulPrecision !== undefined && !MATMUL_PRECISIONS.includes(o.matmulPrecision))
      throw new RangeError(`matmulPrecision must be ${MATMUL_PRECISIONS.join(' or ')}, got ${String(o.matmulPrecision)}`);
    if (o.runAheadSteps !== undefined && !(Number.isInteger(o.runAheadSteps) && o.runAheadSteps >= 1 && o.runAheadSteps <= MAX_RUN_AHEAD_STEPS))
      throw new RangeError(`runAheadSteps must be an integer from 1 to ${MAX_RUN_AHEAD_STEPS}, got ${JSON.stringify(o.runAheadSteps)}`);
    if (o.runAheadMs !== undefined && !(typeof o.runAheadMs === 'number' && o.runAheadMs >= 0))
      throw new RangeError(`runAheadMs must be a number of milliseconds (0 or more, Infinity allowed), got ${JSON.stringify(o.runAheadMs)}`);
    if (o.batchInvariant !== undefined && typeof o.batchInvariant !== 'boolean') throw new RangeError(`batchInvariant must be a boolean, got ${JSON.stringify(o.batchInvariant)}`);
    if (o.numerics !== undefined && !NUMERICS.includes(o.numerics)) throw new RangeError(`numerics must be ${NUMERICS.join(' or ')}, got ${String(o.numerics)}`);
    if (o.kvCacheDtype !== undefined && !KV_CACHE_DTYPES.includes(o.kvCacheDtype)) throw new RangeError(`kvCacheDtype must be ${KV_CACHE_DTYPES.join(', ')}, got ${String(o.kvCacheDtype)}`);
    validateResidency(o);
    validateKvTiers(o);
    // Options are checked before the checkpoint opens: a refused one leaves no file open.
    const loaded = await loadModelDir(o.model);
    let backend: DeviceBackend;
    let notes: string[] = [];
    let reservedBytes = 0;
    const budgeted = o.vramBudget !== undefined || o.hostBudget !== undefined;
    if (typeof o.backend === 'object') {
      backend = o.backend;
      const has = backend.capabilities.numerics ?? 'exact';
      const mp = backend.capabilities.matmulPrecision ?? 'exact';
      const mismatch =
        o.numerics !== undefined && o.numerics !== has
          ? `numerics '${o.numerics}' was asked for, but the given backend has '${has}'`
          : o.matmulPrecision !== undefined && o.matmulPrecision !== mp
            ? `matmulPrecision '${o.matmulPrecision}' was asked for, but the given backend has '${mp}'`
            : o.batchInvariant === true && backend.capabilities.batchInvariant !== true
              ? 'batchInvariant was asked for, but the given backend is not batch-invariant'
              : undefined;
      if (mismatch !== undefined) {
        await loaded.checkpoint.close();
        throw new RangeError(mismatch);
      }
    } else {
      try {
        let reserved: number | undefined;
        ({ backend, notes, reservedBytes: reserved } = await selectBackend(o.backend ?? 'auto', {
          deviceArenaBytes: o.deviceArenaBytes,
          ...(o.stageDevices !== undefined ? { device: o.stageDevices[0] } : {}),
          numerics: o.numerics,
          matmulPrecision: o.matmulPrecision,
          ...(o.batchInvariant !== undefined ? { batchInvariant: o.batchInvariant } : {}),
          ...(o.vramBudget !== undefined ? { deviceBudgetBytes: o.vramBudget } : {}),
          ...(o.hostBudget !== undefined ? { hostBudgetBytes: o.hostBudget } : {}),
          // Pinned host memory for the master copies of streamed blocks: at most the checkpoint.
          // Plus room for the runner's host buffers and the start-up rate measurement.
          ...(budgeted || o.kvVramBudget !== undefined ? { pinnedArenaBytes: pinnedBytesFor(o, loaded.spec, loaded.checkpoint.totalBytes, budgeted) } : {}),
        }));
        reservedBytes = reserved ?? 0;
      } catch (e) {
        await loaded.checkpoint.close();
        throw e;
      }
    }
    let weights: ModelWeights | undefined;
    let pager: WeightPager | undefined;
    let importance: { cache: ImportanceCache; key: string; profile?: ImportanceProfile } | undefined;
    let staged: PreparedStages | undefined;
    try {
      const shape = runnerShape(backend, loaded.spec, o);
      const maxModelLen = Math.min(loaded.spec.maxPositionEmbeddings, o.maxModelLen ?? 4096);
      const kvPlanned = kvCacheBytesFor(backend, shape, maxModelLen, o);
      const sp = loaded.spec;
      const be = backend;
      const splitFor = (attnBytes: number, mlpBytes: number): number => {
        const hc = o.hostCompute ?? 'auto';
        const I = sp.intermediateSize;
        if (hc === 'off' || sp.moe !== undefined) return 0;
        if (typeof hc === 'number') return Math.min(I - 64, Math.max(0, Math.round((hc * I) / 64) * 64));
        const caps = be.capabilities;
        if (caps.computeTier !== 'vram' || !caps.ops.includes('mlp_slice') || caps.numerics === 'bf16' || caps.weightDtype !== 'bf16') return 0;
        // The host kernels read bf16 weights: an f32 checkpoint (kept f32, exact) streams whole.
        if (loaded.checkpoint.info('model.layers.0.mlp.gate_proj.weight').dtype !== 'BF16') return 0;
        const rates = measureRates(be, sp.hiddenSize, true);
        measuredRates = rates;
        const c = hostChannels(rates, attnBytes, mlpBytes, I);
        measured = `measured at start-up, together: host->device ${rates.h2dGBs.toFixed(1)} GB/s, host MLP ${rates.hostMlpGBs?.toFixed(1)} GB/s -> host computes ${c} of ${I} channels`;
        return c;
      };
      let measured: string | undefined;
      let measuredRates: MeasuredRates | undefined;
      // The importance profile of this checkpoint, when one was calibrated before.
      const cache = budgeted && o.importanceCache !== false ? new ImportanceCache(o.importanceCache ?? defaultImportanceDir()) : undefined;
      if (cache) {
        importance = { cache, key: await checkpointImportanceKey(sp, loaded.checkpoint) };
        const got = cache.load(importance.key, sp.numLayers);
        importance.profile = got.profile;
        notes.push(got.profile ? `importance profile: loaded from ${cache.dir} (${got.profile.tokens} calibration tokens)` : `importance profile: ${got.miss}; layers are kept hot in execution order`);
      }
      // Under a budget the engine's own KV default may shrink to 64 tokens before weights are refused.
      const kvFloor = o.kvCacheBytes === undefined && kvPlanned !== undefined ? shape.kvBytesPerToken * 64 : undefined;
      const placed = placeWeights(backend, sp, loaded.checkpoint, kvPlanned ?? 0, shape, o, reservedBytes, splitFor, importance?.profile?.layers, kvFloor);
      if (measured) notes.push(`compute near data: ${measured}`);
      pager = placed?.pager;
      if (pipe) {
        const be0 = backend;
        staged = await prepareStages({
          request: pipe,
          primary: be0,
          spec: loaded.spec,
          ckpt: loaded.checkpoint,
          backendOptions: { deviceArenaBytes: o.deviceArenaBytes, numerics: be0.capabilities.numerics ?? 'exact', matmulPrecision: be0.capabilities.matmulPrecision ?? 'exact', batchInvariant: be0.capabilities.batchInvariant === true },
          kvPlanned,
          kvAfterUpload: (b, activationBytes) => kvCacheBytesAfterUpload(b, { ...shape, activationBytes }),
          activationBytes: shape.activationBytes,
          onProgress: o.onProgress,
        });
        notes.push(...staged.notes);
      }
      weights = staged ? staged.stages[0].weights : await uploadWeights(backend, loaded.spec, loaded.checkpoint, o.onProgress, pager, undefined, placed?.split);
      const kvBytes = staged?.kvBytes ?? placed?.kvBytes ?? kvPlanned ?? kvCacheBytesAfterUpload(backend, shape);
      // The loads that start the first pass; the ring keeps itself primed from then on.
      pager?.prime();
      const eos = loaded.stopTokenIds;
      const engine = new Engine(
        {
          dir: loaded.dir,
          spec: loaded.spec,
          tokenizer: loaded.tokenizer,
          backend,
          notes,
          weights,
          eos,
          generationConfig: loaded.generationConfig as Record<string, unknown> | undefined,
          ownsBackend: typeof o.backend !== 'object',
          shape,
          kvBytes,
          stages: staged,
          measuredRates,
        },
        o,
      );
      if (importance && pager && !importance.profile) {
        try {
          await engine.calibrate(importance.cache, importance.key);
        } catch (e) {
          engine.dispose();
          throw e;
        }
      }
      return engine;
    } catch (e) {
      staged?.dispose();
      if (weights) freeWeights(backend, weights);
      else pager?.dispose();
      if (typeof o.backend !== 'object') backend.dispose();
      throw e;
    } finally {
      await loaded.checkpoint.close();
    }
  }

  /** What requests are validated against (also shipped to worker proxies). */
  get limits(): RequestLimits {
    return {
      vocabSize: this.spec.vocabSize,
      maxModelLen: this.maxModelLen,
      // Tiered KV: a sequence's pages may be hot or warm (the null page aside).
      numBlocks: this.kvTiers ? this.kvTiers.plan.hotSlots + this.kvTiers.plan.warmSlots : this.runner.limits.numBlocks,
      blockSize: this.kv.blockSize,
      hasTokenizer: this.tokenizer !== undefined,
      // Freeing behind the window: a sequence holds at most the pages of its window and one chunk.
      ...(this.kvWindow > 0 ? { maxHeldBlocks: Math.ceil((this.kvWindow - 1 + this.runner.limits.maxRows) / this.kv.blockSize) + 1 } : {}),
      maxForks: this.runner.limits.maxSeqs,
    };
  }

  /** Tokens one scheduler step computes at most (maxNumBatchedTokens, or the default it took). */
  get maxNumBatchedTokens(): number {
    return this.runner.limits.maxRows;
  }

  get numBlocks(): number {
    return this.runner.limits.numBlocks;
  }

  get kvCacheBytes(): number {
    return this.runner.kvBytes;
  }

  /**
   * Measure the per-layer importance profile on one short calibration prompt (how much each
   * layer changes the residual stream) and save it; the next start's plan keeps the most
   * important layers hot. The reads it makes synchronize: it runs once, before any request.
   */
  private async calibrate(cache: ImportanceCache, key: string): Promise<void> {
    const s = this.spec;
    const tokens = Math.min(32, this.maxModelLen - 1);
    const ids = Array.from({ length: tokens }, (_, i) => (i * 7919 + 13) % s.vocabSize);
    const meter = new ImportanceMeter(s.numLayers);
    const H = s.hiddenSize;
    let prev: Float32Array | undefined;
    // Paged weights run on one stage (a pipeline rejects a VRAM budget), so this is a ModelRunner.
    if (!(this.runner instanceof ModelRunner)) return;
    const runner = this.runner;
    runner.layerProbe = (l: number, rows: number) => {
      const cur = this.backend.read(runner.hidden, 0, rows * H) as Float32Array;
      if (prev !== undefined) {
        const mlp = this.backend.read(runner.mlpOut, 0, rows * H) as Float32Array;
        for (let i = 0; i < cur.length; i++) cur[i] += mlp[i];
        meter.add(l - 1, prev, cur, rows, H);
      }
      prev = cur;
    };
    try {
      await this.submit(ids, { temperature: 0, maxTokens: 1, ignoreEos: true }).done;
    } finally {
      runner.layerProbe = undefined;
    }
    const file = cache.save({ version: 1, key, layers: meter.scores(), tokens, method: 'mean relative residual update per layer' });
    this.notes.push(`importance profile: calibrated on ${tokens} tokens, saved to ${file} (used by the next start's plan)`);
  }

  /** Where every weight block lives, what moved and what it cost (the memory OS report). */
  memoryReport(): MemoryReport {
    const r = memoryReport(this.backend, this.weights, this.runner.kvBytes, this.budgets, { computeBytes: this.runner.hostComputeBytes, readBytes: this.runner.hostReadBytes });
    if (this.kvTiers) {
      // Tiered KV runs on one ModelRunner (no stage pipeline): its backend measured the host partials.
      const hostAttn = this.backend.stats().hostComputeMsByOp?.attention;
      r.kv = this.kvTiers.report(this.runner as ModelRunner, this.totalPreemptions, this.kv.blockSize, hostAttn);
    }
    return r;
  }

  encode(text: string): number[] {
    if (!this.tokenizer) throw new EngineError('NO_TOKENIZER', `model ${this.modelDir} has no tokenizer.json; pass token ids`);
    return this.tokenizer.encode(text);
  }

  onStep(fn: (s: StepSignals) => void): () => void {
    this.stepListeners.add(fn);
    return () => this.stepListeners.delete(fn);
  }

  onFinish(fn: (o: RequestOutcome) => void): () => void {
    this.finishListeners.add(fn);
    return () => this.finishListeners.delete(fn);
  }

  get numRunning(): number {
    return this.scheduler.running.length;
  }

  get numWaiting(): number {
    return this.scheduler.waiting.length;
  }

  /** Queue a request. Invalid parameters throw InvalidParamsError before anything changes. */
  submit(prompt: string | readonly number[], o: GenerateOptions = {}): RequestHandle {
    if (this.disposed) throw new EngineError('DISPOSED', 'engine is disposed');
    const ids = typeof prompt === 'string' ? this.encode(prompt) : [...prompt];
    const params = validateRequest(this.limits, ids, o);
    const priority = o.priority ?? 0;
    if (o.signal?.aborted) throw o.signal.reason ?? new EngineError('ABORTED', 'aborted');

    const req = new Request(this.nextId++, ids, params, priority, o.cacheSalt, performance.now());
    const handle = this.track(req, o);
    this.scheduler.add(req);
    this.kick();
    return handle;
  }

  /**
   * Shared-prefix forks: `n` sequences continuing one prompt, one handle each (fork i is handle i).
   * The prompt is prefilled once; its last position is sampled once per fork, then the forks share
   * the prompt's full KV blocks by reference count (the partial last block is copied for each fork)
   * and decode together in the same batched steps. Fork i samples with seed `o.seed + i` (or a
   * random base + i), so it produces the tokens a separate `submit(prompt, { ...o, seed: o.seed + i })`
   * would. Aborting a fork (its handle, or its events' iterator) leaves the others running; `o.signal`
   * aborts them all. The blocks return to the pool when the last fork holding them ends.
   *
   * `n` must be an integer in [1, `limits.maxForks`] (the forks run in one batch of at most
   * `maxNumSeqs` sequences, whose seats the prompt takes at admission), and `forceTokens` only goes
   * with n = 1; n = 1 is `submit`. Invalid input throws InvalidParamsError (param `n` or the
   * field) before anything changes. A fork that cannot get a block for its copy when the prompt
   * finishes is recomputed like a preempted request (from the prefix cache when enabled); under
   * tiered KV the forks share the full blocks and recompute the partial one instead of copying it.
   *
   * @example
   * ```ts
   * const forks = engine.submitFork('ROMEO:', 4, { maxTokens: 32, temperature: 0.8, seed: 7 });
   * const outs = await Promise.all(forks.map((h) => h.done));
   * // outs[i].tokenIds equal (await engine.submit('ROMEO:', { maxTokens: 32, temperature: 0.8, seed: 7 + i }).done).tokenIds
   * ```
   */
  submitFork(prompt: string | readonly number[], n: number, o: GenerateOptions = {}): RequestHandle[] {
    if (this.disposed) throw new EngineError('DISPOSED', 'engine is disposed');
    const ids = typeof prompt === 'string' ? this.encode(prompt) : [...prompt];
    const params = validateRequest(this.limits, ids, o);
    validateForkCount(this.limits, n, o);
    if (n === 1) return [this.submit(ids, o)];
    const priority = o.priority ?? 0;
    if (o.signal?.aborted) throw o.signal.reason ?? new EngineError('ABORTED', 'aborted');

    const now = performance.now();
    // The prompt's request: prefilled once, never sampled itself; the forks replace it.
    const parent = new Request(this.nextId++, ids, params, priority, o.cacheSalt, now);
    parent.forkChildren = [];
    const handles: RequestHandle[] = [];
    for (let i = 0; i < n; i++) {
      const child = new Request(this.nextId++, ids, { ...params, seed: (params.seed + i) | 0 }, priority, o.cacheSalt, now);
      child.forkParent = parent;
      child.forkGroup = parent.id;
      parent.forkChildren.push(child);
      handles.push(this.track(child, o));
    }
    this.scheduler.add(parent);
    this.kick();
    return handles;
  }

  /** The live state, stream and handle of a request about to be queued. */
  private track(req: Request, o: GenerateOptions): RequestHandle {
    const stream = new TokenStream<TokenEvent>();
    let resolve!: (x: RequestOutcome) => void;
    const done = new Promise<RequestOutcome>((r) => (resolve = r));
    const ledger = new LedgerAggregator();
    for (const n of this.notes) ledger.note(n);
    const live: Live = { req, stream, resolve, text: '', emitted: 0, ledger, wantPromptLogits: Boolean(o.returnPromptLogits) };
    if (o.returnStepLogits) live.stepLogits = [];
    if (o.forceTokens) live.forced = [...o.forceTokens];
    if (this.tokenizer) live.detok = createDetokenizer(this.tokenizer);
    this.live.set(req.id, live);
    if (o.signal) {
      const onAbort = () => this.abort(req.id);
      o.signal.addEventListener('abort', onAbort, { once: true });
      live.cleanup = () => o.signal!.removeEventListener('abort', onAbort);
    }
    stream.onReturn = () => this.abort(req.id);
    return { id: req.id, events: stream, done, abort: () => this.abort(req.id) };
  }

  /**
   * A fork that ends before its prompt was prefilled leaves the prompt's request; the last one to
   * leave removes it (and frees its blocks).
   */
  private detachFork(req: Request): void {
    const p = req.forkParent;
    if (!p) return;
    req.forkParent = undefined;
    const kids = p.forkChildren ?? [];
    const k = kids.indexOf(req);
    if (k >= 0) kids.splice(k, 1);
    if (kids.length === 0) {
      p.forkChildren = undefined;
      this.scheduler.remove(p);
      p.status = 'FINISHED_ABORTED';
      this.graphKey = undefined;
    }
  }

  /**
   * The step that computed the last prompt token of a prompt request with forks has sampled one
   * token per fork: the forks take over its KV (full blocks shared, the partial last block copied
   * into a block of each fork's own) and its place in the running batch.
   */
  private forkOut(parent: Request): void {
    const kids = parent.forkChildren ?? [];
    parent.forkChildren = undefined;
    const seated: Request[] = [];
    const queued: Request[] = [];
    const tiered = this.kvTiers !== undefined;
    const bs = this.kv.blockSize;
    // Tiered KV pages are placed per step by the page policy: no in-place copy; the forks share the
    // full pages and recompute the partial one (as long as there is a full page to share).
    const share = !tiered || (parent.numTokens >= bs && this.kv.numReleasedBlocks(parent.id) === 0);
    for (const c of kids) {
      c.forkParent = undefined;
      c.times.firstScheduled = parent.times.firstScheduled;
      c.numCachedTokens = parent.numCachedTokens;
      const f = share ? this.kv.forkSequence(parent.id, c.id, !tiered) : null;
      if (f === null) {
        // No block for its copy: recomputed when admitted, like a preempted request.
        queued.push(c);
        continue;
      }
      if (f.copy) this.copyKvBlock(f.copy.src, f.copy.dst);
      c.numComputedTokens = f.numTokens;
      c.status = 'RUNNING';
      seated.push(c);
    }
    this.scheduler.replaceWithForks(parent, seated, queued);
    parent.status = 'FINISHED_STOPPED';
    this.graphKey = undefined;
  }

  /** Copy one KV block's K and V (every layer, every stage) to another block, on the compute stream. */
  private copyKvBlock(src: number, dst: number): void {
    const runners = this.pipeline ? this.pipeline.runners : [this.runner as ModelRunner];
    for (const r of runners) r.copyKvPage({ from: 'hot', fromSlot: src, to: 'hot', toSlot: dst });
  }

  /** Stream the tokens of one request. Aborting through `signal` ends the iteration with the signal's reason. */
  async *generate(prompt: string | readonly number[], o: GenerateOptions = {}): AsyncGenerator<TokenEvent, RequestOutcome> {
    const h = this.submit(prompt, o);
    try {
      for await (const ev of h.events) yield ev;
    } finally {
      h.abort();
    }
    const outcome = await h.done;
    if (outcome.finishReason === 'abort' && o.signal?.aborted) throw o.signal.reason;
    return outcome;
  }

  /** Cancel a request: its KV blocks are freed at once. No-op when it already finished. */
  abort(id: number): void {
    const l = this.live.get(id);
    if (!l || l.req.finished) return;
    this.scheduler.remove(l.req);
    this.detachFork(l.req);
    if (this.graphKey !== undefined) this.graphKey = undefined;
    this.finish(l, 'abort', 'FINISHED_ABORTED');
  }

  private kick(): void {
    if (this.looping || this.disposed) return;
    this.looping = true;
    setImmediate(() => this.loop());
  }

  private loop(): void {
    if (this.disposed) return;
    try {
      if (this.scheduler.hasWork) this.step();
    } catch (e) {
      this.failAll(e as Error);
    }
    if (this.scheduler.hasWork && !this.disposed) setImmediate(() => this.loop());
    else {
      this.looping = false;
      // Idle with a step enqueued ahead (its requests finished): wait for it and drop it now.
      try {
        this.retireAhead();
      } catch (e) {
        this.failAll(e as Error);
      }
    }
  }

  /**
   * Wait for the steps enqueued ahead and drop them: their tokens are skipped in the ring, and
   * the step state they advanced on the device (ids, positions, slots, RNG counters) is rewritten
   * by the next replay (graphKey reset). Their KV writes are at positions no accepted token has
   * (rewritten by the step that computes them) or in blocks of finished requests.
   */
  private retireAhead(): void {
    const q = this.ahead;
    if (q.length === 0) return;
    this.ahead = [];
    this.graphKey = undefined;
    this.droppedSteps += q.length;
    this.backend.synchronizeEvent!(q[q.length - 1].end, 'policy');
    let rows = 0;
    for (const a of q) rows += a.bucket;
    this.ringRead = (this.ringRead + rows) % this.runner.limits.ringCapacity;
  }

  /**
   * Steps the next replay enqueued ahead may run: runAheadSteps where 2k - 1 steps of the last
   * step's device time fit runAheadMs, else 1. Two sizes only, so a run captures its graphs
   * early (a first capture mid-run holds the device for milliseconds) and a step time near the
   * bound does not capture a graph for every k it crosses.
   */
  private aheadSteps(): number {
    const k = this.runAheadSteps;
    const fits = this.lastDecodeMs > 0 ? (2 * k - 1) * this.lastDecodeMs <= this.runAheadMs : this.runAheadMs === Infinity;
    return fits ? k : 1;
  }

  /**
   * Whether steps d+1..d+s after the current one (d already enqueued) may be enqueued now for
   * these rows: each row's first of them computes a position in a block it holds (the advance of
   * the step before it, already enqueued, found its slot in the table), none runs past its last
   * token, the model's length or its block table, and the ring holds every step in flight.
   */
  private aheadFits(scheduled: SchedulerOutput['scheduled'], bucket: number, d: number, s: number): boolean {
    if ((1 + d + s) * bucket > this.runner.limits.ringCapacity) return false;
    const bs = this.kv.blockSize;
    const mb = this.runner.limits.maxBlocksPerSeq;
    for (const { req } of scheduled) {
      const c = req.numComputedTokens;
      if (Math.floor((c + d + 1) / bs) >= this.kv.blockTable(req.id).length) return false;
      if (req.outputIds.length + d + s >= req.params.maxTokens || req.numTokens + d + s >= this.maxModelLen) return false;
      if (Math.floor((c + d + s) / bs) >= mb) return false;
    }
    return true;
  }

  /**
   * Reserve each row's blocks through position `last(req)` (KvCacheManager.reserveBlocks; the
   * scheduler's allocation for those positions takes them) and write their device table entries,
   * in stream order before the replay whose advances read them. False where the pool is short
   * for some row (what the others reserved stays theirs, entries written).
   */
  private reserveThrough(scheduled: SchedulerOutput['scheduled'], last: (req: Request) => number | undefined): boolean {
    const mb = this.runner.limits.maxBlocksPerSeq;
    const st = this.stage;
    let ok = true;
    for (let k = 0; k < scheduled.length; k++) {
      const req = scheduled[k].req;
      const p = last(req);
      if (p === undefined) continue;
      const had = this.kv.blockTable(req.id).length;
      if (Math.floor(p / this.kv.blockSize) < had) continue;
      if (this.kv.reserveBlocks(req.id, p + 1) === null) {
        ok = false;
        continue;
      }
      const table = this.kv.blockTable(req.id);
      for (let b = had; b < table.length; b++) st.tables[k * mb + b] = table[b];
      this.backend.write(this.runner.meta.blockTables, st.tables.subarray(k * mb + had, k * mb + table.length), k * mb + had);
    }
    return ok;
  }

  /**
   * Enqueue decode steps after this decode-only graph step while the same rows will be
   * scheduled (nothing waiting, no row reaching its last token), up to aheadSteps() - 1 beyond
   * the one replay that keeps the device busy while the host takes the current one's tokens: a
   * replay of k = aheadSteps() steps where they fit, else of one. The device reads their ids,
   * positions and slots from what the step before leaves (the host writes nothing for them but
   * table entries of blocks reserved for them, a replay early). A row whose position after the
   * replay starts a new block gets it now when the pool has it, so crossing into a block does not
   * stop the replay after from running ahead.
   */
  private enqueueAhead(scheduled: SchedulerOutput['scheduled'], bucket: number, short: (last: number) => boolean): void {
    if (!this.runAhead || this.scheduler.waiting.length > 0 || this.kvTiers || this.pager || this.pipeline) return;
    const K = this.aheadSteps();
    while (this.ahead.length < K) {
      const d = this.ahead.length;
      let s = K > 1 && this.aheadFits(scheduled, bucket, d, K) ? K : 1;
      if (s > 1 && !this.reserveThrough(scheduled, (req) => req.numComputedTokens + d + s)) s = 1;
      if (s === 1 && !this.aheadFits(scheduled, bucket, d, 1)) return;
      const after = d + s + 1;
      this.reserveThrough(scheduled, (req) =>
        req.outputIds.length + after < req.params.maxTokens && req.numTokens + after < this.maxModelLen && Math.floor((req.numComputedTokens + after) / this.kv.blockSize) < this.runner.limits.maxBlocksPerSeq
          ? req.numComputedTokens + after
          : undefined,
      );
      // Every step in flight is the same pass: the next schedules count the blocks reserved now.
      const key = this.passKey(bucket, false, scheduled);
      for (const a of this.ahead) a.key = key;
      // Nothing runs between the step before and this replay in the stream, so the replay starts
      // at that step's end event instead of an event of its own: a timed event record holds the
      // GPU about 1.5 us between two graph replays (an untimed one costs nothing; session 26,
      // tools/gpu/graphgap.cu).
      const start = d > 0 ? this.ahead[d - 1].end : this.endEv;
      const end = this.freeEvent();
      this.replayDecode(bucket, s, false, 0, short(d + s));
      this.backend.record(end);
      for (let j = 0; j < s; j++) this.ahead.push({ key, bucket, start, end, share: s });
      this.graphKey = key;
    }
  }

  /** An event no step in flight uses (the current one's, those enqueued ahead). */
  private freeEvent(): EventHandle {
    // (A scan, not a Set: this runs once a replay enqueued, and the queue holds at most 2k - 1 steps.)
    const used = (x: EventHandle) => x === this.startEv || x === this.endEv || this.ahead.some((a) => a.start === x || a.end === x);
    let e = this.events.find((x) => !used(x));
    if (e === undefined) {
      e = this.backend.createEvent();
      this.events.push(e);
    }
    return e;
  }

  /** The identity of a graph pass: its bucket, whether tiered, and each row's request and table length. */
  private passKey(bucket: number, tiered: boolean, scheduled: SchedulerOutput['scheduled']): string {
    return `${bucket}|${tiered}|` + scheduled.map(({ req }) => `${req.id}:${this.kv.blockTable(req.id).length}`).join(',');
  }

  /**
   * Replay the decode graph of `steps` steps of this bucket (captured on first use: forward,
   * sampling, advance, `steps` times). Passes with host partials (some page warm) and without
   * are different graphs; tiered graphs also differ by the staging span their copies were
   * captured with. One-row steps whose row stays within the backend's decodeShortKeys (`short`)
   * replay a graph of their own ("s" suffix), captured with that bound as op decoder_layers'
   * maxKeys. Several steps: "x<steps>" suffix.
   */
  private replayDecode(bucket: number, steps: number, tiered: boolean, span: number, short: boolean): void {
    const be = this.backend;
    const gk = (tiered ? `t${bucket}:${span}` : `${bucket}`) + (short ? 's' : '') + (steps > 1 ? `x${steps}` : '');
    let g = this.graphs.get(gk);
    if (!g) {
      be.beginCapture();
      this.pager?.beginCapture();
      const hostBefore = this.runner.hostComputeBytes;
      if (short) (this.runner as ModelRunner).decodeKeyBound = this.backend.capabilities.decodeShortKeys ?? 0;
      try {
        for (let j = 0; j < steps; j++) {
          if (tiered) (this.runner as ModelRunner).forward(bucket, bucket, undefined, undefined, true);
          else this.runner.forward(bucket, bucket);
          this.runner.sampleStep(bucket, this.runner.meta.ids);
        }
      } catch (err) {
        // End the failed capture, so the stream is usable (and disposable) again; its error stands.
        try {
          be.destroyGraph(be.endCapture());
        } catch {
          // an invalidated capture ends with an error of its own
        }
        throw err;
      } finally {
        if (short) (this.runner as ModelRunner).decodeKeyBound = 0;
        this.pager?.endCapture();
        // Captured, not run: counted on each replay instead.
        this.replayHostBytes.set(gk, this.runner.hostComputeBytes - hostBefore);
        this.runner.hostComputeBytes = hostBefore;
      }
      g = be.endCapture();
      this.graphs.set(gk, g);
    }
    be.setHotPath(true);
    try {
      be.replay(g);
      this.pager?.replayed();
      this.runner.hostComputeBytes += this.replayHostBytes.get(gk) ?? 0;
      if (tiered) (this.runner as ModelRunner).tieredPasses++;
    } finally {
      be.setHotPath(false);
    }
  }

  /** End one request with `err` (its KV blocks freed); the others run on. */
  private failOne(l: Live, err: Error): void {
    if (!this.live.has(l.req.id)) return;
    this.scheduler.remove(l.req);
    this.detachFork(l.req);
    this.graphKey = undefined;
    l.req.status = 'FINISHED_ABORTED';
    l.req.finishReason = 'abort';
    this.live.delete(l.req.id);
    l.cleanup?.();
    l.stream.end(err);
    l.resolve(this.outcome(l));
  }

  private failAll(err: Error): void {
    try {
      this.retireAhead();
    } catch {
      // the device failed: the step ahead is gone with it
    }
    for (const l of [...this.live.values()]) {
      this.scheduler.remove(l.req);
      this.detachFork(l.req);
      l.req.status = 'FINISHED_ABORTED';
      l.req.finishReason = 'abort';
      this.live.delete(l.req.id);
      l.cleanup?.();
      l.stream.end(err);
      l.resolve(this.outcome(l));
    }
    this.graphKey = undefined;
  }

  /** One scheduler step: plan, one forward pass, sampling, and the policies of the host. */
  step(): void {
    const t0 = performance.now();
    // With steps enqueued ahead, a waiting request is admitted once they are done (they are the
    // running rows' next tokens: adopted, not dropped; none is enqueued while it waits).
    const plan = this.scheduler.schedule(this.ahead.length === 0);
    this.totalPreemptions += plan.preempted.length;
    // Freed pages change staged block tables (their entries become the null page).
    if (plan.preempted.length || plan.freedBlocks) this.graphKey = undefined;
    if (plan.scheduled.length === 0) {
      this.retireAhead();
      return;
    }
    const before = this.pipeline?.stats() ?? this.backend.stats();
    const pagerBefore = this.pager?.stats();
    let replayed = false;
    const st = this.stage;
    const mb = this.runner.limits.maxBlocksPerSeq;
    const sampling: Request[] = [];
    let rows = 0;
    let promptTokens = 0;
    const kt = this.kvTiers;
    const bs = this.kv.blockSize;
    // Blocks two or more of this step's sequences read (forks, prefix hits): marked per step.
    const stamp = ++this.blockStamp;
    const seen = this.blockSeen;
    const twice = this.blockTwice;
    let sharedBlocks = 0;
    let sharedBlockReads = 0;
    let forks = false;
    if (kt) {
      // Page moves first (demotions, cold pages up to warm): the step reads the tables after them.
      const epoch = kt.tiers.epoch;
      if (plan.preempted.length) kt.swappedOut += plan.preempted.length;
      kt.prepare(
        plan.scheduled.map(({ req }) => ({ pages: this.kv.blockTable(req.id), firstWritten: Math.floor(req.numComputedTokens / bs), firstFresh: Math.ceil(req.numComputedTokens / bs) })),
        this.runner as ModelRunner,
      );
      if (kt.tiers.epoch !== epoch) this.graphKey = undefined;
    }
    // Warm slots [0, linkPages) are the device's (staged over the link), those above the host's;
    // the step copies the leading slots up to the highest one its tables read.
    const linkPages = this.runner.limits.linkPages ?? 0;
    let linkUsed = 0;
    plan.scheduled.forEach(({ req, numTokens }, k) => {
      const start = req.numComputedTokens;
      if (req.times.firstScheduled === undefined) req.times.firstScheduled = t0;
      const table = this.kv.blockTable(req.id);
      for (let p = start; p < start + numTokens; p++) {
        st.ids[rows] = req.allIds[p];
        st.pos[rows] = p;
        st.seq[rows] = k;
        st.slots[rows] = kt ? kt.tiers.hotSlot(table[Math.floor(p / bs)]) * bs + (p % bs) : this.kv.slotFor(req.id, p);
        rows++;
        if (p < req.promptIds.length) promptTokens++;
      }
      st.tables.fill(0, k * mb, (k + 1) * mb);
      if (kt) {
        // Views of one table: the hot slot of each block for the device, the warm slot for the
        // host, and with a link share the staging index (the same warm slot) of the pages in the
        // device's slots. A page shared by several sequences is staged once.
        const wt = st.warmTables!;
        const lt = st.linkTables;
        wt.fill(-1, k * mb, (k + 1) * mb);
        lt?.fill(-1, k * mb, (k + 1) * mb);
        for (let b = 0; b < table.length; b++) {
          st.tables[k * mb + b] = kt.tiers.hotSlot(table[b]);
          const w = kt.tiers.warmSlot(table[b]);
          if (w >= 0 && lt && w < linkPages) {
            lt[k * mb + b] = w;
            if (w >= linkUsed) linkUsed = w + 1;
          } else wt[k * mb + b] = w;
        }
      } else for (let b = 0; b < table.length; b++) st.tables[k * mb + b] = table[b];
      for (let b = 0; b < table.length; b++) {
        const id = table[b];
        if (id === 0) continue;
        if (seen[id] !== stamp) seen[id] = stamp;
        else {
          sharedBlockReads++;
          if (twice[id] !== stamp) {
            twice[id] = stamp;
            sharedBlocks++;
          }
        }
      }
      if (start + numTokens === req.numTokens) {
        // A prompt request with forks: its last row is sampled once per fork, each with its own seed.
        const samplers = req.forkChildren ?? [req];
        if (req.forkChildren) forks = true;
        for (const r of samplers) {
          const i = sampling.length;
          st.logitRows[i] = rows - 1;
          const p = r.params;
          st.params[i * 4] = p.temperature;
          st.params[i * 4 + 1] = p.topK;
          st.params[i * 4 + 2] = p.topP;
          st.params[i * 4 + 3] = p.minP;
          st.rng[i * 2] = p.seed;
          st.rng[i * 2 + 1] = r.sampleCounter;
          sampling.push(r);
        }
      }
    });
    const span = stageSpan(linkUsed, linkPages);
    if (linkPages > 0) (this.runner as ModelRunner).linkSpan = span;
    if (kt && span > 0) kt.noteStaged(span);
    const nSeq = plan.scheduled.length;
    const nl = sampling.length;
    const decodeOnly = nl === nSeq && rows === nSeq && !forks;
    // Rows that need the host sampler (penalties, logprobs, min_tokens, logits kept): only they
    // are read and sampled on the host; the device samples the rest (a mixed step).
    const hostRows = nl > 0 ? sampling.flatMap((r, i) => (isDeviceSamplable(r.params) && !this.needsLogits(r) ? [] : [i])) : [];
    const deviceSample = nl > 0 && hostRows.length === 0;
    const mixed = hostRows.length > 0 && hostRows.length < nl;
    const V = this.spec.vocabSize;
    const be = this.backend;
    const m = this.runner.meta;
    let tokens: number[] = [];
    const host: Map<Request, ReturnType<HostSampler['sample']>> = new Map();
    let sampleMs = 0;

    const tiered = kt?.tiered ?? false;
    const graphPath = this.useGraphs && !this.profile && decodeOnly && deviceSample && nSeq <= BUCKETS[BUCKETS.length - 1] && nSeq <= this.runner.limits.maxSeqs;
    const bucket = graphPath ? (BUCKETS.find((b) => b >= nSeq && b <= this.runner.limits.maxSeqs) ?? nSeq) : 0;
    const key = graphPath ? this.passKey(bucket, tiered, plan.scheduled) : '';
    // The step enqueued ahead is this one when the pass is the same and nothing reset the
    // device's step state since; otherwise the steps enqueued are dropped before anything is written.
    const head = this.ahead[0];
    const adopt = head !== undefined && graphPath && head.key === key && this.graphKey === key;
    if (adopt) {
      this.ahead.shift();
      this.startEv = head.start;
      this.endEv = head.end;
      this.stepShare = head.share;
    } else {
      this.retireAhead();
      // Nothing in flight: any two events.
      [this.startEv, this.endEv] = this.events;
      this.stepShare = 1;
      be.record(this.startEv);
    }
    if (graphPath) {
      if (!adopt && key !== this.graphKey) {
        for (let r = nSeq; r < bucket; r++) {
          // Padding rows: a slot of -1 is skipped by kv_append; their own sequence row has only the null block.
          st.ids[r] = 0;
          st.pos[r] = 0;
          st.seq[r] = r;
          st.slots[r] = -1;
          st.tables.fill(0, r * mb, (r + 1) * mb);
          st.warmTables?.fill(-1, r * mb, (r + 1) * mb);
          st.linkTables?.fill(-1, r * mb, (r + 1) * mb);
          st.params[r * 4] = 0;
          st.rng[r * 2] = 0;
          st.rng[r * 2 + 1] = 0;
        }
        for (let r = 0; r < bucket; r++) st.logitRows[r] = r;
        this.writeMeta(bucket, bucket, true);
      }
      // A replay whose last step is `last` steps after this one: the short-keys graph where every
      // row's keys stay within the backend's bound through that step.
      const shortKeys = this.backend.capabilities.decodeShortKeys ?? 0;
      const short = (last: number) =>
        shortKeys > 0 && bucket === 1 && !this.pipeline && !tiered && plan.scheduled.every(({ req }) => req.numComputedTokens + last + 1 <= shortKeys);
      if (!adopt) {
        this.replayDecode(bucket, 1, tiered, span, short(0));
        be.record(this.endEv);
      }
      this.graphKey = key;
      this.enqueueAhead(plan.scheduled, bucket, short);
      if (this.ahead.length > 0) be.synchronizeEvent!(this.endEv, 'policy');
      else be.synchronize('policy');
      tokens = this.readRing(bucket).slice(0, nSeq);
      replayed = true;
    } else {
      this.graphKey = undefined;
      this.writeMeta(rows, nl, deviceSample || mixed);
      // A prompt's last row sampled once per fork: logit rows repeat (see ModelRunner.repeatedLogitRows).
      const runners = forks ? (this.pipeline ? this.pipeline.runners : [this.runner as ModelRunner]) : [];
      for (const r of runners) r.repeatedLogitRows = true;
      // A pass of one sequence (a prompt chunk): op attention may skip what sequence seams need.
      const single = !this.pipeline && plan.scheduled.length === 1 ? (this.runner as ModelRunner) : undefined;
      if (single) single.oneSequence = true;
      try {
        if (tiered) (this.runner as ModelRunner).forward(rows, nl, undefined, undefined, true);
        else this.runner.forward(rows, nl);
      } finally {
        for (const r of runners) r.repeatedLogitRows = false;
        if (single) single.oneSequence = false;
      }
      // One row on the host: the sampler with penalties and logprobs, forced tokens, logits kept.
      const hostSample = (req: Request, logits: Float32Array, offset: number): number => {
        const banned = req.outputIds.length < req.params.minTokens ? [...(req.params.ignoreEos ? [] : this.eosTokenIds), ...req.params.stopTokenIds] : [];
        const l = this.live.get(req.id)!;
        const s = this.sampler.sample(logits, offset, req.params, req.sampleCounter, { all: req.seenAll, output: req.seenOutput }, banned);
        if (l.forced) s.token = l.forced[req.outputIds.length];
        host.set(req, s);
        if (l.wantPromptLogits && req.outputIds.length === 0) l.promptLogits = logits.slice(offset, offset + V);
        l.stepLogits?.push(logits.slice(offset, offset + V));
        return s.token;
      };
      if (deviceSample || mixed) {
        this.runner.sampleOnDevice(nl, m.sampled);
        if (mixed) this.pipeline?.logitsHome(nl);
        be.record(this.endEv);
        be.synchronize('policy');
        tokens = this.readRing(nl);
        if (mixed) {
          // The device sampled every row (the same rule); the host rows' tokens are replaced.
          const ts = performance.now();
          for (const i of hostRows) tokens[i] = hostSample(sampling[i], be.read(this.runner.logits, i * V, V) as Float32Array, 0);
          sampleMs = performance.now() - ts;
        }
      } else if (nl > 0) {
        this.pipeline?.logitsHome(nl);
        be.record(this.endEv);
        const logits = be.read(this.runner.logits, 0, nl * V) as Float32Array;
        const ts = performance.now();
        sampling.forEach((req, i) => tokens.push(hostSample(req, logits, i * V)));
        sampleMs = performance.now() - ts;
      } else {
        be.record(this.endEv);
        be.synchronize('hard');
      }
    }
    const deviceMs = be.elapsedMs(this.startEv, this.endEv) / this.stepShare;
    if (replayed) this.lastDecodeMs = deviceMs;
    const ops: Record<string, number> | undefined = this.profile ? {} : undefined;
    const buckets = this.profile ? this.runner.takeProfile(ops) : undefined;
    if (buckets) {
      this.profiles.push({ rows, deviceMs, buckets: { ...buckets }, ops: ops! });
      if (this.profiles.length > PROFILES_KEPT) this.profiles.shift();
    }
    const after = this.pipeline?.stats() ?? be.stats();
    for (const { req, numTokens } of plan.scheduled) req.numComputedTokens += numTokens;
    // Prompts with forks that finished: the forks take over (before their first tokens are accepted).
    if (forks) for (const { req } of plan.scheduled) if (req.forkChildren && req.numComputedTokens === req.numTokens) this.forkOut(req);
    const now = performance.now();
    const share = nl > 0 ? 1 / nl : 0;
    const delta = statsDelta(before, after, share);
    const paging = pagerBefore ? pagerDelta(pagerBefore, this.pager!.stats(), share) : undefined;
    // A replayed graph's copies are not seen by the backend's counters; the pager accounts for them.
    if (paging && replayed) delta.h2dBytes += paging.h2dBytes;
    sampling.forEach((req, i) => {
      const l = this.live.get(req.id)!;
      const s = host.get(req);
      const prev = req.times.lastToken ?? req.times.arrival;
      const record: TokenLedgerRecord = {
        seq: req.id,
        step: req.outputIds.length,
        tokenId: tokens[i],
        phase: req.outputIds.length === 0 ? 'prefill' : 'decode',
        wallMs: now - prev,
        sampleMs: sampleMs * share,
        deviceActiveMs: deviceMs * share,
        ...delta,
        ...(paging ? { prefetchedBlocks: paging.loads, evictedBlocks: paging.loads, diskReadBytes: paging.diskReadBytes } : {}),
      };
      if (buckets) record.buckets = Object.fromEntries(Object.entries(buckets).map(([k, v]) => [k, v * share]));
      // A failure in one request's host policies (detokenizing, stop strings) ends that request only.
      try {
        this.accept(l, tokens[i], record, s);
      } catch (e) {
        this.failOne(l, e as Error);
      }
    });
    const ks = this.kv.stats();
    const sig: StepSignals = {
      time: now,
      running: this.scheduler.running.length,
      waiting: this.scheduler.waiting.length,
      kvUsage: this.kv.usage,
      prefixQueries: ks.prefixQueries,
      prefixHits: ks.prefixHits,
      preemptions: this.totalPreemptions,
      scheduledTokens: rows,
      promptTokens,
      generationTokens: nl,
      stepMs: now - t0,
      sharedBlocks,
      sharedBlockReads,
      droppedSteps: this.droppedSteps,
    };
    for (const f of this.stepListeners) f(sig);
  }

  /** Requests whose logits the host must see (so their sampling runs on the host). */
  private needsLogits(r: Request): boolean {
    const l = this.live.get(r.id);
    return !!l && (l.forced !== undefined || l.stepLogits !== undefined || (l.wantPromptLogits && r.outputIds.length === 0));
  }

  private writeMeta(rows: number, nl: number, withSampling: boolean): void {
    if (this.pipeline) return this.pipeline.writeMeta(this.stage, rows, nl, withSampling);
    const be = this.backend;
    const m = this.runner.meta;
    const st = this.stage;
    const mb = this.runner.limits.maxBlocksPerSeq;
    be.write(m.ids, st.ids.subarray(0, rows));
    be.write(m.positions, st.pos.subarray(0, rows));
    be.write(m.rowSeq, st.seq.subarray(0, rows));
    be.write(m.slots, st.slots.subarray(0, rows));
    let seqs = 0;
    for (let r = 0; r < rows; r++) seqs = Math.max(seqs, st.seq[r] + 1);
    be.write(m.blockTables, st.tables.subarray(0, seqs * mb));
    if (m.warmTables && st.warmTables) be.write(m.warmTables, st.warmTables.subarray(0, seqs * mb));
    if (m.linkTables && st.linkTables) be.write(m.linkTables, st.linkTables.subarray(0, seqs * mb));
    if (nl > 0) be.write(m.logitRows, st.logitRows.subarray(0, nl));
    if (withSampling && nl > 0) {
      be.write(m.sampleParams, st.params.subarray(0, nl * 4));
      be.write(m.rng, st.rng.subarray(0, nl * 2));
    }
  }

  private readRing(n: number): number[] {
    const cap = this.runner.limits.ringCapacity;
    const out: number[] = [];
    const start = this.ringRead % cap;
    const first = Math.min(n, cap - start);
    for (const v of this.backend.peek(this.runner.meta.ring, start, first)) out.push(v);
    if (first < n) for (const v of this.backend.peek(this.runner.meta.ring, 0, n - first)) out.push(v);
    this.ringRead = (this.ringRead + n) % cap;
    return out;
  }

  /** Host policies on a sampled token: EOS, stop ids, stop strings, max tokens. */
  private accept(l: Live, token: number, record: TokenLedgerRecord, s?: ReturnType<HostSampler['sample']>): void {
    const req = l.req;
    const p = req.params;
    req.appendToken(token);
    const now = performance.now();
    if (req.times.firstToken === undefined) req.times.firstToken = now;
    req.times.lastToken = now;
    l.ledger.add(record);
    const isEos = !p.ignoreEos && this.eosTokenIds.includes(token);
    const isStopId = p.stopTokenIds.includes(token);
    let finish: FinishReason | undefined;
    let stopReason: string | number | undefined;
    if (req.outputIds.length >= p.minTokens && (isEos || isStopId)) {
      finish = 'stop';
      stopReason = isStopId ? token : undefined;
    }
    // Text: special tokens that end the request are not part of it.
    let piece = '';
    if (l.detok && !finish) piece = l.detok.push(token);
    l.text += piece;
    let emitUpTo = l.text.length;
    if (!finish && p.stop.length > 0) {
      let best = -1;
      let bestStop = '';
      for (const st of p.stop) {
        const from = Math.max(0, l.emitted - st.length + 1);
        const i = l.text.indexOf(st, from);
        if (i >= 0 && (best < 0 || i < best)) {
          best = i;
          bestStop = st;
        }
      }
      if (best >= 0) {
        finish = 'stop';
        stopReason = bestStop;
        l.text = l.text.slice(0, best + (p.includeStopStrInOutput ? bestStop.length : 0));
        emitUpTo = l.text.length;
      } else {
        emitUpTo = l.text.length - holdBack(l.text, p.stop, l.emitted);
      }
    }
    if (!finish && req.outputIds.length >= p.maxTokens) finish = 'length';
    if (!finish && l.forced && req.outputIds.length >= l.forced.length) finish = 'length';
    if (!finish && req.numTokens >= this.maxModelLen) finish = 'length';
    if (finish && finish !== 'stop' && l.detok) {
      l.text += l.detok.flush();
      emitUpTo = l.text.length;
    }
    if (finish) emitUpTo = l.text.length;
    const text = l.text.slice(l.emitted, Math.max(l.emitted, emitUpTo));
    l.emitted = Math.max(l.emitted, emitUpTo);
    const ev: TokenEvent = { requestId: req.id, index: req.outputIds.length - 1, token, text, ledger: record };
    if (s?.logprob !== undefined) ev.logprob = s.logprob;
    if (s?.topLogprobs) ev.topLogprobs = s.topLogprobs;
    if (finish) {
      ev.finishReason = finish;
      if (stopReason !== undefined) ev.stopReason = stopReason;
    }
    l.stream.push(ev);
    if (finish) {
      req.stopReason = stopReason;
      this.scheduler.remove(req);
      this.finish(l, finish, finish === 'length' ? 'FINISHED_LENGTH_CAPPED' : 'FINISHED_STOPPED');
    }
  }

  private finish(l: Live, reason: FinishReason, status: Request['status']): void {
    l.req.status = status;
    l.req.finishReason = reason;
    l.req.times.finished = performance.now();
    this.live.delete(l.req.id);
    l.cleanup?.();
    l.stream.end();
    const o = this.outcome(l);
    l.resolve(o);
    for (const f of this.finishListeners) f(o);
  }

  private outcome(l: Live): RequestOutcome {
    const o: RequestOutcome = {
      requestId: l.req.id,
      promptIds: l.req.promptIds,
      tokenIds: [...l.req.outputIds],
      text: l.text,
      finishReason: l.req.finishReason ?? 'abort',
      numCachedTokens: l.req.numCachedTokens,
      times: l.req.times,
      ledger: l.ledger,
    };
    if (l.req.stopReason !== undefined) o.stopReason = l.req.stopReason;
    if (l.promptLogits) o.promptLogits = l.promptLogits;
    if (l.stepLogits) o.stepLogits = l.stepLogits;
    return o;
  }

  /** The pipeline's stages, links and micro-batches; undefined when the model runs as one stage. */
  pipelineDescription(): PipelineDescription | undefined {
    return this.pipeline?.describe();
  }

  /**
   * Bracket every op of the following steps with device events (as the `profile` option does
   * from the start), or stop. A profiled step runs eagerly, op by op: no decode graph is captured
   * or replayed, and the decoder stack runs as per-layer ops.
   */
  setProfiling(on: boolean): void {
    this.profile = on;
    this.runner.setProfiling(on);
  }

  /** The op-level device times of each step run while profiling since the last call (the latest PROFILES_KEPT), oldest first. */
  takeProfiles(): PassProfile[] {
    const out = this.profiles;
    this.profiles = [];
    return out;
  }

  /** Nodes of each captured decode graph, by batch-size bucket ("t<bucket>:<staging span>" for tiered passes; "1s": one-row steps within capabilities.decodeShortKeys). */
  graphNodes(): Record<string, number> {
    return Object.fromEntries([...this.graphs].map(([b, g]) => [b, g.nodes]));
  }

  /** Drain: resolves when no request is waiting or running. */
  async idle(): Promise<void> {
    while (this.scheduler.hasWork) await new Promise((r) => setTimeout(r, 5));
  }

  dispose(): void {
    if (this.disposed) return;
    this.failAll(new EngineError('DISPOSED', 'engine disposed'));
    this.disposed = true;
    for (const g of this.graphs.values()) this.backend.destroyGraph(g);
    this.kvTiers?.dispose();
    this.graphs.clear();
    for (const e of this.events) this.backend.destroyEvent(e);
    this.runner.dispose();
    freeWeights(this.backend, this.weights);
    if (this.ownsBackend) this.backend.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** Runner shapes from the options and the backend (smaller defaults under a VRAM budget). */
function runnerShape(backend: DeviceBackend, s: ModelSpec, o: EngineOptions): RunnerShape {
  const cpu = backend.capabilities.deviceKind === 'cpu';
  const budgeted = o.vramBudget !== undefined;
  const maxNumSeqs = o.maxNumSeqs ?? (cpu ? 64 : budgeted ? 32 : 128);
  const maxRows = Math.max(o.maxNumBatchedTokens ?? (cpu ? 256 : budgeted ? 512 : 2048), maxNumSeqs);
  const inter = s.moe ? Math.max(s.intermediateSize, s.moe.moeIntermediateSize) : s.intermediateSize;
  const qkvOut = (s.numHeads + 2 * s.numKvHeads) * s.headDim;
  const activationBytes = 4 * (maxRows * (4 * s.hiddenSize + qkvOut + s.numHeads * s.headDim + 3 * inter) + maxNumSeqs * (s.vocabSize + s.hiddenSize));
  return { maxRows, maxNumSeqs, activationBytes, kvBytesPerToken: kvBytesPerToken(backend, s, kvDtypeOf(backend, o.kvCacheDtype)) };
}

/**
 * KV cache bytes: the option, else a share of what the weights leave (nano-vllm sizes it after a
 * warm-up pass; our activations are known up front, so they are subtracted instead). Under a
 * VRAM budget the weights are placed after the cache: it gets a quarter of the budget, at most
 * one full-length sequence, so the rest can hold weights.
 */
function kvCacheBytesFor(backend: DeviceBackend, shape: RunnerShape, maxModelLen: number, o: EngineOptions): number | undefined {
  if (o.kvVramBudget !== undefined) return o.kvVramBudget;
  if (o.kvCacheBytes !== undefined) return o.kvCacheBytes;
  if (backend.capabilities.deviceKind === 'cpu') return o.vramBudget !== undefined ? Math.min(256 * 2 ** 20, Math.max(shape.kvBytesPerToken * 64, Math.floor(o.vramBudget / 4))) : 256 * 2 ** 20;
  if (o.vramBudget !== undefined) return Math.max(shape.kvBytesPerToken * 64, Math.min(Math.floor(o.vramBudget / 4), shape.kvBytesPerToken * maxModelLen));
  return undefined;
}

/** The unbudgeted default, once the weights are in: a share of what they left free. */
function kvCacheBytesAfterUpload(backend: DeviceBackend, shape: RunnerShape): number {
  const tier = backend.capabilities.computeTier;
  const free = (backend.capabilities.memory[tier] ?? 0) - backend.stats().liveBytes;
  return Math.min(16 * 2 ** 30, Math.max(32 * 2 ** 20, 0.6 * (free - shape.activationBytes)));
}

/** Sampling defaults a model ships in generation_config.json; fields that are not numbers are ignored. */
function generationDefaults(g: Record<string, unknown> | undefined): Engine['generationDefaults'] {
  const out: Engine['generationDefaults'] = {};
  if (!g || g.do_sample === false) return g ? { temperature: 0 } : out;
  const n = (k: string) => (typeof g[k] === 'number' && Number.isFinite(g[k]) ? (g[k] as number) : undefined);
  if (n('temperature') !== undefined) out.temperature = n('temperature');
  if (n('top_k') !== undefined) out.topK = n('top_k');
  if (n('top_p') !== undefined) out.topP = n('top_p');
  if (n('min_p') !== undefined) out.minP = n('min_p');
  if (n('repetition_penalty') !== undefined) out.repetitionPenalty = n('repetition_penalty');
  return out;
}

/** Length of the longest suffix of text (past `from`) that could start a stop string. */
function holdBack(text: string, stops: readonly string[], from: number): number {
  let hold = 0;
  for (const s of stops) {
    for (let k = Math.min(s.length - 1, text.length - from); k > hold; k--) {
      if (text.endsWith(s.slice(0, k))) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

/** The pager's moves during one step, shared among its tokens. */
function pagerDelta(a: PagerStats, b: PagerStats, share: number) {
  return { loads: (b.loads - a.loads) * share, h2dBytes: (b.h2dBytes - a.h2dBytes) * share, diskReadBytes: (b.diskReadBytes - a.diskReadBytes) * share };
}

function statsDelta(a: BackendStats, b: BackendStats, share: number) {
  const syncs = emptySyncCounts();
  for (const k of SYNC_KINDS) syncs[k] = (b.syncs[k] - a.syncs[k]) * share;
  const allocs = b.allocCalls - a.allocCalls + (b.freeCalls - a.freeCalls);
  return {
    launches: (b.launches - a.launches) * share,
    graphReplays: (b.graphReplays - a.graphReplays) * share,
    syncs,
    h2dBytes: (b.h2dBytes - a.h2dBytes) * share,
    d2hBytes: (b.d2hBytes - a.d2hBytes) * share,
    d2dBytes: (b.d2dBytes - a.d2dBytes) * share,
    allocatorCalls: allocs * share,
    hotPathAllocations: (b.hotPathAllocations - a.hotPathAllocations) * share,
    // Host compute near data in the step (host MLP slices, host attention over warm KV pages).
    ...(a.hostComputeMs !== undefined && b.hostComputeMs !== undefined ? { cpuActiveMs: (b.hostComputeMs - a.hostComputeMs) * share } : {}),
  };
}

/**
 * Pinned host memory the CUDA backend reserves: the master copies of streamed weight blocks (a
 * VRAM budget) and the warm KV pool (tiered KV, float32 pages), plus room for host buffers and the
 * start-up rate measurement.
 */
function pinnedBytesFor(o: EngineOptions, s: ModelSpec, checkpointBytes: number, budgeted: boolean): number {
  let bytes = 320 * 2 ** 20;
  if (budgeted) bytes += Math.min(o.hostBudget ?? Number.POSITIVE_INFINITY, checkpointBytes);
  if (o.kvVramBudget !== undefined) {
    const pageBytes = 2 * s.numLayers * s.numKvHeads * s.headDim * 4 * (o.blockSize ?? 16);
    const hot = Math.floor(o.kvVramBudget / pageBytes);
    bytes += Math.max(1, Math.floor((o.kvHostBudget ?? 8 * hot * pageBytes) / pageBytes)) * pageBytes;
  }
  return bytes;
}
