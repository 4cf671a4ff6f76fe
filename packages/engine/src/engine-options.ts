import type { DeviceBackend, LedgerAggregator, MatmulPrecision, Numerics } from '@nerva/core';
import { MATMUL_PRECISIONS, NervaError, NUMERICS } from '@nerva/core';
import type { BackendChoice } from './backend-select.js';
import { KV_CACHE_DTYPES, type KvCacheDtype, type UploadProgress } from './model-weights.js';
import { validateKvTiers } from './kv-tiering.js';
import type { FinishReason, Request, TokenEvent } from './request.js';
import type { GrammarOptions } from './grammar/spec.js';
import type { SamplingParams } from './sampling-params.js';
import { validateResidency } from './weight-residency.js';

export interface EngineOptions {
  /** A model folder (config.json + safetensors [+ tokenizer.json]). */
  model: string;
  /** 'auto' tries CUDA, then falls back to the CPU reference (recorded in every ledger). */
  backend?: BackendChoice | DeviceBackend;
  maxNumSeqs?: number;
  /** Token budget of one scheduler step (also the largest prefill chunk). */
  maxNumBatchedTokens?: number;
  /**
   * Prompt tokens a step may take while other requests are decoding (chunked prefill's pace; at
   * most maxNumBatchedTokens, which is also the default: no separate limit). Every running
   * stream's next token waits for the whole step, so this bounds how long a burst of arriving
   * prompts stalls them; a step with no decode row still takes up to maxNumBatchedTokens. It
   * costs throughput: a step with prompt tokens runs as a mixed pass, not the captured decode
   * graph, so smaller values turn more steps into slower ones. Offline batches want the default;
   * a server whose clients watch the gaps sets it (`nerva serve` does: see its default).
   * Batch-invariant steps pace prompts by their own rule and ignore it.
   */
  decodePromptBudget?: number;
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
  /**
   * Worker threads that compute constrained decoding's token masks (each with its own XGrammar
   * instance, ~40 MB, started with the first grammar request): a step's grammar rows are advanced
   * in parallel, while the device runs the next forward. Default: one a core but one, at most 8.
   * 0: on the step loop's thread (also where the package's grammar worker entry is not built).
   */
  grammarThreads?: number;
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
   * model's layers. With a VRAM budget (`vramBudget` for every stage, or `stageVramBudgets` one
   * per stage) the layers are split so each stage's weights, KV share and activations fit its
   * budget, all resident (refused, naming the stage and the bytes, when they cannot); a host
   * budget (paged weights) is not supported with N > 1.
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
   * Each pipeline stage's VRAM budget in bytes, one per stage (GPUs of different sizes, or other
   * tenants on some): stages with less take fewer layers. Needs `pipelineParallel` (or
   * `stageDevices`) of the same length; excludes `vramBudget`, which gives every stage the same.
   */
  stageVramBudgets?: number[];
  /**
   * Tensor-parallel shards (default 1): every decoder layer split across N backends of one kind,
   * each projection by its output rows, the activations all-gathered after each, so tokens and
   * logits equal the one-backend run bit for bit (`TensorParallelGroup`). N must divide the
   * model's KV heads (GQA groups stay whole). With `pipelineParallel` S, each stage is split
   * across N shards of its own. On CUDA this needs N x S visible GPUs unless
   * `allowSingleDeviceStages`; on the CPU backend each shard gets a CPU backend of its own. Under
   * `vramBudget` (or `stageVramBudgets`, one per stage) every shard must fit its GPU's budget
   * resident. Not yet with MoE models, `stageDevices`, pipeline micro-batches, a host budget or
   * tiered KV.
   */
  tensorParallel?: number;
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

/**
 * Options of one request: sampling and stopping (SamplingParams), constrained decoding
 * (`grammar`, `jsonSchema`: the output matches the grammar, and a request that stops, stops where
 * the grammar accepts; one that reaches maxTokens first ends with finishReason 'length'), and the rest.
 */
export interface GenerateOptions extends SamplingParams, GrammarOptions {
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
  /**
   * Whether this step was enqueued on the device ahead of the host (EngineOptions.runAhead): the
   * device had it before the host took the tokens of the step before. False: it was issued once
   * the host had scheduled it, and the device may have idled meanwhile.
   */
  enqueuedAhead: boolean;
}

