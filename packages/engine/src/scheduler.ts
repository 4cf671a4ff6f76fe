import type { KvCacheManager } from '@nerva/kv';
import type { Request } from './request.js';

export interface SchedulerConfig {
  /** Token budget of one step. */
  maxNumBatchedTokens: number;
  maxNumSeqs: number;
  /** Longest prompt chunk one request may take in a step (chunked prefill). */
  longPrefillTokenThreshold?: number;
  /**
   * Tiered KV: whether the pages held in all (`held`) and those the step writes (`written`) can
   * be placed in the tiers. Work that does not fit is treated like a failed allocation, so
   * demotion to lower tiers is what is tried first and preemption stays the last resort.
   */
  kvFits?: (held: number, written: number) => boolean;
  /**
   * Sliding-window attention in every layer (@nerva/models kvReadWindow): the largest window W.
   * Before a sequence computes from position p, its blocks wholly before p - W + 1 go back to the
   * pool (no layer reads them again), so a long sequence holds about W / blockSize + 1 blocks.
   * 0 or absent: nothing is freed early (a full-attention layer reads every position).
   */
  kvReadWindow?: number;
  /**
   * Batch-invariant steps (EngineOptions.batchInvariant): a step is either decode rows only (one
   * row per running request with a single token left to compute) or prompt chunks only, each
   * sized from the whole budget as it would be alone (min(tokens left, maxNumBatchedTokens,
   * longPrefillTokenThreshold)): requests still in their prompt (oldest first), then waiting
   * ones, as long as their whole chunks fit the step's budget together; the first always does.
   * Every row then goes through the ops it would take in a run of its request alone: a decode
   * row through the backend's batch-invariant decode path, a prompt chunk through the same
   * kernels over the same rows (a batch-invariant backend's matmuls are row-independent, and its
   * attention cuts each chunk into the tiles it gets alone). While both are pending, prompt steps
   * run until they have computed maxNumBatchedTokens tokens since the last decode step (the
   * prompt tokens one mixed step would have taken), then a decode step runs: prompts enter the
   * batch at the mixed schedule's pace.
   */
  batchInvariant?: boolean;
  /**
   * Prompt tokens a step that also carries decode rows may take in all (chunks of running prompts
   * and newly admitted ones; EngineOptions.decodePromptBudget). Absent: the step's budget. Not
   * used in batch-invariant steps, which pace prompts by their own rule.
   */
  decodePromptBudget?: number;
}

export interface ScheduledRequest {
  req: Request;
  /** Tokens of this request computed in this step, starting at req.numComputedTokens. */
  numTokens: number;
}

/** The immutable plan of one step. */
export interface SchedulerOutput {
  scheduled: readonly ScheduledRequest[];
  preempted: readonly Request[];
  numScheduledTokens: number;
  /** Blocks given back this step because they fell behind every layer's window. */
  freedBlocks: number;
}

/**
 * Continuous batching in the V1 style: one token-budget loop, no prefill/decode switch. Every
 * request has computed and target token counts; running requests are served first (oldest
 * first), then waiting ones are admitted (by priority, then arrival) unless something was
 * preempted in this step. When blocks run out, the lowest-priority, youngest running request
 * is preempted by recompute: its blocks are freed and it goes back to the head of the queue.
 *
 * Shared-prefix forks: a prompt request carrying n forks (Request.forkChildren) takes n of the
 * maxNumSeqs seats from its admission on, so the step that finishes its prompt can sample n rows
 * and the n forks can take its place in the running batch (replaceWithForks) without waiting.
 */
export class Scheduler {
  readonly waiting: Request[] = [];
  readonly running: Request[] = [];

  constructor(
    readonly config: SchedulerConfig,
    readonly kv: KvCacheManager,
  ) {}

  add(req: Request): void {
    this.waiting.push(req);
  }

  get hasWork(): boolean {
    return this.waiting.length > 0 || this.running.length > 0;
  }

  /** Remove a request wherever it is and free its blocks at once. */
  remove(req: Request): void {
    const w = this.waiting.indexOf(req);
    if (w >= 0) this.waiting.splice(w, 1);
    const r = this.running.indexOf(req);
    if (r >= 0) this.running.splice(r, 1);
    if (this.kv.hasSequence(req.id)) this.kv.free(req.id);
  }

