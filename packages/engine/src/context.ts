import type { DeviceBackend, MatmulPrecision, TokenLedgerRecord } from '@nerva/core';
import { takesOpField } from '@nerva/core';
import { KvCacheManager } from '@nerva/kv';
import type { ImportanceCache, MemoryReport, WeightPager } from '@nerva/memos';
import { calibrateImportance } from './calibration.js';
import type { ModelSpec, NervaTokenizer } from '@nerva/models';
import { kvReadWindow } from '@nerva/models';
import { BUCKETS, bucketFor, DecodeGraphs, keyRangeOf } from './decode-graphs.js';
import { type EngineOptions, EngineError, type GenerateOptions, type RequestHandle, type RequestOutcome, type StepSignals } from './engine-options.js';
import type { EmbedOptions, EmbedResult, EmbeddingConfig } from './embedding.js';
import { EmbeddingJobs } from './embedding-jobs.js';
import { detachFork, forkOut, forkRequests } from './forks.js';
import { ConstrainedDecoding, GrammarStep } from './grammar/constrained.js';
import { defaultGrammarThreads } from './grammar/grammar-pool.js';
import type { GrammarState } from './grammar/grammar-state.js';
import { grammarOf, type GrammarSpec } from './grammar/spec.js';
import { HostSampler, type SampledToken } from './host-sampler.js';
import { contextMemoryReport, stageSpan, TieredKv, tierPlanNote } from './kv-tiering.js';
import { contextLimits, runnerShape } from './memory-plan.js';
import type { GenerationDefaults, NervaModel } from './model.js';
import { ModelRunner } from './model-runner.js';
import { type KvCacheDtype, kvDtypeOf } from './model-weights.js';
import { type PassRunner, type PipelineDescription, StagePipeline } from './stages/pipeline.js';
import { stageResidency } from './stages/placement.js';
import { isPreparedShards, shardResidency, TensorParallelGroup, type TensorParallelDescription } from './stages/tensor-parallel.js';
import { type PassProfile, StepProfiles } from './profiling.js';
import type { MeasuredRates } from './rates.js';
import { type FinishReason, Request, type TokenEvent } from './request.js';
import { type RequestLimits, validateForkCount, validateRequest } from './request-validation.js';
import { passKey } from './row-layout.js';
import { RunAhead } from './run-ahead.js';
import { isDeviceSamplable } from './sampling-params.js';
import { Scheduler } from './scheduler.js';
import { createStepBuffers, padBucket, stageBatch, type StepBuffers, writeStepMeta } from './step-batch.js';
import { pagerDelta, SharedBlockReads, statsDelta, stepSignals, tokenRecord } from './step-stats.js';
import { TokenRingReader } from './token-ring.js';
import { acceptToken, type Live, liveRequest, outcomeOf } from './token-policy.js';

/**
 * One context on a {@link NervaModel}: a paged KV cache, a continuous-batching scheduler, the
 * step loop and its decode graphs, over the model's weights (which other contexts may share).
 * `submit`/`submitFork`/`generate` queue requests (sequences); any number run concurrently and
 * are batched together, with results identical to running alone (same seed). Contexts on one
 * model step independently: each its own requests, KV pages and ledgers.
 *
 * @example
 * ```ts
 * const model = await NervaModel.load({ model: dir, backend: 'cpu' });
 * const ctx = model.createContext({ maxNumSeqs: 8 });
 * const out = await ctx.submit('ROMEO:', { maxTokens: 16, temperature: 0 }).done;
 * ctx.dispose();
 * ```
 */
