import { existsSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { fileURLToPath } from 'node:url';
import { MessageChannel, type MessagePort, receiveMessageOnPort, Worker } from 'node:worker_threads';
import { NervaError } from '@nerva/core';
import { type GrammarState, maskAllows } from './grammar-state.js';
import {
  type AdvanceError,
  C_BEAT,
  C_COMPILING,
  C_EXITED,
  CONTROL_WORDS,
  type FromGrammarWorker,
  fromWire,
  type GrammarWorkerInit,
  H_SEQ,
  H_STATUS,
  H_TERMINATED,
  HEADER_WORDS,
  sharedBytes,
  STATUS_FAILED,
  STATUS_OK,
} from './pool-protocol.js';
import { grammarKey, type GrammarSpec } from './spec.js';
import type { EncodedVocab } from './vocab.js';
import { GrammarEngineError } from './xgrammar-runtime.js';

/** The most grammar workers a context starts by default (each holds its own XGrammar instance, ~40 MB). */
export const DEFAULT_GRAMMAR_THREADS_CAP = 8;

/** The default worker count: a core each but the step loop's, at most DEFAULT_GRAMMAR_THREADS_CAP. */
export function defaultGrammarThreads(): number {
  return Math.max(1, Math.min(DEFAULT_GRAMMAR_THREADS_CAP, availableParallelism() - 1));
}

/**
 * How long a step waits for one mask before that request fails. A mask takes milliseconds; a
 * compile running on the same worker (a large schema) can take seconds, so the bound is generous:
 * it only ends a wait on a worker that stopped answering.
 */
const MASK_WAIT_LIMIT_MS = 120_000;
/**
 * A worker that handled nothing for this long, compiling nothing, while a step waits on it is
 * taken for gone: a worker thread that was terminated or died runs no exit handler, and its exit
 * event cannot reach a step loop blocked in a wait. (A live worker handles a message within
 * milliseconds unless it compiles.)
 */
const SILENT_LIMIT_MS = 5_000;
/** A waiting loop wakes this often to see whether the worker is alive. */
const WAIT_SLICE_MS = 50;

/**
 * The built grammar worker entry: next to this module (the package's dist, or a bundle that ships
 * it as grammar-worker.js), else the package's dist seen from its sources; undefined where none
 * is built (masks are then computed on the step loop's thread).
 */
export function grammarWorkerUrl(): URL | undefined {
  for (const rel of ['./grammar-worker.js', './grammar-worker.mjs', '../../dist/grammar-worker.js']) {
    const u = new URL(rel, import.meta.url);
    if (existsSync(fileURLToPath(u))) return u;
  }
  return undefined;
}

interface PoolWorker {
  index: number;
  worker: Worker;
  /** Advance errors (read synchronously: the loop is blocked in a wait when it needs one). */
  errors: MessagePort;
  /** Matchers it holds (starts in flight included): new ones go to the worker with the fewest. */
  live: number;
  /** [id, token] pairs not yet posted. */
  jobs: number[];
  starts: Map<number, { resolve: () => void; reject: (e: Error) => void }>;
  /** Advance errors read off the port, by matcher id. */
  advanceErrors: Map<number, Error>;
  /** Grammars it compiled (by grammarKey; its cache may have dropped the oldest since). */
  grammars: Set<string>;
  /** Set once the worker is gone (its matchers fail on their next wait). */
  lost?: Error;
}

/**
 * Grammar matchers on a pool of worker threads (constrained decoding off the step loop's
 * thread): each worker owns an XGrammar instance over the model's vocabulary and compiles (and
 * caches) the grammars of the matchers assigned to it; a matcher goes to the worker holding the
 * fewest. The step loop hands a step's sampled tokens to the workers at once (`flush`: one message
 * a worker) and each mask comes back through a SharedArrayBuffer, so K constrained rows cost
 * about K / threads mask times, computed while the loop does everything else.
 */
export class GrammarPool {
  private readonly workers: PoolWorker[] = [];
  private readonly control: Int32Array;
  private nextId = 1;
  private pending = false;
  private disposed = false;
  private vocabCache: EncodedVocab | undefined;

  /**
   * @param entry the built grammar worker (grammarWorkerUrl)
   * @param threads workers started with the first grammar
   * @param vocab the model's vocabulary as XGrammar reads it (encoded once, sent to each worker)
   * @param vocabSize ids of a logit row
   * @param eosTokenIds the grammars' stop tokens where a request gives none
   */
  constructor(
    private readonly entry: URL,
    readonly threads: number,
    private readonly vocab: () => EncodedVocab,
    readonly vocabSize: number,
    private readonly eosTokenIds: readonly number[],
  ) {
    if (!Number.isInteger(threads) || threads < 1) throw new RangeError(`a grammar pool needs at least one thread, got ${threads}`);
    this.control = new Int32Array(new SharedArrayBuffer(4 * CONTROL_WORDS * threads));
  }

  /** Words of one token mask. */
  get maskWords(): number {
    return Math.ceil(this.vocabSize / 32);
  }

  /**
   * Compile `g` and start one matcher per entry of `stops`, each with its first mask computed.
   * Rejects with InvalidParamsError (naming `param`) for a bad grammar, and starts none then.
   */
  async start(g: GrammarSpec, stops: readonly (readonly number[])[], param = 'grammar'): Promise<PooledGrammarState[]> {
    if (this.disposed) throw new GrammarEngineError('DISPOSED', 'the grammar pool is disposed');
    const settled = await Promise.allSettled(stops.map((s) => this.startOne(g, s, param)));
    const failed = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) {
      for (const r of settled) if (r.status === 'fulfilled') r.value.dispose();
      throw failed.reason;
    }
    return settled.map((r) => (r as PromiseFulfilledResult<PooledGrammarState>).value);
  }

  private startOne(g: GrammarSpec, stops: readonly number[], param: string): Promise<PooledGrammarState> {
    const key = grammarKey(g);
    const w = this.pick(key);
    w.grammars.add(key);
    const id = this.nextId++;
    const shared = new SharedArrayBuffer(sharedBytes(this.maskWords));
    const stopIds = stops.length > 0 ? stops : this.eosTokenIds;
    w.live++;
    return new Promise<PooledGrammarState>((resolve, reject) => {
      w.starts.set(id, {
        resolve: () => resolve(new PooledGrammarState(this, w, id, shared, new Set(stopIds), this.vocabSize)),
        reject: (e) => {
          w.live--;
          reject(e);
        },
      });
      // Held while a start is in flight: an answer is awaited (otherwise workers keep no process alive).
      w.worker.ref();
      w.worker.postMessage({ op: 'start', id, grammar: g, param, stops: [...stopIds], shared });
    });
  }

  /**
   * The worker with the fewest matchers, among those one that compiled grammar `key` already (a
   * compile holds its worker, and the matchers on it, for up to seconds); a fresh worker in the
   * place of any that was lost.
   */
  private pick(key: string): PoolWorker {
    for (let i = 0; i < this.threads; i++) if (this.workers[i] === undefined || this.workers[i].lost) this.workers[i] = this.spawn(i);
    let best = this.workers[0];
    for (const w of this.workers) {
      if (w.live < best.live || (w.live === best.live && w.grammars.has(key) && !best.grammars.has(key))) best = w;
    }
    return best;
  }

  private spawn(index: number): PoolWorker {
    this.vocabCache ??= this.vocab();
    const { port1, port2 } = new MessageChannel();
    for (let k = 0; k < CONTROL_WORDS; k++) Atomics.store(this.control, index * CONTROL_WORDS + k, 0);
    const init: GrammarWorkerInit = { vocab: this.vocabCache, vocabSize: this.vocabSize, eosTokenIds: [...this.eosTokenIds], errors: port2, control: this.control.buffer as SharedArrayBuffer, index };
    const worker = new Worker(this.entry, { workerData: init, transferList: [port2] });
    worker.unref();
    const w: PoolWorker = { index, worker, errors: port1, live: 0, jobs: [], starts: new Map(), advanceErrors: new Map(), grammars: new Set() };
    worker.on('message', (m: FromGrammarWorker) => {
      const s = w.starts.get(m.id);
      if (!s) return;
      w.starts.delete(m.id);
      if (w.starts.size === 0) worker.unref();
      if (m.op === 'started') s.resolve();
      else s.reject(fromWire(m.error));
    });
    worker.on('error', (e) => this.lose(w, new GrammarEngineError('WORKER_FAILED', `grammar worker ${index} failed: ${e.message}`)));
    worker.on('exit', (code) => this.lose(w, new GrammarEngineError('WORKER_EXITED', `grammar worker ${index} exited (code ${code})`)));
    return w;
  }

  private lose(w: PoolWorker, err: Error): void {
    if (w.lost) return;
    w.lost = this.disposed ? new GrammarEngineError('DISPOSED', 'the grammar pool is disposed') : err;
    for (const s of w.starts.values()) s.reject(w.lost);
    w.starts.clear();
    w.worker.unref();
  }

  /** Queue an advance (posted by the next flush). */
  enqueue(w: PoolWorker, id: number, token: number): void {
    w.jobs.push(id, token);
    this.pending = true;
  }

  /** Post the queued advances: one message a worker. */
  flush(): void {
    if (!this.pending) return;
    this.pending = false;
    for (const w of this.workers) {
      if (w.jobs.length === 0) continue;
      if (!w.lost) w.worker.postMessage({ op: 'advance', jobs: w.jobs });
      w.jobs = [];
    }
  }

  /**
   * Block until `header`'s sequence word reaches `seq`; throws when the worker exited, went silent
   * (SILENT_LIMIT_MS, not compiling), or computed nothing past MASK_WAIT_LIMIT_MS.
   */
  waitFor(w: PoolWorker, header: Int32Array, seq: number): void {
    this.flush();
    const c = w.index * CONTROL_WORDS;
    const t0 = performance.now();
    let beat = Atomics.load(this.control, c + C_BEAT);
    let heard = t0;
    for (;;) {
      const cur = Atomics.load(header, H_SEQ);
      if (cur === seq) return;
      if (w.lost) throw w.lost;
      if (Atomics.load(this.control, c + C_EXITED) === 1) throw this.gone(w, `grammar worker ${w.index} exited`);
      const now = performance.now();
      const b = Atomics.load(this.control, c + C_BEAT);
      if (b !== beat) {
        beat = b;
        heard = now;
      } else if (now - heard > SILENT_LIMIT_MS && Atomics.load(this.control, c + C_COMPILING) === 0) {
        throw this.gone(w, `grammar worker ${w.index} exited or stopped answering (nothing handled in ${SILENT_LIMIT_MS / 1000} s)`);
      }
      if (now - t0 > MASK_WAIT_LIMIT_MS) throw this.gone(w, `grammar worker ${w.index} computed no mask in ${MASK_WAIT_LIMIT_MS / 1000} s`);
      Atomics.wait(header, H_SEQ, cur, WAIT_SLICE_MS);
    }
  }

  /** Give up on worker `w` (its matchers fail; the next start replaces it) and return the error. */
  private gone(w: PoolWorker, message: string): Error {
    this.lose(w, new GrammarEngineError('WORKER_EXITED', message));
    void w.worker.terminate();
    return w.lost!;
  }

  /** The error of matcher `id`'s last advance (the worker put it on its error port before publishing). */
  advanceError(w: PoolWorker, id: number): Error {
    for (let m = receiveMessageOnPort(w.errors); m !== undefined; m = receiveMessageOnPort(w.errors)) {
      const a = m.message as AdvanceError;
      w.advanceErrors.set(a.id, fromWire(a.error));
    }
    const e = w.advanceErrors.get(id);
    w.advanceErrors.delete(id);
    return e ?? new GrammarEngineError('GRAMMAR_WORKER', `grammar worker ${w.index}: matcher ${id} failed`);
  }

  /** Free matcher `id` on its worker. */
  free(w: PoolWorker, id: number): void {
    w.live--;
    w.advanceErrors.delete(id);
    if (!w.lost && !this.disposed) w.worker.postMessage({ op: 'free', id });
  }

  /** Stop the workers (their matchers end with them). */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    for (const w of this.workers) {
      this.lose(w, new GrammarEngineError('DISPOSED', 'the grammar pool is disposed'));
      w.errors.close();
      void w.worker.terminate();
    }
  }
}

