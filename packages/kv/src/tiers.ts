import type { BlockPool } from './block-pool.js';
import { KvArgumentError, KvError } from './errors.js';

/** Where a KV page lives: the compute tier's pool, pinned host memory, or the offload file. */
export type KvTier = 'hot' | 'warm' | 'cold';

const NONE = 0;
const HOT = 1;
const WARM = 2;
const COLD = 3;
const NAMES = ['none', 'hot', 'warm', 'cold'] as const;

/**
 * One page move the engine executes, in list order, before the step's forward pass. A move to
 * 'none' is a page whose K/V are dropped (a free page evicted from the prefix cache, or one never
 * filled): nothing is copied, its slot is simply released.
 */
export interface KvPageMove {
  page: number;
  from: KvTier;
  fromSlot: number;
  to: KvTier | 'none';
  toSlot: number;
}

export interface KvTiersOptions {
  /** Slots of the hot pool, including the reserved null slot 0. At least 2. */
  hotSlots: number;
  /** Slots of the warm pool (pinned host memory). */
  warmSlots: number;
  /** Slots of the cold pool (the offload file); 0 without an offload dir. */
  coldSlots: number;
  /** Leading pages of every sequence kept hot while there is room (attention sinks). Default 1. */
  sinkBlocks?: number;
  /** Trailing pages of every sequence kept hot while there is room (the recent window). Default 2. */
  windowBlocks?: number;
}

/**
 * A scheduled sequence's pages this step: all of them are read, those from `firstWritten` on are
 * written, and those from `firstFresh` on hold nothing yet (new pages: whatever a reused page
 * held before is garbage, so it is not moved). Default firstFresh: firstWritten.
 */
export interface KvStepNeed {
  pages: readonly number[];
  firstWritten: number;
  firstFresh?: number;
}

export interface KvTierStats {
  hot: { capacity: number; used: number };
  warm: { capacity: number; used: number };
  cold: { capacity: number; used: number };
  demotions: number;
  promotions: number;
  /** Pages dropped from the prefix cache because no tier had room for them. */
  dropped: number;
}

/** A step needs more hot or warm pages than the tiers hold, even after every demotion. */
export class KvTierPressureError extends KvError {
  constructor(detail: string) {
    super('KV_TIER_PRESSURE', detail);
    this.name = 'KvTierPressureError';
  }
}

/**
 * KV pages as virtual memory, bookkeeping side: every page (a block id of the {@link BlockPool})
 * has a tier and a slot in that tier's pool. The policy, run once per step by {@link prepare}:
 * pages a step writes are hot; every other page of a scheduled sequence is hot or warm (attention
 * reads warm pages where they lie); cold pages a step needs are promoted to warm first. Room is
 * made by demotion, cheapest first: free pages that are not cached are released, free cached pages
 * go down a tier (and are dropped from the prefix cache only when no lower tier has room), then
 * held pages outside the attention sinks and the recent window go down, oldest first, then the
 * sinks and window themselves. Held pages never go cold while their sequence is scheduled.
 *
 * Nothing here moves bytes: {@link prepare} returns the moves, in an order that is safe to execute
 * one after the other (a slot is vacated before it is reused).
 */
export class KvTiers {
  readonly hotSlots: number;
  readonly warmSlots: number;
  readonly coldSlots: number;
  readonly sinkBlocks: number;
  readonly windowBlocks: number;
  /** Incremented whenever a page changes tier or slot: staged block tables are stale after it. */
  epoch = 0;
  private readonly tier: Uint8Array;
  private readonly slot: Int32Array;
  /** owner[t][slot] = page, or 0 (page 0 is the null block and never owns a slot). */
  private readonly owner: Int32Array[];
  private readonly free: number[][];
  private demotions = 0;
  private promotions = 0;
  private dropped = 0;

