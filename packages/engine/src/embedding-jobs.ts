import type { DeviceBackend, DeviceBuffer } from '@nerva/core';
import type { KvCacheManager } from '@nerva/kv';
import type { ModelSpec } from '@nerva/models';
import { EngineError } from './engine-options.js';
import { type EmbedOptions, type EmbedResult, type EmbeddingConfig, finishEmbedding, readEmbeddingConfig, type ResolvedEmbedding, resolveEmbedding, validateEmbedRequest } from './embedding.js';
import { Request } from './request.js';
import { InvalidParamsError, resolveSamplingParams } from './sampling-params.js';
import type { RequestLimits } from './request-validation.js';
import type { Scheduler, ScheduledRequest } from './scheduler.js';

/** The context's public side the embedding jobs read (a ModelContext is one). */
export interface EmbeddingContext {
  readonly spec: ModelSpec;
  readonly backend: DeviceBackend;
  readonly modelDir: string;
  readonly limits: RequestLimits;
  readonly kv: KvCacheManager;
  encode(text: string): number[];
}

/** The context's internals the embedding jobs use. */
export interface EmbeddingHost {
  readonly scheduler: Scheduler;
  /** After a pass: the final norm of the residual stream's first `rows` rows, in a buffer [rows, hidden]. */
  finalHidden(rows: number): DeviceBuffer;
  nextId(): number;
  /** Queue work: the step loop runs. */
  kick(): void;
  /** A request left the batch between steps (captured decode state is stale). */
  batchChanged(): void;
  disposed(): boolean;
}

/** One input of an embed call: a prompt request that is prefilled and never sampled. */
interface EmbedSeq {
  req: Request;
  job: EmbedJob;
  index: number;
  /** mean: the sum of each KV block's rows (float64); rows [0, covered) are in it. */
  blockSums?: Float64Array[];
  covered: number;
  /** last: the final position's hidden state. */
  last?: Float32Array;
  /** What went wrong while its rows were read: the call fails with it when the input finishes. */
  error?: Error;
  done: boolean;
}

/** One embed call: its inputs, their vectors as they finish, and its promise. */
interface EmbedJob {
  how: ResolvedEmbedding;
  seqs: EmbedSeq[];
  out: Float32Array[];
  remaining: number;
  resolve: (r: EmbedResult) => void;
  reject: (e: Error) => void;
  cleanup?: () => void;
}

/**
 * Embedding requests inside a context. Each input is a request the scheduler prefills like any
 * prompt (chunked under the token budget, batched with other requests, preempted and recomputed
 * under KV pressure). After a step's pass, the final hidden states of the rows it needs (the last
 * row of a finished prompt for `last` pooling, every row for `mean`) are the final norm of the
 * residual stream (the rows the LM head reads), read back; when its last row is computed the
 * request leaves the scheduler at once (its KV blocks freed) and its vector is done. The logit row
 * it takes in that step is sampled and dropped.
 */
export class EmbeddingJobs {
  private readonly seqs = new Map<number, EmbedSeq>();
  /** Inputs of calls that failed: one may still have a logit row in the step that failed it. */
  private readonly dropped = new WeakSet<Request>();
  private configRead: Promise<EmbeddingConfig> | undefined;

  private readonly H: number;
  private readonly blockSize: number;

  constructor(
    private readonly ctx: EmbeddingContext,
    private readonly host: EmbeddingHost,
  ) {
    this.H = ctx.spec.hiddenSize;
    this.blockSize = ctx.kv.blockSize;
  }

  /** The model folder's embedding settings, read once (a read that failed is tried again next time). */
  config(): Promise<EmbeddingConfig> {
    this.configRead ??= readEmbeddingConfig(this.ctx.modelDir, this.H).catch((e: unknown) => {
      this.configRead = undefined;
      throw e;
    });
    return this.configRead;
  }

  /** Whether request `id` is an embedding input. */
  has(id: number): boolean {
    return this.seqs.has(id);
  }

  /** Whether any of a step's requests is an embedding input. */
  inStep(scheduled: readonly ScheduledRequest[]): boolean {
    if (this.seqs.size === 0) return false;
    return scheduled.some((s) => this.seqs.has(s.req.id));
  }

