import { getHeapStatistics } from 'node:v8';
import type { BackendCapabilities, LedgerSummary } from '@nerva/core';
import type { KvCacheStats } from '@nerva/kv';
import type { MemoryReport } from '@nerva/memos';
import type { ModelContext } from '../context.js';
import type { EmbedOptions } from '../embedding.js';
import type { EngineOptions, GenerateOptions, RequestHandle, RequestOutcome, StepSignals } from '../engine-options.js';
import type { TokenEvent } from '../request.js';

/**
 * Messages between {@link WorkerEngine} (main thread) and the worker that owns the Engine.
 * Everything here is plain data: it crosses the thread boundary by structured clone.
 */

/**
 * Engine options that can cross a thread boundary (no callbacks, no backend object). The memory
 * budgets (`vramBudget`, `hostBudget`, `offloadDir`) and the pipeline options (`pipelineParallel`,
 * `allowSingleDeviceStages`, `stageDevices`, `pipelineMicroBatches`) are plain data and travel as
 * they are.
 */
export type WorkerEngineOptions = Omit<EngineOptions, 'backend' | 'onProgress'> & {
  backend?: 'cpu' | 'cuda' | 'auto';
};

/** Submit options that cross the boundary: the AbortSignal stays on the main thread. */
export type WorkerGenerateOptions = Omit<GenerateOptions, 'signal' | 'returnPromptLogits'>;

/** Embed options that cross the boundary: the AbortSignal stays on the main thread (an abort is a message). */
export type WorkerEmbedOptions = Omit<EmbedOptions, 'signal'>;

/**
 * Engine facts a worker reports once loaded, each read by name from the engine: a
 * {@link WorkerEngine} offers every one as a getter of the same name and type.
 */
export const ENGINE_FACTS = ['modelDir', 'maxModelLen', 'numBlocks', 'kvCacheBytes', 'kvDtype', 'weightBytes', 'eosTokenIds', 'generationDefaults', 'limits'] as const;
export type EngineFact = (typeof ENGINE_FACTS)[number];

/** A value as structured clone delivers it: read-only arrays arrive as arrays. */
type Cloned<T> = T extends readonly (infer U)[] ? U[] : T;

/** The engine facts, typed from the engine's own members. */
export type EngineFacts = { -readonly [K in EngineFact]: Cloned<ModelContext[K]> };

/** What the worker reports once the model is loaded: the engine facts, and the backend's. */
export interface WorkerEngineInfo extends EngineFacts {
  backendName: string;
  deviceKind: string;
  /** What the backend declares (device count, peer access, tiers): the server's fabric probe reads it. */
  capabilities: BackendCapabilities;
  notes: string[];
  vocabSize: number;
  blockSize: number;
  hasTokenizer: boolean;
}

/** The info a loaded engine reports (run in the worker). */
export function engineInfo(engine: ModelContext): WorkerEngineInfo {
  const facts = Object.fromEntries(ENGINE_FACTS.map((k) => [k, engine[k]])) as EngineFacts;
  return {
    ...facts,
    eosTokenIds: [...engine.eosTokenIds],
    generationDefaults: { ...engine.generationDefaults },
    backendName: engine.backend.name,
    deviceKind: engine.backend.capabilities.deviceKind,
    capabilities: engine.backend.capabilities,
    notes: [...engine.notes],
    vocabSize: engine.spec.vocabSize,
    blockSize: engine.kv.blockSize,
    hasTokenizer: engine.tokenizer !== undefined,
  };
}

/** The last known scheduler state, sent with every step and every finish. */
export interface WorkerLoad {
  running: number;
  waiting: number;
  kvUsage: number;
}

/** A finished request as seen across the boundary: the ledger travels as its summary. */
export type WorkerOutcome = Omit<RequestOutcome, 'ledger' | 'promptLogits'> & { ledger: LedgerSummary };

