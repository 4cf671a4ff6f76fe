import type { DeviceBackend, EventHandle } from '@nerva/core';
import type { KvCacheManager } from '@nerva/kv';
import { bucketFor, type DecodeGraphs, type KeyRange } from './decode-graphs.js';
import type { PassRunner } from './stages/pipeline.js';
import type { Request } from './request.js';
import { passKey, RowLayout, type RowOrder } from './row-layout.js';
import type { ScheduledRequest } from './scheduler.js';
import { padRow, type StepBuffers } from './step-batch.js';

/** A decode step enqueued ahead: the pass it is (its schedule's key) and the events that time it. */
export interface AheadStep {
  key: string;
  bucket: number;
  start: EventHandle;
  end: EventHandle;
  /** Steps of its replay (they share start and end). */
  share: number;
  /**
   * False for the forward alone of a step with grammar rows (enqueueForward): its sampling waits
   * for the host's masks, so it pushed no token yet.
   */
  sampled: boolean;
}

/** What run-ahead reads of its context. */
export interface RunAheadHost {
  readonly kv: KvCacheManager;
  readonly maxModelLen: number;
  readonly stage: StepBuffers;
  /** Requests waiting for admission (none is enqueued ahead while one waits). */
  waiting(): number;
  /** Skip tokens of dropped steps in the token ring. */
  skipRing(n: number): void;
}

/**
 * Run-ahead (EngineOptions.runAhead): decode steps enqueued before the host has seen the tokens
 * of the step before, so the device never idles while the host accepts tokens and schedules.
 * Owns the step's timing events: the current step is timed between `startEv` and `endEv`, over
 * `stepShare` steps (a step adopted from a replay of several takes that replay's events).
 */
export class RunAhead {
  startEv: EventHandle;
  endEv: EventHandle;
  stepShare = 1;
  /** Every event made, each once (the fields above and `queue` alias them). */
  private readonly events: EventHandle[];
  /** Device time of the last decode step taken from the graph path (ms; 0 before the first). */
  lastDecodeMs = 0;
  /**
   * Decode steps enqueued ahead, oldest first. A replay of k steps gives k entries sharing its
   * events: its start is the end event of whatever was enqueued before it (no event of its own
   * between two replays), its end is recorded after it.
   */
  queue: AheadStep[] = [];
  /** StepSignals.droppedSteps. */
  dropped = 0;
  /** The places of the device's decode rows (finished ones as pad rows until the bucket shrinks). */
  readonly layout = new RowLayout();

  constructor(
    private readonly backend: DeviceBackend,
    private readonly runner: PassRunner,
    private readonly graphs: DecodeGraphs,
    private readonly host: RunAheadHost,
    /** Whether steps are enqueued ahead at all (EngineOptions.runAhead, resolved against the backend and the context). */
    readonly enabled: boolean,
    /** EngineOptions.runAheadSteps and runAheadMs, resolved. */
    readonly steps: number,
    readonly ms: number,
  ) {
    this.events = [0, 1].map(() => backend.createEvent());
    [this.startEv, this.endEv] = this.events;
  }

  /**
   * A decode step's rows in the places the device holds them (a finished row a hole: RowLayout),
   * where the step replays a graph over the device's own state: run-ahead on, the state known,
   * every row one decode token sampled on the device without masks (`sampled`). Else the
   * scheduled rows as they are (a step that writes its state afresh compacts them).
   */
  order(scheduled: readonly ScheduledRequest[], sampled: (row: ScheduledRequest) => boolean): RowOrder {
    if (!this.enabled || this.graphs.stateKey === undefined) return scheduled;
    for (const row of scheduled) {
      const { req, numTokens } = row;
      if (numTokens !== 1 || req.numComputedTokens + 1 !== req.numTokens || req.forkChildren || !sampled(row)) return scheduled;
    }
    return this.layout.arrange(scheduled, bucketFor(scheduled.length, this.runner.limits.maxSeqs)) ?? scheduled;
  }

  /** The next step is the head of the queue (same pass, state untouched): it takes that step's events. */
  adopt(head: AheadStep): void {
    this.queue.shift();
    this.startEv = head.start;
    this.endEv = head.end;
    this.stepShare = head.share;
  }

  /**
   * The next step is the forward enqueued ahead at the head of the queue (same pass): it starts
   * at that forward's start; its end is recorded after the sampling the host enqueues now.
   */
  adoptForward(head: AheadStep): void {
    this.queue.shift();
    this.startEv = head.start;
    this.endEv = this.freeEvent();
    this.stepShare = 1;
  }

  /** A step enqueued now, with nothing in flight: any two events, the start recorded. */
  begin(): void {
    this.retire();
    [this.startEv, this.endEv] = this.events;
    this.stepShare = 1;
    this.backend.record(this.startEv);
  }