  /**
   * The forks of `parent` take its place in the running list (in order, where it stood, so they
   * are scheduled together); `queued` ones (no KV of their own yet) wait to be admitted like
   * preempted requests. The parent's blocks are freed: the forks hold their own references.
   */
  replaceWithForks(parent: Request, seated: readonly Request[], queued: readonly Request[]): void {
    const at = this.running.indexOf(parent);
    if (at < 0) throw new Error(`request ${parent.id} is not running; only a running prompt request forks`);
    this.running.splice(at, 1, ...seated);
    if (this.kv.hasSequence(parent.id)) this.kv.free(parent.id);
    for (const q of queued) {
      q.status = 'PREEMPTED';
      q.numComputedTokens = 0;
      this.waiting.unshift(q);
    }
  }

  private victim(): Request {
    // Lowest priority (largest value) first, then the youngest arrival.
    let v = this.running[0];
    for (const r of this.running) {
      if (r.priority > v.priority || (r.priority === v.priority && r.times.arrival >= v.times.arrival)) v = r;
    }
    return v;
  }

  /**
   * Free a sequence's pages. Pages registered for the prefix cache at allocation but never written
   * (allocated in this step, or past its computed tokens) are forgotten, so no later hit reads them.
   */
  private release(id: number, computedTokens: number): void {
    const table = this.kv.blockTable(id).slice();
    this.kv.free(id);
    const pool = this.kv.pool;
    for (let b = Math.floor(computedTokens / this.kv.blockSize); b < table.length; b++) {
      const blk = pool.block(table[b]);
      if (blk.refCount === 0 && blk.hash !== undefined) pool.forget(blk.id);
    }
  }

  private preempt(req: Request): void {
    this.running.splice(this.running.indexOf(req), 1);
    this.release(req.id, req.numComputedTokens);
    req.status = 'PREEMPTED';
    req.numComputedTokens = 0;
    req.numPreemptions++;
    this.waiting.unshift(req);
  }

  /** batchInvariant: prompt tokens computed since the last decode step. */
  private promptTokensSinceDecode = 0;

  /** The next step. `admit` false: no waiting request is admitted in it (the running ones go on). */
  schedule(admit = true): SchedulerOutput {
    if (!this.config.batchInvariant) return this.scheduleMixed(undefined, admit ? Infinity : 0);
    const decoding = (r: Request) => r.numTokens - r.numComputedTokens === 1;
    const anyDecode = this.running.some(decoding);
    const inPrompt = this.running.filter((r) => r.numTokens - r.numComputedTokens > 1);
    if ((inPrompt.length > 0 || (admit && this.waiting.length > 0)) && (!anyDecode || this.promptTokensSinceDecode < this.config.maxNumBatchedTokens)) {
      // Prompt chunks only, each whole as alone: the running ones still in their prompt, then
      // waiting ones.
      const out = this.scheduleMixed(inPrompt, admit ? Infinity : 0, true);
      if (out.scheduled.length > 0 || out.preempted.length > 0 || !anyDecode) {
        this.promptTokensSinceDecode += out.numScheduledTokens;
        return out;
      }
    }
    this.promptTokensSinceDecode = 0;
    return this.scheduleMixed(this.running.filter(decoding), 0);
  }