  /**
   * An embed call: texts tokenized as Hugging Face does (with the tokenizer's special tokens, e.g.
   * the end-of-text token Qwen3-Embedding pools at), every input and option checked (InvalidParamsError
   * naming the field) before anything is queued, then one prompt request per input.
   */
  async embed(inputs: readonly (string | readonly number[])[], o: EmbedOptions): Promise<EmbedResult> {
    if (this.host.disposed()) throw new EngineError('DISPOSED', 'engine is disposed');
    if (!Array.isArray(inputs)) throw new InvalidParamsError('input', 'must be an array of inputs (texts or token id arrays)');
    const ids = inputs.map((x) => (typeof x === 'string' ? this.ctx.encode(x) : [...x]));
    validateEmbedRequest(this.ctx.limits, ids, o);
    const how = resolveEmbedding(await this.config(), o, this.H);
    if (this.host.disposed()) throw new EngineError('DISPOSED', 'engine is disposed');
    if (o.signal?.aborted) throw o.signal.reason ?? new EngineError('ABORTED', 'aborted');
    return this.start(ids, how, o.priority ?? 0, o.signal);
  }

  /**
   * Queue one request per input (validated already) and resolve with their vectors in input order.
   * Mean pooling needs every row, so its requests take a cache salt of their own: a prefix-cache
   * hit can then only be the request's own blocks after a preemption, whose rows it has summed.
   */
  private start(inputs: readonly (readonly number[])[], how: ResolvedEmbedding, priority: number, signal: AbortSignal | undefined): Promise<EmbedResult> {
    const h = this.host;
    return new Promise<EmbedResult>((resolve, reject) => {
      const job: EmbedJob = { how, seqs: [], out: new Array<Float32Array>(inputs.length), remaining: inputs.length, resolve, reject };
      const params = resolveSamplingParams({ temperature: 0, maxTokens: 1 }, { maxTokens: 1, vocabSize: this.ctx.spec.vocabSize });
      const now = performance.now();
      for (const [index, ids] of inputs.entries()) {
        const id = h.nextId();
        const salt = how.pooling === 'mean' ? `\u0000embed-mean-${id}` : undefined;
        job.seqs.push({ req: new Request(id, ids, params, priority, salt, now), job, index, covered: 0, done: false });
      }
      if (signal) {
        const onAbort = () => this.fail(job, signal.reason instanceof Error ? signal.reason : new EngineError('ABORTED', 'aborted'));
        signal.addEventListener('abort', onAbort, { once: true });
        job.cleanup = () => signal.removeEventListener('abort', onAbort);
      }
      for (const s of job.seqs) {
        this.seqs.set(s.req.id, s);
        h.scheduler.add(s.req);
      }
      h.kick();
    });
  }

  /**
   * After a step's pass and before its requests' computed counts move on: read the final hidden
   * states this step's embedding rows contribute. Rows are laid out as the plan lists its requests
   * (stageBatch), each request's rows from its computed count on.
   */
  collect(scheduled: readonly ScheduledRequest[]): void {
    if (!this.inStep(scheduled)) return;
    const H = this.H;
    const bs = this.blockSize;
    // Row ranges of the embedding requests that need rows from this step.
    const wanted: { seq: EmbedSeq; first: number; n: number; start: number }[] = [];
    let row = 0;
    for (const { req, numTokens } of scheduled) {
      const seq = this.seqs.get(req.id);
      const start = req.numComputedTokens;
      if (seq && seq.job.how.pooling === 'mean') wanted.push({ seq, first: row, n: numTokens, start });
      else if (seq && start + numTokens === req.numTokens) wanted.push({ seq, first: row + numTokens - 1, n: 1, start: req.numTokens - 1 });
      row += numTokens;
    }
    if (wanted.length === 0) return;
    const end = Math.max(...wanted.map((w) => w.first + w.n));
    const hidden = this.host.finalHidden(end);
    for (const { seq, first, n, start } of wanted) {
      const rows = this.ctx.backend.read(hidden, first * H, n * H) as Float32Array;
      if (seq.job.how.pooling === 'last') {
        seq.last = rows.slice(0, H);
        continue;
      }
      const sums = (seq.blockSums ??= []);
      // Neither can happen (see start): the call fails with it when the input finishes, and the
      // other requests run on.
      if (start < seq.covered && start % bs !== 0) seq.error ??= new EngineError('EMBED_ROWS', `request ${seq.req.id}: recomputation from position ${start}, inside a KV block`);
      if (start > seq.covered) seq.error ??= new EngineError('EMBED_ROWS', `request ${seq.req.id}: rows from ${seq.covered} to ${start} were never computed (a prefix-cache hit under mean pooling)`);
      if (seq.error) continue;
      // Recomputed after a preemption, from 0 or from the end of its own cached blocks (whole
      // blocks): what those positions added is dropped and added again.
      if (start < seq.covered) sums.length = start / bs;
      for (let j = 0; j < n; j++) {
        const b = Math.floor((start + j) / bs);
        const acc = (sums[b] ??= new Float64Array(H));
        for (let k = 0, o = j * H; k < H; k++) acc[k] += rows[o + k];
      }
      seq.covered = start + n;
    }
  }