  constructor(
    private readonly pool: BlockPool,
    o: KvTiersOptions,
  ) {
    const int = (name: string, v: number | undefined, min: number, dflt?: number) => {
      const x = v ?? dflt;
      if (x === undefined || !Number.isSafeInteger(x) || x < min) throw new KvArgumentError(`${name} must be an integer >= ${min}, got ${String(v)}`);
      return x;
    };
    this.hotSlots = int('hotSlots', o.hotSlots, 2);
    this.warmSlots = int('warmSlots', o.warmSlots, 0);
    this.coldSlots = int('coldSlots', o.coldSlots, 0);
    this.sinkBlocks = int('sinkBlocks', o.sinkBlocks, 0, 1);
    this.windowBlocks = int('windowBlocks', o.windowBlocks, 1, 2);
    const pages = pool.numBlocks;
    this.tier = new Uint8Array(pages);
    this.slot = new Int32Array(pages).fill(-1);
    this.owner = [new Int32Array(0), new Int32Array(this.hotSlots), new Int32Array(this.warmSlots), new Int32Array(this.coldSlots)];
    // Hot slot 0 is the null block's: padding rows of a batch read it.
    this.tier[0] = HOT;
    this.slot[0] = 0;
    this.free = [[], range(this.hotSlots - 1, 1), range(this.warmSlots, 0), range(this.coldSlots, 0)];
  }

  /** The tier of `page`, or undefined while it holds no K/V (never written, or dropped). */
  tierOf(page: number): KvTier | undefined {
    const t = this.tier[this.check(page)];
    return t === NONE ? undefined : (NAMES[t] as KvTier);
  }

  /** The slot of `page` in its tier (-1 when it has none). */
  slotOf(page: number): number {
    return this.slot[this.check(page)];
  }

  /** The hot slot of `page`, or -1 when it is not hot (what the device's block table holds). */
  hotSlot(page: number): number {
    return this.tier[page] === HOT ? this.slot[page] : -1;
  }

  /** The warm slot of `page`, or -1 when it is not warm (what the host attention's table holds). */
  warmSlot(page: number): number {
    return this.tier[page] === WARM ? this.slot[page] : -1;
  }

  /** Pages in the warm tier now (a pass needs host partials only when some are). */
  get warmPages(): number {
    return this.warmSlots - this.free[WARM].length;
  }

  /**
   * Whether a step that holds `heldPages` pages in all and writes `writtenPages` of them can be
   * placed: held pages must fit hot + warm, written ones hot. The scheduler asks this before it
   * admits more work, so demotion is tried before preemption.
   */
  fits(heldPages: number, writtenPages: number): boolean {
    return writtenPages <= this.hotSlots - 1 && heldPages <= this.hotSlots - 1 + this.warmSlots;
  }