  /**
   * Wait for the steps enqueued ahead and drop them: their tokens are skipped in the ring, and
   * the step state they advanced on the device (ids, positions, slots, RNG counters) is rewritten
   * by the next replay (graphs.stateKey reset). Their KV writes are at positions no accepted token has
   * (rewritten by the step that computes them), in blocks of finished requests, or in the null
   * block (pad rows).
   */
  retire(): void {
    const q = this.queue;
    if (q.length === 0) return;
    this.queue = [];
    this.graphs.stateKey = undefined;
    this.dropped += q.length;
    this.backend.synchronizeEvent!(q[q.length - 1].end, 'policy');
    let rows = 0;
    for (const a of q) if (a.sampled) rows += a.bucket;
    this.host.skipRing(rows);
  }

  /**
   * Steps the next replay enqueued ahead may run: runAheadSteps where 2k - 1 steps of the last
   * step's device time fit runAheadMs, else 1. Two sizes only, so a run captures its graphs
   * early (a first capture mid-run holds the device for milliseconds) and a step time near the
   * bound does not capture a graph for every k it crosses.
   */
  private aheadSteps(): number {
    const k = this.steps;
    const fits = this.lastDecodeMs > 0 ? (2 * k - 1) * this.lastDecodeMs <= this.ms : this.ms === Infinity;
    return fits ? k : 1;
  }

  /**
   * Whether steps d+1..d+s after the current one (d already enqueued) may be enqueued now as one
   * replay: each row computing step d+1 holds the block of its position there (the advance of the
   * step before, already enqueued, found its slot in the table) and computes all s steps (a row
   * whose last step is d or earlier is a pad row by then: padEnded), some rows are left and still
   * need the layout's bucket (else the host compacts them), and the ring holds every step in flight.
   */
  private fits(order: RowOrder, bucket: number, d: number, s: number): boolean {
    if ((1 + d + s) * bucket > this.runner.limits.ringCapacity) return false;
    const bs = this.host.kv.blockSize;
    let live = 0;
    for (const row of order) {
      if (row === undefined) continue;
      const { req } = row;
      const last = this.lastStep(req);
      if (last <= d) continue;
      if (last < d + s) return false;
      if (Math.floor((req.numComputedTokens + d + 1) / bs) >= this.host.kv.blockTable(req.id).length) return false;
      live++;
    }
    return live > 0 && bucketFor(live, this.runner.limits.maxSeqs) === bucket;
  }

  /**
   * The last step after the current one (0) that computes this row: the one sampling its last
   * token, or the last before the model's length or its table's end.
   */
  private lastStep(req: Request): number {
    return Math.min(
      req.params.maxTokens - 1 - req.outputIds.length,
      this.host.maxModelLen - 1 - req.numTokens,
      this.runner.limits.maxBlocksPerSeq * this.host.kv.blockSize - 1 - req.numComputedTokens,
    );
  }

  /** Whether a row computes `after` steps past the current one. */
  private goesOn(req: Request, after: number): boolean {
    return after <= this.lastStep(req);
  }

  /**
   * The key the host will compute for step `j` after the current one: a row whose last step comes
   * before it is a hole there (a pad row on the device from the step after its last).
   */
  private keyAt(order: RowOrder, bucket: number, j: number): string {
    return passKey(this.host.kv, bucket, false, order, (k) => this.lastStep(order[k]!.req) < j);
  }

  /**
   * Rows whose last step is d at the latest become pad rows before step d + 1 (stream-ordered
   * writes after the steps enqueued: position 0, no KV slot, the null block in every table entry),
   * so the steps after their last token run without them and write nothing into their blocks,
   * which the host frees once it has read the last token.
   */
  private padEnded(order: RowOrder, d: number): void {
    const st = this.host.stage;
    const mb = this.runner.limits.maxBlocksPerSeq;
    const m = this.runner.meta;
    for (let k = 0; k < order.length; k++) {
      const row = order[k];
      if (row === undefined || this.layout.isPad(k) || this.lastStep(row.req) > d) continue;
      padRow(st, k, k, mb);
      this.backend.write(m.positions, st.pos.subarray(k, k + 1), k);
      this.backend.write(m.slots, st.slots.subarray(k, k + 1), k);
      this.backend.write(m.blockTables, st.tables.subarray(k * mb, (k + 1) * mb), k * mb);
      this.layout.setPad(k);
    }
  }

  /**
   * Before a decode step the host issues itself (not one enqueued ahead): each row that goes on
   * gets the block of its next position now, so the step's advance finds that position's slot and
   * the step after it can be enqueued ahead. A replay enqueued ahead reserves its successor's
   * blocks itself (enqueueSteps); a step issued by the host had none, and with many rows one of
   * them starts a new block at nearly every step, so run-ahead did not start again until the
   * batch shrank. Stream-ordered table writes; the pass key then counts the blocks.
   */
  reserveNext(order: RowOrder): void {
    if (!this.enabled) return;
    this.reserveThrough(order, (req) => (this.goesOn(req, 1) ? req.numComputedTokens + 1 : undefined));
  }