export class ModelContext {
  /** The model whose weights this context runs. */
  readonly model: NervaModel;
  readonly spec: ModelSpec;
  readonly tokenizer: NervaTokenizer | undefined;
  readonly backend: DeviceBackend;
  /** The model's load notes, then this context's (KV layout, tiers, windows); every request's ledger starts with them. */
  readonly notes: string[];
  /**
   * The rates compute near data was planned from (measured at start-up, host-to-device copies and
   * the host MLP together), when the model measured them: paged weights with hostCompute 'auto'.
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
  readonly generationDefaults: GenerationDefaults;
  /** @internal The pass runner: one ModelRunner, or the stage pipeline. */
  protected readonly runner: PassRunner;
  /**
   * The stages, when the model runs as a pipeline (pipelineParallel > 1), or the shards of a
   * tensor-parallel group (tensorParallel > 1); `runner` is then this.
   */
  private readonly pipeline: StagePipeline | TensorParallelGroup | undefined;
  private readonly pager: WeightPager | undefined;
  private readonly scheduler: Scheduler;
  /** Tiered KV (kvVramBudget): the page policy and its moves; undefined when all KV is hot. */
  private readonly kvTiers: TieredKv | undefined;
  /** Every layer slides and pages behind this window are freed (0: none are). */
  private readonly kvWindow: number;
  private readonly sampler: HostSampler;
  /** Grammar requests' compilation, masks and mask buffers (constrained decoding). */
  private readonly constrained: ConstrainedDecoding;
  /** Embedding inputs (Engine.embed): prompt requests whose final hidden states are pooled. */
  private readonly embeddings: EmbeddingJobs;
  private readonly live = new Map<number, Live>();
  private readonly graphs: DecodeGraphs;
  private readonly useGraphs: boolean;
  private readonly profiles: StepProfiles;
  private readonly stepListeners = new Set<(s: StepSignals) => void>();
  private readonly finishListeners = new Set<(o: RequestOutcome) => void>();
  private nextId = 1;
  private readonly blockReads: SharedBlockReads;
  private looping = false;
  private disposed = false;
  /** The host's read position in the device token ring. */
  private readonly ring: TokenRingReader;
  private totalPreemptions = 0;
  private readonly stage: StepBuffers;
  private readonly ahead: RunAhead;
  /** Whether decode steps are enqueued ahead of the host (EngineOptions.runAhead, resolved). */
  readonly runAhead: boolean;
  /** EngineOptions.runAheadSteps and runAheadMs, resolved. */
  readonly runAheadSteps: number;
  readonly runAheadMs: number;

