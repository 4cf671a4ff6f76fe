import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { loadModelTokenizer, type NervaTokenizer } from '@nerva/models';
import { type EmbedOptions, type EmbedResult, validateEmbedRequest } from '../embedding.js';
import { EngineError, type StepSignals } from '../engine-options.js';
import type { TokenEvent } from '../request.js';
import { validateForkCount, validateRequest } from '../request-validation.js';
import { InvalidParamsError } from '../sampling-params.js';
import { TokenStream } from '../token-stream.js';
import {
  ENGINE_FACTS,
  type EngineFacts,
  type FromWorker,
  type ToWorker,
  type WireError,
  type WorkerEngineInfo,
  type WorkerEngineOptions,
  type WorkerEngineStats,
  type WorkerGenerateOptions,
  type WorkerLoad,
  type WorkerOutcome,
  type WorkerQuery,
  type WorkerQueryResult,
  type WorkerRequestHandle,
  type WorkerSubmitOptions,
  type WorkerSurface,
  type WorkerFault,
  type WorkerHealth,
} from './protocol.js';

/** Options of {@link WorkerEngine.create}: engine options plus what only the main thread uses. */
export interface WorkerEngineCreateOptions extends WorkerEngineOptions {
  /** Chat template source that replaces the model's own (or gives one to a model without). */
  chatTemplate?: string;
  /**
   * Milliseconds the worker may stay silent (no step, event or reply) while it has work before it
   * counts as hung: every request and query then fails with a WORKER_HUNG {@link EngineError} and
   * the worker is terminated. 0 or absent: no watchdog.
   */
  watchdogMs?: number;
}

interface Pending {
  stream: TokenStream<TokenEvent>;
  resolve: (o: WorkerOutcome) => void;
  reject: (e: Error) => void;
  aborted: boolean;
  cleanup?: () => void;
}

/** Rebuild an error from its wire form, keeping the param of invalid-parameter errors. */
function fromWire(w: WireError): Error {
  if (w.name === 'InvalidParamsError' && w.param !== undefined) {
    // The engine's message is already "param: detail"; strip the prefix the constructor adds again.
    const prefix = `${w.param}: `;
    return new InvalidParamsError(w.param, w.message.startsWith(prefix) ? w.message.slice(prefix.length) : w.message);
  }
  return new EngineError(w.code ?? 'WORKER', w.message);
}

/** Where the bundled worker entry lives: next to this module (dist) — sources need a build first. */
function workerEntryUrl(): URL {
  const url = new URL('./worker-entry.js', import.meta.url);
  if (existsSync(fileURLToPath(url))) return url;
  // Running from sources (tests that import src/): use the built entry of this package.
  const built = new URL('../../dist/worker-entry.js', import.meta.url);
  if (existsSync(fileURLToPath(built))) return built;
  throw new EngineError('NO_WORKER_ENTRY', `worker entry not found at ${fileURLToPath(url)}; build @nerva/engine first`);
}

/** The engine facts as getters reading a worker proxy's `info` (one per ENGINE_FACTS entry, typed from the engine's). */
abstract class EngineFactsView {
  abstract readonly info: WorkerEngineInfo;
}
for (const k of ENGINE_FACTS) Object.defineProperty(EngineFactsView.prototype, k, { get(this: EngineFactsView) { return this.info[k]; }, configurable: true });
const FactsView = EngineFactsView as abstract new () => EngineFactsView & Readonly<EngineFacts>;

/**
 * An {@link Engine} that runs in a `worker_threads` Worker. A CPU forward pass is synchronous
 * JavaScript; running it here keeps the caller's event loop (an HTTP server) responsive. Requests
 * are validated on the calling thread, so bad parameters still throw {@link InvalidParamsError}
 * synchronously; tokenization runs on the calling thread with the model's own tokenizer.
 */
export class WorkerEngine extends FactsView implements WorkerSurface, WorkerHealth {
  /** Facts about the loaded model and cache. */
  readonly info: WorkerEngineInfo;
  /** The model's tokenizer, loaded on this thread (undefined when the folder has none). */
  readonly tokenizer: NervaTokenizer | undefined;
  private readonly worker: Worker;
  private readonly pending = new Map<number, Pending>();
  private readonly queries = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  private readonly stepListeners = new Set<(s: StepSignals) => void>();
  private readonly finishListeners = new Set<(o: WorkerOutcome) => void>();
  private load: WorkerLoad = { running: 0, waiting: 0, kvUsage: 0 };
  private nextRid = 1;
  private nextQid = 1;
  private dead: Error | undefined;
  private disposing: Promise<void> | undefined;
  private onDisposed: (() => void) | undefined;
  private readonly failureListeners = new Set<(e: Error) => void>();
  private watchdog: NodeJS.Timeout | undefined;
  private lastHeard = performance.now();