/** Engine statistics for memory reports and leak checks. */
export interface WorkerEngineStats extends WorkerLoad {
  kv: KvCacheStats;
  numBlocks: number;
  blockSize: number;
  kvCacheBytes: number;
  weightBytes: number;
  deviceKind: string;
  /** The memory OS report: bytes per tier, weight placement, traffic by path, prefetch. */
  memory: MemoryReport;
}

/**
 * Questions a {@link WorkerEngine} asks the engine between steps, answered in the worker by
 * these functions of the engine (and its last load): `WorkerEngine.query(name)` resolves with
 * the answer's type.
 */
export const ENGINE_QUERIES = {
  /** Engine and KV statistics, with the memory OS report. */
  stats: (engine: ModelContext, load: WorkerLoad): WorkerEngineStats => ({
    ...load,
    kv: engine.kv.stats(),
    numBlocks: engine.numBlocks,
    blockSize: engine.kv.blockSize,
    kvCacheBytes: engine.kvCacheBytes,
    weightBytes: engine.weightBytes,
    deviceKind: engine.backend.capabilities.deviceKind,
    memory: engine.memoryReport(),
  }),
  /**
   * The engine thread's V8 heap (this isolate's, not the process's), for leak checks: garbage is
   * collected first where the process runs with --expose-gc (a measurement, never in production).
   */
  heap: (): { usedBytes: number; totalBytes: number; externalBytes: number } => {
    (globalThis as { gc?: () => void }).gc?.();
    const h = getHeapStatistics();
    return { usedBytes: h.used_heap_size, totalBytes: h.total_heap_size, externalBytes: h.external_memory };
  },
  /** The KV cache's invariant check (throws listing every violation). */
  checkInvariants: (engine: ModelContext): true => {
    engine.kv.checkInvariants();
    return true;
  },
} satisfies Record<string, (engine: ModelContext, load: WorkerLoad) => unknown>;
export type WorkerQuery = keyof typeof ENGINE_QUERIES;
export type WorkerQueryResult<K extends WorkerQuery> = ReturnType<(typeof ENGINE_QUERIES)[K]>;

/** Engine methods a {@link WorkerEngine} offers, with the engine's signatures carried across the thread boundary (see WorkerSurface). */
export const PROXIED_METHODS = ['submit', 'submitFork', 'encode', 'onStep', 'onFinish'] as const;

/**
 * Engine methods a {@link WorkerEngine} offers with the engine's own signature: their arguments
 * and results cross the boundary as they are (embed's AbortSignal is observed on the calling thread).
 */
export const SAME_SIGNATURE_METHODS = ['embed'] as const;

/** A request running in the worker: the engine's handle, with the outcome as it crosses the boundary. */
export interface WorkerRequestHandle extends Omit<RequestHandle, 'done'> {
  /** Resolves with the outcome (finishReason 'abort' after an abort); rejects if the worker failed the request. */
  readonly done: Promise<WorkerOutcome>;
}

/** Submit options: those of the engine, with the AbortSignal observed on the calling thread. */
export type WorkerSubmitOptions = WorkerGenerateOptions & { signal?: AbortSignal };

/** An engine type as a worker proxy has it: handles, outcomes and options in their cross-thread forms; functions mapped through. */
type Across<T> = T extends RequestHandle
  ? WorkerRequestHandle
  : T extends readonly RequestHandle[]
    ? WorkerRequestHandle[]
    : T extends RequestOutcome
      ? WorkerOutcome
      : [T] extends [GenerateOptions | undefined]
        ? [GenerateOptions] extends [T]
          ? WorkerSubmitOptions
          : T
        : T extends (...args: infer A) => infer R
          ? (...args: { [I in keyof A]: Across<A[I]> }) => Across<R>
          : T;

/**
 * The surface a worker proxy derives from the engine's: each of PROXIED_METHODS with the
 * engine's signature (types mapped by Across), each of SAME_SIGNATURE_METHODS with it unchanged,
 * each of ENGINE_FACTS as a read-only property, and
 * the scheduler's load. `WorkerEngine implements` it, so a change to the engine's signatures
 * shows up as a type error in the proxy.
 */