  /**
   * A context on `model` (also `model.createContext(o)`). Options left out take their defaults
   * (not the model's load options: createContext merges those in).
   */
  constructor(model: NervaModel, o: Partial<EngineOptions> = {}) {
    this.model = model;
    const shape = runnerShape(model.backend, model.spec, o);
    const kvBytes = model.attach(this, shape, o);
    try {
      this.measuredRates = model.measuredRates;
      this.modelDir = model.modelDir;
      this.spec = model.spec;
      this.tokenizer = model.tokenizer;
      this.backend = model.backend;
      this.notes = [...model.notes];
      this.matmulPrecision = this.backend.capabilities.matmulPrecision ?? 'exact';
      if (this.matmulPrecision === 'bf16') {
        const attn = this.backend.capabilities.deviceKind === 'cuda' ? '; prefill attention runs plain bf16 tensor-core products' : '';
        this.notes.push(`matmul precision bf16: matmuls over more than 8 rows round their activations to bf16 once (fp32 accumulation)${attn}`);
      }
      this.weightBytes = model.weightBytes;
      this.eosTokenIds = model.eosTokenIds;
      this.generationDefaults = model.generationDefaults;
      const s = model.spec;
      const blockSize = o.blockSize ?? 16;
      this.maxModelLen = Math.min(s.maxPositionEmbeddings, o.maxModelLen ?? 4096);
      this.kvDtype = kvDtypeOf(this.backend, o.kvCacheDtype);
      const { maxRows, maxNumSeqs } = shape;
      const { tierPlan, numBlocks, maxBlocksPerSeq, limits } = contextLimits(this.backend, s, shape, kvBytes, this.maxModelLen, blockSize, this.kvDtype, o);
      const { weights, stages } = model.internals;
      this.pipeline = stages ? (isPreparedShards(stages) ? new TensorParallelGroup(s, limits, stages) : new StagePipeline(s, limits, stages)) : undefined;
      this.runner = this.pipeline ?? new ModelRunner(this.backend, s, weights, limits);
      this.ring = new TokenRingReader(this.backend, this.runner);
      // A checkpoint may have more embedding rows than its tokenizer has ids (Qwen pads to a
      // multiple of 128): ids past the tokenizer's are never sampled, on the device or the host.
      const sampleLimit = Math.min(s.vocabSize, this.tokenizer?.vocabSize ?? s.vocabSize);
      for (const r of this.runners) r.sampleLimit = sampleLimit;
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
          // A batch-invariant backend: steps of decode rows only, or of prompt chunks each as alone.
          ...(this.backend.capabilities.batchInvariant === true ? { batchInvariant: true } : {}),
          ...(o.decodePromptBudget !== undefined ? { decodePromptBudget: Math.min(o.decodePromptBudget, maxRows) } : {}),
        },
        this.kv,
      );
      if (tierPlan) this.notes.push(tierPlanNote(tierPlan, blockSize));
      this.sampler = new HostSampler(s.vocabSize, sampleLimit);
      this.embeddings = new EmbeddingJobs(this, {
        scheduler: this.scheduler,
        finalHidden: (rows) => (this.runner as ModelRunner).finalHidden(rows),
        nextId: () => this.nextId++,
        kick: () => this.kick(),
        batchChanged: () => (this.graphs.stateKey = undefined),
        disposed: () => this.disposed,
      });
      // Masks on the device where op sample takes them and one runner samples (a pipeline's last
      // stage samples with meta of its own: grammar rows are sampled on the host there).
      const onDevice = !this.pipeline && takesOpField(this.backend.capabilities, 'sample', 'mask');
      this.constrained = new ConstrainedDecoding(this.backend, this.tokenizer, s.vocabSize, this.eosTokenIds, maxNumSeqs, onDevice, o.grammarThreads ?? defaultGrammarThreads());
      const profile = o.profile ?? false;
      this.pager = weights.pager;
      // Disk-tier reads are host work a replayed graph would skip: such a plan runs eagerly.
      this.useGraphs = (o.useGraphs ?? true) && this.backend.capabilities.graphCapture && !profile && (this.pager?.capturable ?? true) && (this.pipeline?.capturable ?? true);
      if (this.pager && !this.pager.capturable) this.notes.push('paged weights with a disk tier: decode steps run without graph capture');
      if (this.pager) for (const n of this.pager.plan.notes) this.notes.push(n);
      this.profiles = new StepProfiles(this.runner, profile);
      this.stage = createStepBuffers(maxRows, maxNumSeqs, maxBlocksPerSeq, this.kvTiers !== undefined, (limits.linkPages ?? 0) > 0);
      this.blockReads = new SharedBlockReads(pages);
      this.graphs = new DecodeGraphs(this.backend, this.runner, this.pager);
      this.runAhead = this.useGraphs && this.backend.synchronizeEvent !== undefined && (o.runAhead ?? this.backend.capabilities.computeTier === 'vram');
      this.runAheadSteps = o.runAheadSteps ?? 4;
      this.runAheadMs = o.runAheadMs ?? 8;
      // Steps are enqueued ahead only where the next step's pages and weights need no host work between them.
      const ahead = this.runAhead && !this.kvTiers && !this.pager && !this.pipeline;
      const host = { kv: this.kv, maxModelLen: this.maxModelLen, stage: this.stage, waiting: () => this.scheduler.waiting.length, skipRing: (n: number) => this.ring.skip(n) };
      this.ahead = new RunAhead(this.backend, this.runner, this.graphs, host, ahead, this.runAheadSteps, this.runAheadMs);
    } catch (e) {
      model.detach(this);
      throw e;
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

  /** Worker threads computing token masks (EngineOptions.grammarThreads resolved; 0: the step loop's own thread). */
  get grammarThreads(): number {
    return this.constrained.threads;
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
  protected async calibrate(cache: ImportanceCache, key: string): Promise<void> {
    // Paged weights run on one stage (a pipeline rejects a VRAM budget), so this is a ModelRunner.
    if (!(this.runner instanceof ModelRunner)) return;
    const note = await calibrateImportance(this.runner, this.backend, this.spec, Math.min(32, this.maxModelLen - 1), cache, key, (ids) => this.submit(ids, { temperature: 0, maxTokens: 1, ignoreEos: true }).done);
    this.notes.push(note);
  }

  /** Where every weight block lives, what moved and what it cost (the memory OS report). */
  memoryReport(): MemoryReport {
    const r = contextMemoryReport(this.backend, this.model.internals, this.runner, this.kvTiers, this.totalPreemptions, this.kv.blockSize);
    // A split model: what each shard (its weights and KV heads) or stage (its layers) holds.
    if (this.pipeline instanceof TensorParallelGroup) r.devices = shardResidency(this.pipeline, this.model.internals.stages!);
    else if (this.pipeline) r.devices = stageResidency(this.model.internals.stages!, this.runner.kvBytes, this.spec.numLayers);
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

    const grammar = grammarOf(o);
    const req = new Request(this.nextId++, ids, params, priority, o.cacheSalt, performance.now());
    const handle = this.track(req, o);
    if (grammar) this.startConstrained(req, [req], grammar);
    else {
      this.scheduler.add(req);
      this.kick();
    }
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
    const { parent, children } = forkRequests(() => this.nextId++, ids, params, n, priority, o.cacheSalt, now);
    const handles = children.map((c) => this.track(c, o));
    const grammar = grammarOf(o);
    if (grammar) this.startConstrained(parent, children, grammar);
    else {
      this.scheduler.add(parent);
      this.kick();
    }
    return handles;
  }

  /**
   * A grammar request is queued once its grammar is compiled and its first mask computed (the
   * first grammar of a context also builds the grammar engine's vocabulary). `queued` is the
   * request the scheduler takes (a fork's prompt request), `sampled` those with a matcher each.
   * A bad grammar ends them with InvalidParamsError.
   */
  private startConstrained(queued: Request, sampled: Request[], grammar: GrammarSpec): void {
    const lives = sampled.map((r) => this.live.get(r.id)!);
    this.constrained.startLives(grammar, lives, this.eosTokenIds, {
      isLive: (l) => !this.disposed && this.live.get(l.req.id) === l,
      queue: () => {
        if (queued.status !== 'WAITING') return;
        this.scheduler.add(queued);
        this.kick();
      },
      fail: (l, e) => this.failOne(l, e),
    });
  }

  /** The live state, stream and handle of a request about to be queued. */
  private track(req: Request, o: GenerateOptions): RequestHandle {
    const { live, handle } = liveRequest(req, o, this.notes, this.tokenizer, () => this.abort(req.id));
    this.live.set(req.id, live);
    return handle;
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

  /**
   * Embeddings of `inputs` (texts or token ids): the final hidden states after the final norm
   * (what the LM head reads), pooled and normalized as the model folder says, batched with other
   * requests in the scheduler's steps (embedding-jobs.ts). Rejects with InvalidParamsError naming
   * the field before anything is queued.
   *
   * @example
   * ```ts
   * const { embeddings } = await engine.embed(['first text', 'second text']);
   * ```
   */
  async embed(inputs: readonly (string | readonly number[])[], o: EmbedOptions = {}): Promise<EmbedResult> {
    if (this.pipeline) throw new EngineError('UNSUPPORTED', 'embeddings are not computed on a stage pipeline or a tensor-parallel group (pipelineParallel or tensorParallel > 1)');
    return this.embeddings.embed(inputs, o);
  }

  /** The model folder's embedding settings (what `embed` pools and normalizes by default); read once. */
  embeddingConfig(): Promise<EmbeddingConfig> {
    return this.embeddings.config();
  }

  /** Cancel a request: its KV blocks are freed at once. No-op when it already finished. */
  abort(id: number): void {
    const l = this.live.get(id);
    if (!l || l.req.finished) return;
    this.scheduler.remove(l.req);
    detachFork(l.req, this.scheduler, this.graphs);
    if (this.graphs.stateKey !== undefined) this.graphs.stateKey = undefined;
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
        this.ahead.retire();
      } catch (e) {
        this.failAll(e as Error);
      }
    }
  }

  /** End one request with `err` (its KV blocks freed); the others run on. */
  private failOne(l: Live, err: Error): void {
    if (!this.live.has(l.req.id)) return;
    this.abortLive(l, err);
    this.graphs.stateKey = undefined;
  }

  /** Take a live request out of the scheduler and end its stream with `err`. */
  private abortLive(l: Live, err: Error): void {
    this.scheduler.remove(l.req);
    detachFork(l.req, this.scheduler, this.graphs);
    l.req.status = 'FINISHED_ABORTED';
    l.req.finishReason = 'abort';
    this.live.delete(l.req.id);
    l.cleanup?.();
    l.grammar?.dispose();
    l.error = err;
    l.stream.end(err);
    l.resolve(outcomeOf(l));
  }

  private failAll(err: Error): void {
    try {
      this.ahead.retire();
    } catch {
      // the device failed: the step ahead is gone with it
    }
    for (const l of [...this.live.values()]) this.abortLive(l, err);
    this.embeddings.failAll(err);
    this.graphs.stateKey = undefined;
  }

  /** One scheduler step: plan, one forward pass, sampling, and the policies of the host. */
  step(): void {
    const t0 = performance.now();
    // With steps enqueued ahead, a waiting request is admitted once they are done (they are the
    // running rows' next tokens: adopted, not dropped; none is enqueued while it waits).
    const plan = this.scheduler.schedule(this.ahead.queue.length === 0);
    this.totalPreemptions += plan.preempted.length;
    // Freed pages change staged block tables (their entries become the null page).
    if (plan.preempted.length || plan.freedBlocks) this.graphs.stateKey = undefined;
    if (plan.scheduled.length === 0) {
      this.ahead.retire();
      return;
    }
    const before = this.pipeline?.stats() ?? this.backend.stats();
    const pagerBefore = this.pager?.stats();
    let replayed = false;
    const st = this.stage;
    const mb = this.runner.limits.maxBlocksPerSeq;
    const kt = this.kvTiers;
    // Blocks two or more of this step's sequences read (forks, prefix hits): marked per step.
    const shared = this.blockReads;
    shared.begin();
    // Page moves first (demotions, cold pages up to warm): the step reads the tables after them.
    if (kt?.prepareStep(plan, this.kv, this.runner as ModelRunner)) this.graphs.stateKey = undefined;
    // Warm slots [0, linkPages) are the device's (staged over the link), those above the host's;
    // the step copies the leading slots up to the highest one its tables read.
    const linkPages = this.runner.limits.linkPages ?? 0;
    // A decode step over the device's own rows keeps each in its place (finished ones as holes).
    const order =
      this.profiles.on || this.embeddings.inStep(plan.scheduled)
        ? plan.scheduled
        : this.ahead.order(plan.scheduled, ({ req }) => !this.live.get(req.id)?.grammar && this.deviceSamples(req));
    const { rows, promptTokens, sampling, forks, linkUsed, hostPages } = stageBatch(st, order, this.kv, kt?.tiers, mb, linkPages, shared, t0);
    const span = stageSpan(linkUsed, linkPages);
    if (linkPages > 0) (this.runner as ModelRunner).linkSpan = span;
    // No host partial in a pass without host pages: its round trip a layer would cost for nothing.
    if (kt) (this.runner as ModelRunner).hostPages = hostPages;
    if (kt && span > 0) kt.noteStaged(span);
    const nSeq = plan.scheduled.length;
    const nl = sampling.length;
    const decodeOnly = nl === nSeq && rows === order.length && !forks;
    // Grammar rows (constrained decoding): each with its mask for this token.
    const grammars: (GrammarState | undefined)[] = sampling.map((r) => this.live.get(r.id)?.grammar);
    // Rows that need the host sampler (penalties, logprobs, min_tokens, logit bias, logits kept,
    // a grammar where the device takes no mask): only they are read and sampled on the host; the
    // device samples the rest (a mixed step).
    const hostRows =
      nl > 0 ? sampling.flatMap((r, i) => (this.deviceSamples(r) && (grammars[i] === undefined || this.constrained.onDevice) ? [] : [i])) : [];
    const deviceSample = nl > 0 && hostRows.length === 0;
    const gs = new GrammarStep(this.constrained, grammars, hostRows);
    const anyGrammar = gs.any;
    const mixed = hostRows.length > 0 && hostRows.length < nl;
    const V = this.spec.vocabSize;
    const be = this.backend;
    const m = this.runner.meta;
    let tokens: number[] = [];
    const host: Map<Request, ReturnType<HostSampler['sample']>> = new Map();
    let sampleMs = 0;
    const tiered = kt?.tiered ?? false;
    // Grammar rows sampled on the device keep the captured step (a variant with masks), but a grammar
    // row's next mask depends on this step's token: nothing is run ahead over one. An embedding row's
    // hidden state is read after the pass: no step run ahead over it either.
    const graphPath = this.useGraphs && !this.profiles.on && decodeOnly && deviceSample && (!anyGrammar || this.constrained.deviceArgs !== undefined) && !this.embeddings.inStep(plan.scheduled) && rows <= BUCKETS[BUCKETS.length - 1] && rows <= this.runner.limits.maxSeqs;
    const bucket = graphPath ? bucketFor(rows, this.runner.limits.maxSeqs) : 0;
    // A decode step: each row's block for its next position first (RunAhead.reserveNext; a step
    // enqueued ahead has it already), so the key counts it.
    if (graphPath && !tiered) this.ahead.reserveNext(order);
    const key = graphPath ? passKey(this.kv, bucket, tiered, order) : '';
    // The step enqueued ahead is this one when the pass is the same and nothing reset the
    // device's step state since; otherwise the steps enqueued are dropped before anything is written.
    const ra = this.ahead;
    const head = ra.queue[0];
    const same = head !== undefined && graphPath && head.key === key && this.graphs.stateKey !== undefined;
    // A step with grammar rows adopts only a forward enqueued ahead (its sampling waits for the masks).
    const adopt = same && head.sampled && !anyGrammar;
    const adoptForward = same && !head.sampled && anyGrammar;
    if (adopt) ra.adopt(head);
    else if (adoptForward) ra.adoptForward(head);
    else ra.begin();
    if (graphPath) {
      if (!adopt && key !== this.graphs.stateKey) {
        padBucket(st, rows, bucket, mb);
        this.writeMeta(bucket, bucket, true);
      }
      // The device's rows are this step's now, its holes pad rows (written, or equal keys say so).
      ra.layout.place(order, bucket);
      const oneRow = bucket === 1 && !this.pipeline && !tiered;
      const computed = oneRow ? plan.scheduled.map(({ req }) => req.numComputedTokens) : undefined;
      const keyRange = (first: number, last: number) => (computed ? keyRangeOf(be.capabilities, computed, first, last) : undefined);
      const args = anyGrammar ? this.constrained.deviceArgs : undefined;
      const masks = args && { args, stage: () => gs.stage(bucket) };
      if (adoptForward) this.graphs.replaySample(bucket, masks!);
      else if (!adopt) this.graphs.replay(bucket, 1, tiered ? { span, hostPages } : undefined, keyRange(0, 0), masks);
      if (!adopt) be.record(ra.endEv);
      this.graphs.stateKey = key;
      if (anyGrammar) ra.enqueueForward(order, bucket, keyRange);
      else ra.enqueue(order, bucket, keyRange);
      if (ra.queue.length > 0) be.synchronizeEvent!(ra.endEv, 'policy');
      else be.synchronize('policy');
      const ring = this.ring.read(bucket);
      // Row k's token is ring[k]; sampling lists the rows in order, holes left out.
      tokens = rows === nSeq ? ring.slice(0, nSeq) : order.flatMap((row, k) => (row ? [ring[k]] : []));
      replayed = true;
    } else {
      this.graphs.stateKey = undefined;
      ra.layout.clear();
      this.writeMeta(rows, nl, deviceSample || mixed);
      // A prompt's last row sampled once per fork: logit rows repeat (see ModelRunner.repeatedLogitRows).
      const runners = forks ? this.runners : [];
      for (const r of runners) r.repeatedLogitRows = true;
      // A pass of one sequence (a prompt chunk): op attention may skip what sequence seams need.
      // (Every shard of a tensor-parallel group too: each runs one device's attention over its heads.)
      const single = plan.scheduled.length !== 1 || this.pipeline instanceof StagePipeline ? [] : this.runners;
      for (const r of single) r.oneSequence = true;
      try {
        if (tiered) (this.runner as ModelRunner).forward(rows, nl, undefined, undefined, true);
        else this.runner.forward(rows, nl);
      } finally {
        for (const r of runners) r.repeatedLogitRows = false;
        for (const r of single) r.oneSequence = false;
      }
      // The masks, waited for while the device runs the forward (host rows' included: sampled below).
      gs.ready();
      // One row on the host: the sampler with penalties and logprobs, forced tokens, logits kept.
      const hostSample = (req: Request, logits: Float32Array, offset: number): number => {
        const banned = req.outputIds.length < req.params.minTokens ? [...(req.params.ignoreEos ? [] : this.eosTokenIds), ...req.params.stopTokenIds] : [];
        const l = this.live.get(req.id)!;
        const forced = l.forced?.[req.outputIds.length];
        const s = this.sampler.sample(logits, offset, req.params, req.sampleCounter, { all: req.seenAll, output: req.seenOutput }, banned, l.grammar?.mask, forced);
        host.set(req, s);
        if (l.wantPromptLogits && req.outputIds.length === 0) l.promptLogits = logits.slice(offset, offset + V);
        l.stepLogits?.push(logits.slice(offset, offset + V));
        return s.token;
      };
      if (deviceSample || mixed) {
        // Grammar rows sampled here take their masks (the host rows' are applied on the host).
        const masks = gs.stage();
        if (masks) (this.runner as ModelRunner).sampleMask = masks;
        try {
          this.runner.sampleOnDevice(nl, m.sampled);
        } finally {
          if (masks) (this.runner as ModelRunner).sampleMask = undefined;
        }
        if (mixed) this.pipeline?.logitsHome(nl);
        be.record(ra.endEv);
        be.synchronize('policy');
        tokens = this.ring.read(nl);
        if (mixed) {
          // The device sampled every row (the same rule); the host rows' tokens are replaced.
          const ts = performance.now();
          for (const i of hostRows) tokens[i] = hostSample(sampling[i], be.read(this.runner.logits, i * V, V) as Float32Array, 0);
          sampleMs = performance.now() - ts;
        }
      } else if (nl > 0) {
        this.pipeline?.logitsHome(nl);
        be.record(ra.endEv);
        const logits = be.read(this.runner.logits, 0, nl * V) as Float32Array;
        const ts = performance.now();
        sampling.forEach((req, i) => tokens.push(hostSample(req, logits, i * V)));
        sampleMs = performance.now() - ts;
      } else {
        be.record(ra.endEv);
        be.synchronize('hard');
      }
    }
    const deviceMs = be.elapsedMs(ra.startEv, ra.endEv) / ra.stepShare;
    // (A step with grammar rows also spans the wait for its masks: not a measure of run-ahead's steps.)
    if (replayed && !anyGrammar) ra.lastDecodeMs = deviceMs;
    const buckets = this.profiles.record(rows, deviceMs);
    // Stages that ran eagerly: each stage's device time and each handoff's, from their own events.
    const stages = this.pipeline instanceof StagePipeline ? this.pipeline.stageTimes() : undefined;
    const after = this.pipeline?.stats() ?? be.stats();
    // Embedding rows: their final hidden states, read before the computed counts move on.
    this.embeddings.collect(plan.scheduled);
    for (const { req, numTokens } of plan.scheduled) req.numComputedTokens += numTokens;
    // Prompts with forks that finished: the forks take over (before their first tokens are accepted).
    if (forks) for (const { req } of plan.scheduled) if (req.forkChildren && req.numComputedTokens === req.numTokens) this.forkOut(req);
    const now = performance.now();
    const share = nl > 0 ? 1 / nl : 0;
    const delta = statsDelta(before, after, share);
    const paging = pagerBefore ? pagerDelta(pagerBefore, this.pager!.stats(), share) : undefined;
    // A replayed graph's copies are not seen by the backend's counters; the pager accounts for them.
    if (paging && replayed) delta.h2dBytes += paging.h2dBytes;
    let embedded = 0;
    // The grammars take their tokens first: the workers compute the next masks while the host
    // accepts the tokens, schedules and enqueues the next forward (waited for before its sampling).
    const refused = gs.submit(tokens, sampling.map((r) => r.id));
    sampling.forEach((req, i) => {
      // An embedding input whose last row was computed: its vector is done, its sampled token dropped.
      if (this.embeddings.finishRow(req)) {
        embedded++;
        return;
      }
      const l = this.live.get(req.id)!;
      const s = host.get(req);
      const err = refused?.get(i);
      if (err) return this.failOne(l, err);
      const record = tokenRecord(req, tokens[i], { now, share, sampleMs, deviceMs, delta, paging, buckets, grammarMs: l.grammar?.lastMs, stages });
      // A failure in one request's host policies (detokenizing, stop strings) ends that request only.
      try {
        this.accept(l, tokens[i], record, s);
      } catch (e) {
        this.failOne(l, e as Error);
      }
    });
    const sig = stepSignals(now, this.scheduler, this.kv, this.totalPreemptions, {
      scheduledTokens: rows - (order.length - nSeq),
      promptTokens,
      generationTokens: nl - embedded,
      stepMs: now - t0,
      sharedBlocks: shared.blocks,
      sharedBlockReads: shared.reads,
      droppedSteps: ra.dropped,
      enqueuedAhead: adopt || adoptForward,
    });
    for (const f of this.stepListeners) f(sig);
  }

  /** The model runners of each pass: the one runner, or every stage's or shard's. */
  private get runners(): ModelRunner[] {
    return this.pipeline ? this.pipeline.runners : [this.runner as ModelRunner];
  }

  /**
   * Whether the device's sampler can take this request's row (its grammar aside): its parameters
   * allow it and the host need not see its logits (forced tokens, logits kept, prompt logits).
   */
  private deviceSamples(r: Request): boolean {
    const l = this.live.get(r.id);
    const logits = !!l && (l.forced !== undefined || l.stepLogits !== undefined || (l.wantPromptLogits && r.outputIds.length === 0));
    return isDeviceSamplable(r.params) && !logits;
  }

  private writeMeta(rows: number, nl: number, withSampling: boolean): void {
    if (this.pipeline) return this.pipeline.writeMeta(this.stage, rows, nl, withSampling);
    writeStepMeta(this.backend, this.runner as ModelRunner, this.stage, rows, nl, withSampling);
  }

  /** Host policies on a sampled token (token-policy.ts); a request they finish leaves the scheduler. */
  private accept(l: Live, token: number, record: TokenLedgerRecord, s?: SampledToken): void {
    const finish = acceptToken(l, token, record, s, this);
    if (finish) {
      this.scheduler.remove(l.req);
      this.finish(l, finish, finish === 'length' ? 'FINISHED_LENGTH_CAPPED' : 'FINISHED_STOPPED');
    }
  }

  /** A prompt with forks finished its prefill: the forks take over its KV and its seat. */
  private forkOut(parent: Request): void {
    const runners = this.runners;
    forkOut(parent, { kv: this.kv, tiered: this.kvTiers !== undefined, scheduler: this.scheduler, graphs: this.graphs, runners });
  }

  private finish(l: Live, reason: FinishReason, status: Request['status']): void {
    l.req.status = status;
    l.req.finishReason = reason;
    l.req.times.finished = performance.now();
    this.live.delete(l.req.id);
    l.cleanup?.();
    l.grammar?.dispose();
    l.stream.end();
    const o = outcomeOf(l);
    l.resolve(o);
    for (const f of this.finishListeners) f(o);
  }

  /** The pipeline's stages, links and micro-batches; undefined when the model runs as one stage. */
  pipelineDescription(): PipelineDescription | undefined {
    return this.pipeline instanceof StagePipeline ? this.pipeline.describe() : undefined;
  }

  /** The tensor-parallel group's shards (backend, slices, weight and KV bytes each) and links; undefined without tensorParallel. */
  tensorParallelDescription(): TensorParallelDescription | undefined {
    return this.pipeline instanceof TensorParallelGroup ? this.pipeline.describe() : undefined;
  }

  /**
   * Bracket every op of the following steps with device events (as the `profile` option does
   * from the start), or stop. A profiled step runs eagerly, op by op: no decode graph is captured
   * or replayed, and the decoder stack runs as per-layer ops.
   */
  setProfiling(on: boolean): void {
    this.profiles.set(on);
  }

  /** The op-level device times of each step run while profiling since the last call (the latest PROFILES_KEPT), oldest first. */
  takeProfiles(): PassProfile[] {
    return this.profiles.take();
  }

  /** Nodes of each captured decode graph, by batch-size bucket ("t<bucket>:<staging span>" for tiered passes, "h" after it where the host attends over warm pages; "1s": one-row steps within capabilities.shortContextKeys, "1l": at least its longContextKeys). */
  graphNodes(): Record<string, number> {
    return this.graphs.nodes();
  }

  /** Drain: resolves when no request is waiting or running. */
  async idle(): Promise<void> {
    while (this.scheduler.hasWork) await new Promise((r) => setTimeout(r, 5));
  }

  dispose(): void {
    if (this.disposed) return;
    this.failAll(new EngineError('DISPOSED', 'engine disposed'));
    this.disposed = true;
    this.graphs.dispose();
    this.constrained.dispose();
    this.kvTiers?.dispose();
    this.ahead.dispose();
    this.runner.dispose();
    this.model.detach(this);
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}