  /**
   * The token-budget loop. `only`: serve only these running requests (others are skipped, though
   * they may still be preempted); `maxAdmit`: admit at most this many waiting requests. `whole`:
   * every chunk is the one its request would get in a step of its own (whole budget); the first
   * chunk that does not fit what is left ends the step.
   */
  private scheduleMixed(only?: readonly Request[], maxAdmit = Infinity, whole = false): SchedulerOutput {
    let budget = this.config.maxNumBatchedTokens;
    const chunkCap = this.config.longPrefillTokenThreshold ?? Infinity;
    // Prompt work (a request with more than one token to compute) shares its own budget, smaller
    // while requests decode, so a burst of arriving prompts does not stall the running streams.
    const paced = only === undefined && this.config.decodePromptBudget !== undefined && this.running.some((r) => r.numTokens - r.numComputedTokens === 1);
    let promptBudget = paced ? this.config.decodePromptBudget! : Infinity;
    const alone = (left: number) => Math.min(left, this.config.maxNumBatchedTokens, chunkCap);
    // A prompt chunk's size: as alone (whole), else what the budgets leave.
    const size = (left: number) => (whole ? alone(left) : Math.min(left, budget, chunkCap, promptBudget));
    const promptRows = new Set<Request>();
    const scheduled: ScheduledRequest[] = [];
    const preempted: Request[] = [];
    const bs = this.kv.blockSize;
    // Pages the step writes (tiered KV): from the block of the first new token to the last's.
    const writes = (req: Request, n: number) => Math.ceil((req.numComputedTokens + n) / bs) - Math.floor(req.numComputedTokens / bs);
    let written = 0;
    const W = this.config.kvReadWindow ?? 0;
    let freedBlocks = 0;
    const fits = (extra: number) => {
      const f = this.config.kvFits;
      return f === undefined || f(this.kv.pool.numBlocks - this.kv.pool.numFree - 1, written + extra);
    };

    for (let i = 0; i < this.running.length && budget > 0; ) {
      const req = this.running[i];
      const left = req.numTokens - req.numComputedTokens;
      const n = whole ? alone(left) : Math.min(left, budget, chunkCap, left > 1 ? promptBudget : Infinity);
      if (n <= 0 || (only !== undefined && !only.includes(req))) {
        i++;
        continue;
      }
      if (n > budget) break;
      // Rows from position p read back to p - W + 1 at most; earlier blocks are never read again.
      if (W > 0) freedBlocks += this.kv.releaseBlocksBefore(req.id, req.numComputedTokens - W + 1);
      let ok = false;
      for (;;) {
        if (this.kv.allocateSlots(req.id, req.allIds, n) !== null && fits(writes(req, n))) {
          ok = true;
          break;
        }
        const v = this.victim();
        this.preempt(v);
        preempted.push(v);
        const already = scheduled.findIndex((s) => s.req === v);
        if (already >= 0) {
          budget += scheduled[already].numTokens;
          if (promptRows.delete(v)) promptBudget += scheduled[already].numTokens;
          written -= writes(v, scheduled[already].numTokens);
          scheduled.splice(already, 1);
          i--;
        }
        if (v === req) break;
      }
      if (!ok) continue;
      scheduled.push({ req, numTokens: n });
      written += writes(req, n);
      budget -= n;
      if (left > 1) {
        promptBudget -= n;
        promptRows.add(req);
      }
      i++;
    }

    if (preempted.length === 0 && maxAdmit > 0) {
      let admitted = 0;
      this.waiting.sort((a, b) => a.priority - b.priority || a.times.arrival - b.times.arrival || a.id - b.id);
      // Seats: one per running request, n for a prompt request of n forks (their places are kept).
      let seats = 0;
      for (const r of this.running) seats += r.forkWidth;
      while (admitted < maxAdmit && this.waiting.length > 0 && budget > 0 && promptBudget > 0 && seats + this.waiting[0].forkWidth <= this.config.maxNumSeqs) {
        const req = this.waiting[0];
        let hit = this.kv.getComputedBlocks(req.id, req.allIds, req.cacheSalt ? { cacheSalt: req.cacheSalt } : undefined);
        let n = size(req.numTokens - hit.numComputedTokens);
        if (n > budget) break;
        let got = this.kv.allocateSlots(req.id, req.allIds, n, hit);
        if (got === null && W > 0 && hit.numComputedTokens > 0) {
          // Freeing behind the window bounds what a sequence holds, but a cached prefix is held
          // whole at admission: when it does not fit beside the chunk, compute from scratch.
          hit = { ...hit, blocks: [], hashes: [], stamps: [], numComputedTokens: 0 };
          n = size(req.numTokens);
          if (n > budget) break;
          got = this.kv.allocateSlots(req.id, req.allIds, n, hit);
        }
        if (got === null) break;
        const w = Math.ceil((hit.numComputedTokens + n) / bs) - Math.floor(hit.numComputedTokens / bs);
        if (!fits(w)) {
          // The tiers cannot place it this step: it waits (its pages go back to the pool).
          this.release(req.id, hit.numComputedTokens);
          break;
        }
        written += w;
        // A cached prefix longer than the window: what is behind the first row's window goes back.
        if (W > 0) freedBlocks += this.kv.releaseBlocksBefore(req.id, hit.numComputedTokens - W + 1);
        this.waiting.shift();
        req.status = 'RUNNING';
        req.numComputedTokens = hit.numComputedTokens;
        req.numCachedTokens = hit.numComputedTokens;
        this.running.push(req);
        seats += req.forkWidth;
        admitted++;
        scheduled.push({ req, numTokens: n });
        budget -= n;
        promptBudget -= n;
      }
    }
    return { scheduled, preempted, numScheduledTokens: this.config.maxNumBatchedTokens - budget, freedBlocks };
  }
}