export type WorkerSurface = { [K in (typeof PROXIED_METHODS)[number]]: Across<ModelContext[K]> } & Pick<ModelContext, (typeof SAME_SIGNATURE_METHODS)[number]> & Readonly<EngineFacts> & Pick<ModelContext, 'numRunning' | 'numWaiting'>;

/** A fault a test injects into the worker: a step that never returns, or the thread exiting. */
export type WorkerFault = 'hang' | 'exit';

/**
 * What a worker proxy adds to the engine's surface: the worker's own life. A watchdog fails every
 * request and query with an EngineError (WORKER_HUNG) when the worker stays silent with work
 * outstanding; a crash or exit fails them with WORKER_ERROR or WORKER_EXIT.
 */
export interface WorkerHealth {
  /** Whether the worker is gone (crashed, hung and terminated, or disposed). */
  readonly isDead: boolean;
  /** Called once when the worker dies (crash, exit or hang; not on dispose) with the error requests got; returns the unsubscribe. */
  onFailure(fn: (e: Error) => void): () => void;
  /** Tests of the watchdog and of crash handling: make the worker hang in a step, or exit. */
  injectFault(what: WorkerFault): void;
}

/** An error as plain data; rebuilt on the other side with the same class name, code and param. */
export interface WireError {
  name: string;
  message: string;
  code?: string;
  param?: string;
}

export type ToWorker =
  | { type: 'submit'; rid: number; promptIds: number[]; opts: WorkerGenerateOptions }
  /** Engine.submitFork: fork i answers under rids[i]. */
  | { type: 'submitFork'; rids: number[]; promptIds: number[]; opts: WorkerGenerateOptions }
  | { type: 'abort'; rid: number }
  /** Engine.embed: answered by a `reply` under `qid` (the result, or the error). */
  | { type: 'embed'; qid: number; inputs: number[][]; opts: WorkerEmbedOptions }
  /** Abort the embed call of `qid`: its inputs leave the scheduler; it is answered with the abort error. */
  | { type: 'abortEmbed'; qid: number }
  | { type: 'query'; qid: number; what: WorkerQuery }
  | { type: 'dispose' }
  /** Tests of the watchdog: make the worker hang (a busy loop) or exit. */
  | { type: 'fault'; what: WorkerFault };

/** A request that ended: its outcome, or the error that failed it. */
export type WorkerEnd = { rid: number; outcome: WorkerOutcome } | { rid: number; error: WireError };

/**
 * What the engine produced in one turn of the worker's loop (one step, as a rule), posted as one
 * message once the step is done: a message per step rather than per token, so that the cost of
 * crossing the thread boundary does not grow with the batch. Read in this order: the step
 * signals, the token events (each request's in the order it produced them), then the ends (a
 * request's end after its last event).
 */
export interface WorkerBatch {
  type: 'batch';
  steps: StepSignals[];
  /** `events[i]` belongs to the request submitted under `rids[i]`. */
  rids: number[];
  events: TokenEvent[];
  ends: WorkerEnd[];
  /** The scheduler's state when the batch was posted. */
  load: WorkerLoad;
}

export type FromWorker =
  | { type: 'ready'; info: WorkerEngineInfo }
  | { type: 'initError'; error: WireError }
  | WorkerBatch
  | { type: 'reply'; qid: number; value?: unknown; error?: WireError }
  | { type: 'disposed' };

/** Turn any thrown value into plain data. */
export function toWire(e: unknown): WireError {
  if (e instanceof Error) {
    const w: WireError = { name: e.name, message: e.message };
    const code = (e as { code?: unknown }).code;
    const param = (e as { param?: unknown }).param;
    if (typeof code === 'string') w.code = code;
    if (typeof param === 'string') w.param = param;
    return w;
  }
  return { name: 'Error', message: String(e) };
}