  /**
   * Reserve each row's blocks through position `last(req)` (KvCacheManager.reserveBlocks; the
   * scheduler's allocation for those positions takes them) and write their device table entries,
   * in stream order before the replay whose advances read them. False where the pool is short
   * for some row (what the others reserved stays theirs, entries written).
   */
  private reserveThrough(order: RowOrder, last: (req: Request) => number | undefined): boolean {
    const mb = this.runner.limits.maxBlocksPerSeq;
    const st = this.host.stage;
    let ok = true;
    for (let k = 0; k < order.length; k++) {
      const req = order[k]?.req;
      if (req === undefined) continue;
      const p = last(req);
      if (p === undefined) continue;
      const had = this.host.kv.blockTable(req.id).length;
      if (Math.floor(p / this.host.kv.blockSize) < had) continue;
      if (this.host.kv.reserveBlocks(req.id, p + 1) === null) {
        ok = false;
        continue;
      }
      const table = this.host.kv.blockTable(req.id);
      for (let b = had; b < table.length; b++) st.tables[k * mb + b] = table[b];
      this.backend.write(this.runner.meta.blockTables, st.tables.subarray(k * mb + had, k * mb + table.length), k * mb + had);
    }
    return ok;
  }

  /**
   * Enqueue decode steps after this decode-only graph step while the same rows will be
   * scheduled in the same places (nothing waiting; a row past its last token a pad row, the rows
   * left still needing the bucket), up to aheadSteps() - 1 beyond
   * the one replay that keeps the device busy while the host takes the current one's tokens: a
   * replay of k = aheadSteps() steps where they fit, else of one. The device reads their ids,
   * positions and slots from what the step before leaves (the host writes nothing for them but
   * table entries of blocks reserved for them, a replay early). A row whose position after the
   * replay starts a new block gets it now when the pool has it, so crossing into a block does not
   * stop the replay after from running ahead.
   */
  enqueue(order: RowOrder, bucket: number, keys: (first: number, last: number) => KeyRange): void {
    this.enqueueSteps(order, bucket, keys, false);
  }

  /**
   * After a step with grammar rows (its masked graph): enqueue the next step's forward alone, on
   * the same conditions as `enqueue`. It needs only the tokens the device just sampled (op sample
   * writes them to the step's ids), not the next masks, so the device computes it while the host
   * reads this step's tokens, hands them to the grammar workers, accepts them and schedules; the
   * next step then waits for its masks and enqueues its sampling (graphs.replaySample). A step's
   * sampling cannot go ahead of the host: its masks need this step's tokens.
   */
  enqueueForward(order: RowOrder, bucket: number, keys: (first: number, last: number) => KeyRange): void {
    this.enqueueSteps(order, bucket, keys, true);
  }

  private enqueueSteps(order: RowOrder, bucket: number, keys: (first: number, last: number) => KeyRange, forwardOnly: boolean): void {
    if (!this.enabled || this.host.waiting() > 0) return;
    const K = forwardOnly ? 1 : this.aheadSteps();
    while (this.queue.length < K) {
      const d = this.queue.length;
      // The device's state is step d + 1's from here, its pad rows included.
      this.padEnded(order, d);
      let s = K > 1 && this.fits(order, bucket, d, K) ? K : 1;
      if (s > 1 && !this.reserveThrough(order, (req) => (this.goesOn(req, d + s) ? req.numComputedTokens + d + s : undefined))) s = 1;
      if (s === 1 && !this.fits(order, bucket, d, 1)) break;
      const after = d + s + 1;
      this.reserveThrough(order, (req) => (this.goesOn(req, after) ? req.numComputedTokens + after : undefined));
      // Nothing runs between the step before and this replay in the stream (but pad rows' few
      // bytes), so the replay starts at that step's end event instead of an event of its own: a
      // timed event record holds the GPU about 1.5 us between two graph replays (an untimed one
      // costs nothing; measured with tools/gpu/graphgap.cu).
      const start = d > 0 ? this.queue[d - 1].end : this.endEv;
      const end = this.freeEvent();
      // The replay runs steps d + 1 .. d + s after the current one.
      if (forwardOnly) this.graphs.replayForward(bucket, undefined, keys(d + 1, d + s));
      else this.graphs.replay(bucket, s, undefined, keys(d + 1, d + s));
      this.backend.record(end);
      for (let j = 0; j < s; j++) this.queue.push({ key: '', bucket, start, end, share: s, sampled: !forwardOnly });
    }
    // Keys once the tables are final (the next schedules count every block reserved above): each
    // step in flight gets the key the host will compute for it, and the device's state is named by
    // its rows as they are now, the ones padded '-'.
    for (let i = 0; i < this.queue.length; i++) this.queue[i].key = this.keyAt(order, bucket, i + 1);
    this.graphs.stateKey = passKey(this.host.kv, bucket, false, order, (k) => this.layout.isPad(k));
  }

  /** An event no step in flight uses (the current one's, those enqueued ahead). */
  private freeEvent(): EventHandle {
    // (A scan, not a Set: this runs once a replay enqueued, and the queue holds at most 2k - 1 steps.)
    const used = (x: EventHandle) => x === this.startEv || x === this.endEv || this.queue.some((a) => a.start === x || a.end === x);
    let e = this.events.find((x) => !used(x));
    if (e === undefined) {
      e = this.backend.createEvent();
      this.events.push(e);
    }
    return e;
  }


  dispose(): void {
    for (const e of this.events) this.backend.destroyEvent(e);
  }
}