export interface RequestOutcome {
  requestId: number;
  promptIds: readonly number[];
  tokenIds: number[];
  text: string;
  finishReason: FinishReason;
  stopReason?: string | number;
  /**
   * Why the request ended with finishReason 'abort' when it was not its caller's doing: the error
   * its event stream ended with (a bad grammar, a failed step, a lost worker), with its code where
   * it is a NervaError. Absent for requests that finished or that their caller aborted.
   */
  error?: { message: string; code?: string };
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


/** The most steps one decode replay runs (EngineOptions.runAheadSteps): each is a graph copy of the step. */
export const MAX_RUN_AHEAD_STEPS = 16;

/** The most grammar worker threads a context starts (EngineOptions.grammarThreads). */
export const MAX_GRAMMAR_THREADS = 64;

/**
 * Options that choose the backend and place the weights: what a `NervaModel` is loaded with.
 * The rest of EngineOptions shapes one context; a model loaded with them plans its memory for a
 * first context of that shape (KV cache beside the weights under a budget).
 */
export type ModelOptions = Pick<
  EngineOptions,
  | 'model'
  | 'backend'
  | 'onProgress'
  | 'deviceArenaBytes'
  | 'pipelineParallel'
  | 'allowSingleDeviceStages'
  | 'stageDevices'
  | 'pipelineMicroBatches'
  | 'stageVramBudgets'
  | 'tensorParallel'
  | 'numerics'
  | 'matmulPrecision'
  | 'batchInvariant'
  | 'vramBudget'
  | 'hostBudget'
  | 'offloadDir'
  | 'hostCompute'
  | 'importanceCache'
> &
  Partial<ContextOptions>;

/** Options of one context on a model (`NervaModel.createContext`): its KV cache, scheduler, step loop and graphs. */
export type ContextOptions = Pick<
  EngineOptions,
  | 'maxNumSeqs'
  | 'maxNumBatchedTokens'
  | 'decodePromptBudget'
  | 'blockSize'
  | 'kvCacheBytes'
  | 'kvCacheDtype'
  | 'maxModelLen'
  | 'enablePrefixCaching'
  | 'useGraphs'
  | 'runAhead'
  | 'runAheadSteps'
  | 'runAheadMs'
  | 'grammarThreads'
  | 'profile'
  | 'kvVramBudget'
  | 'kvHostBudget'
  | 'kvOffloadDir'
  | 'kvWarmLinkShare'
  | 'kvFreeOutsideWindow'
>;

/** Options checked before anything loads (a refused one leaves no file open). Throws RangeError. */
export function checkEngineOptions(o: Omit<EngineOptions, 'model'>): void {
  if (o.matmulPrecision !== undefined && !MATMUL_PRECISIONS.includes(o.matmulPrecision))
    throw new RangeError(`matmulPrecision must be ${MATMUL_PRECISIONS.join(' or ')}, got ${String(o.matmulPrecision)}`);
  if (o.decodePromptBudget !== undefined && !(Number.isSafeInteger(o.decodePromptBudget) && o.decodePromptBudget >= 1))
    throw new RangeError(`decodePromptBudget must be a positive integer, got ${JSON.stringify(o.decodePromptBudget)}`);
  if (o.runAheadSteps !== undefined && !(Number.isInteger(o.runAheadSteps) && o.runAheadSteps >= 1 && o.runAheadSteps <= MAX_RUN_AHEAD_STEPS))
    throw new RangeError(`runAheadSteps must be an integer from 1 to ${MAX_RUN_AHEAD_STEPS}, got ${JSON.stringify(o.runAheadSteps)}`);
  if (o.runAheadMs !== undefined && !(typeof o.runAheadMs === 'number' && o.runAheadMs >= 0))
    throw new RangeError(`runAheadMs must be a number of milliseconds (0 or more, Infinity allowed), got ${JSON.stringify(o.runAheadMs)}`);
  if (o.grammarThreads !== undefined && !(Number.isInteger(o.grammarThreads) && o.grammarThreads >= 0 && o.grammarThreads <= MAX_GRAMMAR_THREADS))
    throw new RangeError(`grammarThreads must be an integer from 0 to ${MAX_GRAMMAR_THREADS}, got ${JSON.stringify(o.grammarThreads)}`);
  if (o.batchInvariant !== undefined && typeof o.batchInvariant !== 'boolean') throw new RangeError(`batchInvariant must be a boolean, got ${JSON.stringify(o.batchInvariant)}`);
  if (o.numerics !== undefined && !NUMERICS.includes(o.numerics)) throw new RangeError(`numerics must be ${NUMERICS.join(' or ')}, got ${String(o.numerics)}`);
  if (o.kvCacheDtype !== undefined && !KV_CACHE_DTYPES.includes(o.kvCacheDtype)) throw new RangeError(`kvCacheDtype must be ${KV_CACHE_DTYPES.join(', ')}, got ${String(o.kvCacheDtype)}`);
  validateResidency(o);
  validateKvTiers(o);
}