  private constructor(worker: Worker, info: WorkerEngineInfo, tokenizer: NervaTokenizer | undefined, watchdogMs: number) {
    super();
    this.worker = worker;
    this.info = info;
    this.tokenizer = tokenizer;
    worker.on('message', (m: FromWorker) => this.onMessage(m));
    worker.on('error', (e) => this.fail(new EngineError('WORKER_ERROR', `engine worker failed: ${e.message}`)));
    worker.on('exit', (code) => this.fail(new EngineError('WORKER_EXIT', `engine worker exited with code ${code}`)));
    if (watchdogMs > 0) {
      this.watchdog = setInterval(() => this.checkAlive(watchdogMs), Math.max(10, Math.min(1000, watchdogMs / 4)));
      this.watchdog.unref();
    }
  }

  get isDead(): boolean {
    return this.dead !== undefined;
  }

  onFailure(fn: (e: Error) => void): () => void {
    this.failureListeners.add(fn);
    return () => this.failureListeners.delete(fn);
  }

  injectFault(what: WorkerFault): void {
    this.post({ type: 'fault', what });
  }

  /** The watchdog: work outstanding and nothing heard from the worker for `ms` → hung. */
  private checkAlive(ms: number): void {
    if (this.dead || this.disposing) return;
    const now = performance.now();
    if (this.pending.size === 0 && this.queries.size === 0) {
      this.lastHeard = now;
      return;
    }
    if (now - this.lastHeard <= ms) return;
    this.fail(new EngineError('WORKER_HUNG', `engine worker made no progress for ${(ms / 1000).toFixed(1)} s`));
    void this.worker.terminate();
  }

  /** Start a worker, load the model there and the tokenizer here. Rejects with the worker's load error. */
  static async create(o: WorkerEngineCreateOptions): Promise<WorkerEngine> {
    const { chatTemplate, watchdogMs, ...engineOpts } = o;
    const tokenizerPromise = loadTokenizer(o.model, chatTemplate);
    const worker = new Worker(workerEntryUrl(), { workerData: engineOpts });
    let info: WorkerEngineInfo;
    // Only our own listeners are removed afterwards: Worker keeps internal ones (removeAllListeners breaks it).
    let onMsg!: (m: FromWorker) => void;
    let onError!: (e: Error) => void;
    let onExit!: (code: number) => void;
    try {
      info = await new Promise<WorkerEngineInfo>((resolve, reject) => {
        onMsg = (m) => {
          if (m.type === 'ready') resolve(m.info);
          else if (m.type === 'initError') reject(fromWire(m.error));
        };
        onError = reject;
        onExit = (code) => reject(new EngineError('WORKER_EXIT', `engine worker exited with code ${code} while loading`));
        worker.on('message', onMsg);
        worker.once('error', onError);
        worker.once('exit', onExit);
      });
    } catch (e) {
      await worker.terminate();
      throw e;
    } finally {
      worker.off('message', onMsg);
      worker.off('error', onError);
      worker.off('exit', onExit);
    }
    let tokenizer: NervaTokenizer | undefined;
    try {
      tokenizer = await tokenizerPromise;
    } catch (e) {
      await worker.terminate();
      throw e;
    }
    return new WorkerEngine(worker, info, tokenizer, watchdogMs ?? 0);
  }

  /** Requests running at the last report from the worker. */
  get numRunning(): number {
    return this.load.running;
  }

  /** Requests waiting at the last report from the worker. */
  get numWaiting(): number {
    return this.load.waiting;
  }

  /** KV usage (0..1) at the last report from the worker. */
  get kvUsage(): number {
    return this.load.kvUsage;
  }

  /** Requests submitted here whose outcome has not arrived yet. */
  get numInFlight(): number {
    return this.pending.size;
  }

  encode(text: string): number[] {
    if (!this.tokenizer) throw new EngineError('NO_TOKENIZER', `model ${this.info.modelDir} has no tokenizer.json; pass token ids`);
    return this.tokenizer.encode(text);
  }

  onStep(fn: (s: StepSignals) => void): () => void {
    this.stepListeners.add(fn);
    return () => this.stepListeners.delete(fn);
  }

  onFinish(fn: (o: WorkerOutcome) => void): () => void {
    this.finishListeners.add(fn);
    return () => this.finishListeners.delete(fn);
  }