  /**
   * The step computed `req`'s last row (it has a logit row in the step): its vector is made, the
   * request leaves the scheduler with its KV blocks freed, and the call resolves once every input
   * is done. Returns false when `req` is not an embedding input.
   */
  finishRow(req: Request): boolean {
    if (this.dropped.has(req)) return true;
    const seq = this.seqs.get(req.id);
    if (!seq) return false;
    const h = this.host;
    this.seqs.delete(req.id);
    h.scheduler.remove(req);
    req.status = 'FINISHED_STOPPED';
    req.finishReason = 'stop';
    req.times.finished = performance.now();
    seq.done = true;
    const job = seq.job;
    const pooled = this.pooled(seq);
    if (pooled instanceof Error) {
      this.fail(job, pooled);
      return true;
    }
    job.out[seq.index] = finishEmbedding(pooled, job.how);
    seq.blockSums = undefined;
    seq.last = undefined;
    if (--job.remaining === 0) {
      job.cleanup?.();
      const { how } = job;
      job.resolve({
        embeddings: job.out,
        promptTokens: job.seqs.map((s) => s.req.promptIds.length),
        pooling: how.pooling,
        normalized: how.normalize || how.truncated,
        dimensions: how.dimensions,
      });
    }
    return true;
  }

  /** A finished input's pooled hidden state: the last row, or the mean of every row (float64). */
  private pooled(seq: EmbedSeq): Float32Array | Float64Array | Error {
    const req = seq.req;
    if (seq.error) return seq.error;
    if (seq.job.how.pooling === 'last') return seq.last ?? new EngineError('EMBED_ROWS', `request ${req.id}: its last row was not read`);
    if (seq.covered !== req.numTokens) return new EngineError('EMBED_ROWS', `request ${req.id}: ${seq.covered} of ${req.numTokens} rows summed`);
    const H = this.H;
    // Block sums in position order: the same additions whatever the chunks and batches were.
    const mean = new Float64Array(H);
    for (const b of seq.blockSums ?? []) for (let k = 0; k < H; k++) mean[k] += b[k];
    for (let k = 0; k < H; k++) mean[k] /= req.numTokens;
    return mean;
  }

  /** End a call with `err`: its inputs still queued or running leave the scheduler (KV freed). */
  private fail(job: EmbedJob, err: Error): void {
    if (job.remaining <= 0) return;
    job.remaining = 0;
    for (const s of job.seqs) {
      if (s.done) continue;
      s.done = true;
      this.dropped.add(s.req);
      this.seqs.delete(s.req.id);
      this.host.scheduler.remove(s.req);
      s.req.status = 'FINISHED_ABORTED';
      s.req.finishReason = 'abort';
    }
    this.host.batchChanged();
    job.cleanup?.();
    job.reject(err);
  }

  /** End every call with `err` (the engine failed or is disposed). */
  failAll(err: Error): void {
    const jobs = new Set([...this.seqs.values()].map((s) => s.job));
    for (const j of jobs) this.fail(j, err);
  }
}