  /** Make a step's pages addressable; returns the moves to execute first (see the class). */
  prepare(needs: readonly KvStepNeed[]): KvPageMove[] {
    const moves: KvPageMove[] = [];
    const needed = new Set<number>();
    const written = new Set<number>();
    const keep = new Set<number>();
    for (const n of needs) {
      const len = n.pages.length;
      const fresh = n.firstFresh ?? n.firstWritten;
      for (let b = 0; b < len; b++) {
        const p = this.check(n.pages[b]);
        // A reused page's old slot elsewhere holds garbage: let it go (a hot one keeps its slot).
        if (b >= fresh && this.tier[p] !== HOT) this.release(p);
        needed.add(p);
        if (b >= n.firstWritten) written.add(p);
        if (b < this.sinkBlocks || b >= len - this.windowBlocks) keep.add(p);
      }
    }
    let hotDemand = 0;
    let warmDemand = 0;
    for (const p of written) if (this.tier[p] !== HOT) hotDemand++;
    // Cold pages a step reads come up to warm (written ones pass through it on their way hot).
    for (const p of needed) if (this.tier[p] === COLD) warmDemand++;
    if (hotDemand > this.hotSlots - 1) throw new KvTierPressureError(`a step writes ${hotDemand} pages, the hot pool holds ${this.hotSlots - 1}`);

    // Hot room first: what leaves hot may need warm room, so count it into the warm demand.
    const hotVictims = this.victims(HOT, hotDemand - this.free[HOT].length, 0, needed, written, keep);
    // Held pages leaving hot must find warm room; free cached ones use it if there is some.
    let softDemand = 0;
    for (const p of hotVictims) {
      const b = this.pool.block(p);
      if (b.refCount > 0) warmDemand++;
      else if (b.hash !== undefined) softDemand++;
    }
    const freeWarm = this.free[WARM].length;
    const warmVictims = this.victims(WARM, warmDemand + softDemand - freeWarm, warmDemand - freeWarm, needed, written, keep);
    // Warm room: free pages drop or go cold; held pages of unscheduled sequences go cold.
    for (const p of warmVictims) this.lower(p, moves, true);
    // Cold pages the step reads take their warm room before free pages leaving hot may use it.
    for (const p of needed) {
      if (this.tier[p] === COLD && !written.has(p)) {
        this.move(p, WARM, moves);
        this.promotions++;
      }
    }
    // Held victims first: they must find warm room; free cached ones take what is left or drop.
    hotVictims.sort((a, b) => Number(this.pool.block(a).refCount === 0) - Number(this.pool.block(b).refCount === 0));
    for (const p of hotVictims) this.lower(p, moves, false);
    if (this.free[HOT].length < hotDemand) throw new KvTierPressureError(`the hot pool cannot make room for ${hotDemand} written pages`);
    for (const p of written) {
      const from = this.tier[p];
      if (from === HOT) continue;
      // A page written this step that holds K/V elsewhere keeps them (the tail of a partly filled
      // block); a page with none (fresh) just takes a slot.
      if (from === COLD) this.move(p, WARM, moves);
      this.move(p, HOT, moves);
      if (from !== NONE) this.promotions++;
    }
    for (const p of needed) if (this.tier[p] === NONE) throw new KvError('KV_STATE', `page ${p} is read by a step but holds no K/V (it was never written or was dropped)`);
    return moves;
  }

  /**
   * Release the slot of every free page the prefix cache no longer knows (their K/V can never be
   * read again). Cheap bookkeeping; the engine calls it after sequences finish.
   */
  reclaim(): void {
    for (let p = 1; p < this.tier.length; p++) {
      if (this.tier[p] === NONE) continue;
      const b = this.pool.block(p);
      if (b.refCount === 0 && b.hash === undefined) this.release(p);
    }
  }

  stats(): KvTierStats {
    const used = (t: number, cap: number) => cap - this.free[t].length;
    return {
      hot: { capacity: this.hotSlots - 1, used: used(HOT, this.hotSlots - 1) },
      warm: { capacity: this.warmSlots, used: used(WARM, this.warmSlots) },
      cold: { capacity: this.coldSlots, used: used(COLD, this.coldSlots) },
      demotions: this.demotions,
      promotions: this.promotions,
      dropped: this.dropped,
    };
  }

  /** Checks that slots and owners agree; throws listing every violation. */
  checkInvariants(): void {
    const v: string[] = [];
    for (const t of [HOT, WARM, COLD]) {
      const freeSet = new Set(this.free[t]);
      if (freeSet.size !== this.free[t].length) v.push(`${NAMES[t]}: a slot is free twice`);
      for (let s = t === HOT ? 1 : 0; s < this.owner[t].length; s++) {
        const p = this.owner[t][s];
        if (freeSet.has(s) !== (p === 0)) v.push(`${NAMES[t]} slot ${s}: owner ${p} but ${freeSet.has(s) ? '' : 'not '}free`);
        if (p !== 0 && (this.tier[p] !== t || this.slot[p] !== s)) v.push(`${NAMES[t]} slot ${s}: owner ${p} says ${NAMES[this.tier[p]]} ${this.slot[p]}`);
      }
    }
    for (let p = 1; p < this.tier.length; p++) {
      const t = this.tier[p];
      if (t === NONE) {
        if (this.slot[p] !== -1) v.push(`page ${p}: no tier but slot ${this.slot[p]}`);
      } else if (this.owner[t][this.slot[p]] !== p) v.push(`page ${p}: ${NAMES[t]} slot ${this.slot[p]} is owned by ${this.owner[t][this.slot[p]]}`);
    }
    if (v.length > 0) throw new KvError('KV_INVARIANT', `tier invariants violated: ${v.join('; ')}`);
  }

