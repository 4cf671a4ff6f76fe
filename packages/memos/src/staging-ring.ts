import { ResidentBlock } from '@nerva/core';
import { PagerStateError } from './errors.js';

/**
 * The schedule of a ring of `slots` staging slots that streamed blocks s_0..s_{n-1} pass
 * through, every forward pass, in execution order. Block j always uses slot j mod k, so the
 * schedule is the same every pass (a captured graph replays it unchanged). When block j is
 * done, its slot's next occupant is s_{j+k} in this pass, or s_{j mod k} of the next pass: the
 * invariant at every pass boundary is "slot i holds (or is loading) s_i for i < k".
 */
export class StagingSchedule {
  constructor(
    readonly order: readonly string[],
    readonly slots: number,
  ) {
    // A paged plan can stream nothing (a gathered block read in place made room for every layer).
    if (!Number.isInteger(slots) || slots < (order.length > 0 ? 1 : 0)) throw new PagerStateError(`a ring needs at least one slot, got ${slots}`);
    if (new Set(order).size !== order.length) throw new PagerStateError('a block appears twice in the streamed order');
  }

  get length(): number {
    return this.order.length;
  }

  slotOf(index: number): number {
    return index % this.slots;
  }

  /** The block loaded into the slot block `index` frees when it is done (wrapping to the next pass). */
  nextAfter(index: number): { index: number; nextPass: boolean } {
    const j = index + this.slots;
    return j < this.order.length ? { index: j, nextPass: false } : { index: index % this.slots, nextPass: true };
  }

  /** The blocks that start a pass, one per slot. */
  initial(): number[] {
    return Array.from({ length: Math.min(this.slots, this.order.length) }, (_, i) => i);
  }
}

/**
 * The host's stream-ordered view of the ring: which block occupies each slot and the residency
 * state of each streamed block's VRAM replica (core's state machine). Stream order is the order
 * the host enqueues work, so "Ready" means "ready for work enqueued after this point".
 */
export class RingState {
  readonly blocks = new Map<string, ResidentBlock>();
  private readonly occupant: (number | undefined)[];
  private cursor = 0;

  constructor(
    readonly schedule: StagingSchedule,
    bytesOf: (id: string) => number,
    readonly slotTier: 'vram' | 'dram' = 'vram',
  ) {
    for (const id of schedule.order) {
      const b = new ResidentBlock({ id, kind: 'weight', bytes: bytesOf(id), owner: 'CpuOwned' });
      // The host replica is the master copy, written once at load (version 1).
      b.transition('pinned', 'Allocated');
      b.transition('pinned', 'Prefetching');
      b.completePrefetch('pinned', 0);
      b.write('pinned');
      b.share();
      this.blocks.set(id, b);
    }
    this.occupant = new Array(schedule.slots).fill(undefined);
  }

  /** Index the next `acquire` must name (blocks are consumed in execution order). */
  get expected(): number {
    return this.cursor;
  }

  occupantOf(slot: number): number | undefined {
    return this.occupant[slot];
  }

  /** A load of block `index` into its slot was enqueued. The previous occupant is evicted. */
  loadIssued(index: number): void {
    const slot = this.schedule.slotOf(index);
    const prev = this.occupant[slot];
    if (prev !== undefined) {
      const pb = this.block(prev);
      if (pb.state(this.slotTier) === 'InUse') throw new PagerStateError(`slot ${slot} is overwritten while block ${pb.id} is in use`);
      if (pb.state(this.slotTier) === 'Ready') {
        pb.transition(this.slotTier, 'Draining');
        pb.transition(this.slotTier, 'Evicting');
        pb.transition(this.slotTier, 'Unmapped');
      }
    }
    const b = this.block(index);
    b.transition(this.slotTier, 'Allocated');
    b.transition(this.slotTier, 'Prefetching');
    this.occupant[slot] = index;
  }

  /** The compute stream now waits for the load: the replica is Ready in stream order. */
  loadAwaited(index: number): void {
    const b = this.block(index);
    if (b.state(this.slotTier) === 'Prefetching') b.completePrefetch(this.slotTier, b.version);
  }

  /** Block `index` is about to be read by compute: the executor rule (Ready, current version). */
  acquire(index: number): void {
    if (index !== this.cursor) throw new PagerStateError(`streamed blocks are used in order: expected ${this.schedule.order[this.cursor]}, got ${this.schedule.order[index]}`);
    const b = this.block(index);
    if (this.occupant[this.schedule.slotOf(index)] !== index) throw new PagerStateError(`block ${b.id} is not in its slot`);
    b.acquire(this.slotTier, b.version);
  }

  release(index: number): void {
    const b = this.block(index);
    if (b.state(this.slotTier) !== 'InUse') throw new PagerStateError(`release of block ${b.id}, which is ${b.state(this.slotTier)}`);
    b.release(this.slotTier);
    this.cursor = (index + 1) % this.schedule.length;
  }

  private block(index: number): ResidentBlock {
    const id = this.schedule.order[index];
    const b = id === undefined ? undefined : this.blocks.get(id);
    if (!b) throw new PagerStateError(`no streamed block at index ${index}`);
    return b;
  }
}