  /**
   * Queue a request in the worker. Checks the same things the engine checks, here and
   * synchronously: invalid parameters throw {@link InvalidParamsError} before anything is sent.
   */
  submit(prompt: string | readonly number[], o: WorkerSubmitOptions = {}): WorkerRequestHandle {
    if (this.dead) throw this.dead;
    if (this.disposing) throw new EngineError('DISPOSED', 'engine is disposed');
    const { signal, ...opts } = o;
    const ids = typeof prompt === 'string' ? this.encode(prompt) : [...prompt];
    this.validate(ids, opts);
    if (signal?.aborted) throw signal.reason ?? new EngineError('ABORTED', 'aborted');
    const h = this.track(signal);
    this.post({ type: 'submit', rid: h.id, promptIds: ids, opts: stripUndefined(opts) });
    return h;
  }

  /** The most forks {@link submitFork} takes for one prompt (the engine's maxNumSeqs). */
  get maxForks(): number {
    return this.info.limits.maxForks ?? 1;
  }

  /**
   * {@link Engine.submitFork} in the worker: `n` shared-prefix forks of one prompt (the prompt
   * prefilled once, its full KV blocks shared, fork i sampling with seed + i), one handle each.
   * Validated here and synchronously, as in the engine: a bad request or `n` throws
   * {@link InvalidParamsError} before anything is sent. `signal` aborts every fork.
   */
  submitFork(prompt: string | readonly number[], n: number, o: WorkerSubmitOptions = {}): WorkerRequestHandle[] {
    if (this.dead) throw this.dead;
    if (this.disposing) throw new EngineError('DISPOSED', 'engine is disposed');
    const { signal, ...opts } = o;
    const ids = typeof prompt === 'string' ? this.encode(prompt) : [...prompt];
    this.validate(ids, opts);
    validateForkCount(this.info.limits, n, opts);
    if (signal?.aborted) throw signal.reason ?? new EngineError('ABORTED', 'aborted');
    const hs = Array.from({ length: n }, () => this.track(signal));
    this.post({ type: 'submitFork', rids: hs.map((h) => h.id), promptIds: ids, opts: stripUndefined(opts) });
    return hs;
  }

  /** A handle for a request about to be posted to the worker. */
  private track(signal: AbortSignal | undefined): WorkerRequestHandle {
    const rid = this.nextRid++;
    const stream = new TokenStream<TokenEvent>();
    let resolve!: (o: WorkerOutcome) => void;
    let reject!: (e: Error) => void;
    const done = new Promise<WorkerOutcome>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    // A caller that only reads events must not see an unhandled rejection.
    done.catch(() => {});
    const p: Pending = { stream, resolve, reject, aborted: false };
    if (this.pending.size === 0 && this.queries.size === 0) this.lastHeard = performance.now();
    this.pending.set(rid, p);
    const abort = () => {
      if (p.aborted || !this.pending.has(rid)) return;
      p.aborted = true;
      this.post({ type: 'abort', rid });
    };
    if (signal) {
      signal.addEventListener('abort', abort, { once: true });
      p.cleanup = () => signal.removeEventListener('abort', abort);
    }
    stream.onReturn = abort;
    return { id: rid, events: stream, done, abort };
  }