  /**
   * Up to `count` pages of tier t to move out, cheapest first: free uncached, free cached, held
   * and not needed this step, held outside sinks and window (oldest first), then the rest that
   * is not written this step.
   */
  private victims(t: number, count: number, required: number, needed: Set<number>, written: Set<number>, keep: Set<number>): number[] {
    if (count <= 0) return [];
    const classes: number[][] = [[], [], [], [], []];
    const owners = this.owner[t];
    for (let s = t === HOT ? 1 : 0; s < owners.length; s++) {
      const p = owners[s];
      if (p === 0 || written.has(p)) continue;
      const b = this.pool.block(p);
      if (b.refCount === 0) classes[b.hash === undefined ? 0 : 1].push(p);
      else if (!needed.has(p)) {
        // Held but not read this step: warm pages of it can only go cold.
        if (t === HOT || this.free[COLD].length > 0) classes[2].push(p);
      }
      else if (t === HOT) classes[keep.has(p) ? 4 : 3].push(p);
      // A held warm page needed this step cannot leave warm: it is read there.
    }
    const out: number[] = [];
    for (const c of classes) for (const p of c) if (out.length < count) out.push(p);
    if (out.length < required) throw new KvTierPressureError(`the ${NAMES[t]} pool cannot make room for ${required} more pages`);
    return out;
  }

  /** Move page p one tier down (or drop it when it is free and nothing below has room). */
  private lower(p: number, moves: KvPageMove[], fromWarm: boolean): void {
    const b = this.pool.block(p);
    if (b.refCount === 0 && b.hash === undefined) {
      this.release(p);
      return;
    }
    const to = fromWarm ? COLD : WARM;
    if (this.free[to].length > 0) {
      this.move(p, to, moves);
      this.demotions++;
      return;
    }
    if (b.refCount === 0) {
      // A free cached page with nowhere to go: forget it, so no prefix hit can find stale K/V.
      this.pool.forget(p);
      moves.push({ page: p, from: NAMES[this.tier[p]] as KvTier, fromSlot: this.slot[p], to: 'none', toSlot: -1 });
      this.release(p);
      this.dropped++;
      return;
    }
    throw new KvTierPressureError(`no ${NAMES[to]} slot for held page ${p}`);
  }

  private move(p: number, to: number, moves: KvPageMove[]): void {
    const s = this.free[to].pop();
    if (s === undefined) throw new KvTierPressureError(`no free ${NAMES[to]} slot`);
    const from = this.tier[p];
    if (from !== NONE) moves.push({ page: p, from: NAMES[from] as KvTier, fromSlot: this.slot[p], to: NAMES[to] as KvTier, toSlot: s });
    if (from !== NONE) this.release(p);
    this.tier[p] = to;
    this.slot[p] = s;
    this.owner[to][s] = p;
    this.epoch++;
  }

  private release(p: number): void {
    const t = this.tier[p];
    if (t === NONE) return;
    const s = this.slot[p];
    this.owner[t][s] = 0;
    this.free[t].push(s);
    this.tier[p] = NONE;
    this.slot[p] = -1;
    this.epoch++;
  }

  private check(page: number): number {
    if (!Number.isInteger(page) || page < 0 || page >= this.tier.length) throw new KvArgumentError(`no page ${page} (pages 0..${this.tier.length - 1})`);
    return page;
  }
}

function range(n: number, from: number): number[] {
  // Popped from the end: lower slots first.
  return Array.from({ length: n }, (_, i) => from + n - 1 - i);
}
