import type { RequestLimits } from '../request-validation.js';
import type { BackendCapabilities } from '@nerva/core';
import type { LedgerSummary } from '@nerva/core';
import type { KvCacheStats } from '@nerva/kv';
import type { MemoryReport } from '@nerva/memos';
import type { EngineOptions, GenerateOptions, RequestOutcome, StepSignals } from '../engine.js';
import type { TokenEvent } from '../request.js';
import type { SamplingParams } from '../sampling-params.js';

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

/** What the worker reports once the model is loaded. */
export interface WorkerEngineInfo {
  modelDir: string;
  backendName: string;
  deviceKind: string;
  /** What the backend declares (device count, peer access, tiers): the server's fabric probe reads it. */
  capabilities: BackendCapabilities;
  notes: string[];
  vocabSize: number;
  maxModelLen: number;
  numBlocks: number;
  blockSize: number;
  kvCacheBytes: number;
  /** Engine.kvDtype. */
  kvDtype: 'f32' | 'bf16';
  weightBytes: number;
  eosTokenIds: number[];
  generationDefaults: Pick<SamplingParams, 'temperature' | 'topK' | 'topP' | 'minP' | 'repetitionPenalty'>;
  hasTokenizer: boolean;
  /** What the engine validates requests against (Engine.limits: tiered KV's warm pages, sliding windows). */
  limits: RequestLimits;
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
  | { type: 'query'; qid: number; what: 'stats' | 'checkInvariants' }
  | { type: 'dispose' }
  /** Tests of the watchdog: make the worker hang (a busy loop) or exit. */
  | { type: 'fault'; what: 'hang' | 'exit' };

export type FromWorker =
  | { type: 'ready'; info: WorkerEngineInfo }
  | { type: 'initError'; error: WireError }
  | { type: 'event'; rid: number; event: TokenEvent }
  | { type: 'done'; rid: number; outcome: WorkerOutcome; load: WorkerLoad }
  | { type: 'failed'; rid: number; error: WireError; load: WorkerLoad }
  | { type: 'step'; signals: StepSignals }
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