  /**
   * {@link Engine.embed} in the worker: texts tokenized here, inputs and options checked here
   * (InvalidParamsError naming the field, nothing sent), the rest (the model's embedding config,
   * Matryoshka `dimensions`) in the worker. `signal` aborts the call there: its inputs leave the
   * scheduler and the promise rejects once the worker has freed their KV blocks.
   */
  async embed(inputs: readonly (string | readonly number[])[], o: EmbedOptions = {}): Promise<EmbedResult> {
    if (this.dead) throw this.dead;
    if (this.disposing) throw new EngineError('DISPOSED', 'engine is disposed');
    const { signal, ...opts } = o;
    if (!Array.isArray(inputs)) throw new InvalidParamsError('input', 'must be an array of inputs (texts or token id arrays)');
    const ids = inputs.map((x) => (typeof x === 'string' ? this.encode(x) : [...x]));
    validateEmbedRequest(this.info.limits, ids, opts);
    if (signal?.aborted) throw signal.reason ?? new EngineError('ABORTED', 'aborted');
    const qid = this.nextQid++;
    if (this.pending.size === 0 && this.queries.size === 0) this.lastHeard = performance.now();
    const onAbort = () => this.post({ type: 'abortEmbed', qid });
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      return await new Promise<EmbedResult>((resolve, reject) => {
        this.queries.set(qid, { resolve: resolve as (v: unknown) => void, reject });
        this.post({ type: 'embed', qid, inputs: ids, opts: stripUndefined(opts) });
      });
    } finally {
      signal?.removeEventListener('abort', onAbort);
    }
  }

  /** Engine and KV statistics, read in the worker between steps. */
  stats(): Promise<WorkerEngineStats> {
    return this.query('stats');
  }

  /** Run the KV cache's invariant check in the worker; rejects listing every violation. */
  async checkInvariants(): Promise<void> {
    await this.query('checkInvariants');
  }

  /** Fail every request still running, free the model and stop the worker. */
  dispose(): Promise<void> {
    if (this.disposing) return this.disposing;
    this.disposing = (async () => {
      if (!this.dead) {
        const disposed = new Promise<void>((r) => (this.onDisposed = r));
        this.post({ type: 'dispose' });
        // A worker stuck in a long step still gets a few seconds before it is terminated.
        await Promise.race([disposed, new Promise((r) => setTimeout(r, 5000).unref())]);
      }
      this.fail(new EngineError('DISPOSED', 'engine disposed'));
      await this.worker.terminate();
    })();
    return this.disposing;
  }

  private validate(ids: number[], o: WorkerGenerateOptions): void {
    validateRequest(this.info.limits, ids, o);
  }

  /** Ask the engine one of ENGINE_QUERIES between its steps. */
  query<K extends WorkerQuery>(what: K): Promise<WorkerQueryResult<K>> {
    if (this.dead) return Promise.reject(this.dead);
    const qid = this.nextQid++;
    if (this.pending.size === 0 && this.queries.size === 0) this.lastHeard = performance.now();
    return new Promise((resolve, reject) => {
      this.queries.set(qid, { resolve: resolve as (v: unknown) => void, reject });
      this.post({ type: 'query', qid, what });
    });
  }

  private post(m: ToWorker): void {
    if (!this.dead) this.worker.postMessage(m);
  }

  private onMessage(m: FromWorker): void {
    this.lastHeard = performance.now();
    switch (m.type) {
      case 'batch':
        this.load = m.load;
        for (const sig of m.steps) for (const f of this.stepListeners) f(sig);
        for (let i = 0; i < m.events.length; i++) this.pending.get(m.rids[i])?.stream.push(m.events[i]);
        for (const e of m.ends) {
          if ('outcome' in e) this.finished(e.rid, e.outcome);
          else this.failed(e.rid, fromWire(e.error));
        }
        return;
      case 'reply': {
        const q = this.queries.get(m.qid);
        if (!q) return;
        this.queries.delete(m.qid);
        if (m.error) q.reject(fromWire(m.error));
        else q.resolve(m.value);
        return;
      }
      case 'disposed':
        this.onDisposed?.();
        return;
      default:
        return;
    }
  }

  /** A request's outcome arrived: end its stream, resolve its handle, tell the finish listeners. */
  private finished(rid: number, outcome: WorkerOutcome): void {
    const p = this.pending.get(rid);
    if (!p) return;
    this.pending.delete(rid);
    p.cleanup?.();
    p.stream.end();
    p.resolve(outcome);
    for (const f of this.finishListeners) f(outcome);
  }

  /** The worker failed a request: end its stream and its handle with the error. */
  private failed(rid: number, err: Error): void {
    const p = this.pending.get(rid);
    if (!p) return;
    this.pending.delete(rid);
    p.cleanup?.();
    p.stream.end(err);
    p.reject(err);
  }

  /** The worker is gone: end every stream and query with `err`. */
  private fail(err: Error): void {
    if (this.dead) return;
    this.dead = err;
    clearInterval(this.watchdog);
    for (const [rid, p] of this.pending) {
      this.pending.delete(rid);
      p.cleanup?.();
      p.stream.end(err);
      p.reject(err);
    }
    for (const [qid, q] of this.queries) {
      this.queries.delete(qid);
      q.reject(err);
    }
    this.onDisposed?.();
    if (!this.disposing) for (const f of this.failureListeners) f(err);
  }
}

/** Load the tokenizer of `dir` (a model folder or .gguf file) on this thread; `chatTemplate` overrides the model's template. */
function loadTokenizer(dir: string, chatTemplate: string | undefined): Promise<NervaTokenizer | undefined> {
  return loadModelTokenizer(dir, chatTemplate);
}

/** Structured clone keeps `undefined` fields; dropping them keeps messages small and defaults intact. */
function stripUndefined<T extends object>(o: T): T {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(o)) if (v !== undefined) out[k] = v;
  return out as T;
}