/**
 * A grammar state whose matcher runs on a pool worker. `submit` checks the token against the
 * current mask here (the mask is exact: XGrammar takes every token it allows), so a refused token
 * is known at once and an accepted stop token ends the grammar without a round trip; any other
 * token goes to the worker, which computes the next mask into the shared buffer while the step
 * loop goes on. `ready` waits for it; `lastMs` is that wait (the part of the mask's time on the
 * step's critical path).
 */
export class PooledGrammarState implements GrammarState {
  readonly mask: Int32Array;
  lastMs = 0;
  private readonly header: Int32Array;
  /** Advances handed to the worker, and the last of them `ready` returned for. */
  private sent = 0;
  private seen = 0;
  private done = false;
  private failure: Error | undefined;
  private freed = false;

  constructor(
    private readonly pool: GrammarPool,
    private readonly worker: PoolWorker,
    private readonly id: number,
    shared: SharedArrayBuffer,
    private readonly stops: ReadonlySet<number>,
    private readonly vocabSize: number,
  ) {
    this.header = new Int32Array(shared, 0, HEADER_WORDS);
    this.mask = new Int32Array(shared, HEADER_WORDS * 4);
  }

  get terminated(): boolean {
    return this.done;
  }

  allows(t: number): boolean {
    return maskAllows(this.mask, this.vocabSize, t);
  }

  submit(token: number): boolean {
    // The mask this token was sampled under (the step waited for it already, normally).
    if (this.seen !== this.sent || this.failure) this.ready();
    if (this.done || !this.allows(token)) return false;
    if (this.stops.has(token)) {
      // An allowed stop token: the grammar accepts and the output ends; there is no next mask.
      this.done = true;
      return true;
    }
    this.sent++;
    this.pool.enqueue(this.worker, this.id, token);
    return true;
  }

  ready(): void {
    if (this.failure) throw this.failure;
    // Nothing new to wait for: lastMs stays the wait for the current mask.
    if (this.seen === this.sent) return;
    const t0 = performance.now();
    try {
      this.pool.waitFor(this.worker, this.header, this.sent);
    } catch (e) {
      this.failure = e as Error;
      throw e;
    } finally {
      this.lastMs = performance.now() - t0;
    }
    this.seen = this.sent;
    const status = this.header[H_STATUS];
    if (status !== STATUS_OK) {
      this.failure = status === STATUS_FAILED ? this.pool.advanceError(this.worker, this.id) : new NervaError('GRAMMAR_REJECTED', 'the grammar engine refused a token its mask allowed');
      throw this.failure;
    }
    if (this.header[H_TERMINATED] === 1) this.done = true;
  }

  advance(token: number): boolean {
    const ok = this.submit(token);
    if (ok) this.ready();
    return ok;
  }

  dispose(): void {
    if (this.freed) return;
    this.freed = true;
    this.pool.free(this.worker, this.id);
  }
}
