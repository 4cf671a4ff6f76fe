import { ResidentBlock, type ResidencyState, type Tier } from '@nerva/core';
import fc from 'fast-check';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { PagerStateError, RingState, StagingSchedule } from '../src/index.js';

const ids = (n: number) => Array.from({ length: n }, (_, i) => `L${i}`);

describe('StagingSchedule', () => {
  it('puts block j in slot j mod k, every pass', () => {
    const s = new StagingSchedule(ids(7), 3);
    expect(s.length).toBe(7);
    expect(Array.from({ length: 7 }, (_, j) => s.slotOf(j))).toEqual([0, 1, 2, 0, 1, 2, 0]);
    expect(s.initial()).toEqual([0, 1, 2]);
  });

  it('gives a freed slot the block k later, wrapping to the start of the next pass', () => {
    const s = new StagingSchedule(ids(7), 3);
    expect(Array.from({ length: 7 }, (_, j) => s.nextAfter(j))).toEqual([
      { index: 3, nextPass: false },
      { index: 4, nextPass: false },
      { index: 5, nextPass: false },
      { index: 6, nextPass: false },
      { index: 1, nextPass: true },
      { index: 2, nextPass: true },
      { index: 0, nextPass: true },
    ]);
    // The next occupant always uses the same slot, and the last k blocks refill slots 0..k-1.
    for (let j = 0; j < 7; j++) expect(s.slotOf(s.nextAfter(j).index)).toBe(s.slotOf(j));
  });

  it('with as many slots as blocks (or more), each block keeps a slot of its own', () => {
    for (const k of [4, 6]) {
      const s = new StagingSchedule(ids(4), k);
      expect(s.initial()).toEqual([0, 1, 2, 3]);
      for (let j = 0; j < 4; j++) expect(s.nextAfter(j)).toEqual({ index: j, nextPass: true });
    }
    const one = new StagingSchedule(ids(3), 1);
    expect([0, 1, 2].map((j) => one.nextAfter(j))).toEqual([
      { index: 1, nextPass: false },
      { index: 2, nextPass: false },
      { index: 0, nextPass: true },
    ]);
  });

  it('refuses a ring without slots and a block listed twice', () => {
    for (const k of [0, -1, 1.5, Number.NaN]) expect(() => new StagingSchedule(ids(3), k)).toThrow(PagerStateError);
    expect(() => new StagingSchedule(ids(3), 0)).toThrow(/at least one slot, got 0/);
    expect(() => new StagingSchedule(['a', 'b', 'a'], 2)).toThrow(/appears twice/);
  });

  it('needs no slot when nothing streams', () => {
    const s = new StagingSchedule([], 0);
    expect(s.length).toBe(0);
    expect(s.initial()).toEqual([]);
    expect(new StagingSchedule([], 2).initial()).toEqual([]);
  });
});

/** Record every residency transition of `tier` replicas, per block, as a string of state letters. */
function recordTransitions(tier: Tier): Map<string, string> {
  const letters: Record<ResidencyState, string> = { Unmapped: 'x', Allocated: 'a', Prefetching: 'p', Ready: 'r', InUse: 'u', Draining: 'd', Evicting: 'e', Invalid: '!' };
  const seen = new Map<string, string>();
  const original = ResidentBlock.prototype.transition;
  vi.spyOn(ResidentBlock.prototype, 'transition').mockImplementation(function (this: ResidentBlock, t: Tier, to: ResidencyState) {
    original.call(this, t, to); // throws IllegalTransitionError on an illegal edge, before recording
    if (t === tier) seen.set(this.id, (seen.get(this.id) ?? '') + letters[to]);
  });
  return seen;
}

/**
 * Drive a ring through `passes` forward passes as the weight pager does: prime (optionally), then
 * per block acquire (loading at the point of use when its slot does not hold it), release, and
 * load the slot's next occupant. `content` is the test's own model of what each slot holds.
 */
function simulate(n: number, k: number, passes: number, prime: boolean, tier: 'vram' | 'dram') {
  const schedule = new StagingSchedule(ids(n), k);
  const ring = new RingState(schedule, (id) => 100 + Number(id.slice(1)), tier);
  const content: (number | undefined)[] = new Array(k).fill(undefined);
  let loads = 0;
  let stalls = 0;
  const load = (i: number) => {
    ring.loadIssued(i);
    content[schedule.slotOf(i)] = i;
    loads++;
  };
  if (prime) for (const i of schedule.initial()) if (ring.occupantOf(schedule.slotOf(i)) !== i) load(i);
  for (let p = 0; p < passes; p++) {
    for (let j = 0; j < n; j++) {
      expect(ring.expected).toBe(j);
      if (ring.occupantOf(schedule.slotOf(j)) !== j) {
        stalls++;
        load(j);
      }
      ring.loadAwaited(j);
      ring.acquire(j);
      // The invariant: the block being read is the one its slot holds, at the latest version.
      expect(content[schedule.slotOf(j)]).toBe(j);
      const b = ring.blocks.get(`L${j}`)!;
      expect(b.state(tier)).toBe('InUse');
      expect(b.replica(tier)?.version).toBe(b.version);
      // Only slot occupants have a replica in the slot tier, and one block is in use at a time.
      const live = [...ring.blocks.values()].filter((x) => x.state(tier) !== 'Unmapped');
      expect(live.length).toBeLessThanOrEqual(k);
      for (const x of live) expect(ring.occupantOf(schedule.slotOf(Number(x.id.slice(1))))).toBe(Number(x.id.slice(1)));
      expect(live.filter((x) => x.state(tier) === 'InUse')).toEqual([b]);
      ring.release(j);
      load(schedule.nextAfter(j).index);
    }
    // Pass boundary: slot i holds (or is loading) block i for i < k.
    expect(ring.expected).toBe(0);
    for (let i = 0; i < Math.min(k, n); i++) {
      expect(ring.occupantOf(i)).toBe(i);
      expect(content[i]).toBe(i);
      expect(ring.blocks.get(`L${i}`)!.state(tier)).toBe('Prefetching');
    }
  }
  return { ring, loads, stalls };
}

describe('RingState', () => {
  afterEach(() => {
    vi.restoreAllMocks();
  });

  it('starts with every master copy Ready in pinned memory, shared read-only, and empty slots', () => {
    const ring = new RingState(new StagingSchedule(ids(3), 2), (id) => (id === 'L1' ? 7 : 5));
    expect(ring.slotTier).toBe('vram');
    expect([...ring.blocks.keys()]).toEqual(['L0', 'L1', 'L2']);
    for (const b of ring.blocks.values()) {
      expect(b.kind).toBe('weight');
      expect(b.state('pinned')).toBe('Ready');
      expect(b.replica('pinned')?.version).toBe(1);
      expect(b.owner).toBe('SharedReadOnly');
      expect(b.state('vram')).toBe('Unmapped');
    }
    expect(ring.blocks.get('L1')!.bytes).toBe(7);
    expect([ring.occupantOf(0), ring.occupantOf(1)]).toEqual([undefined, undefined]);
    expect(ring.expected).toBe(0);
  });

  it('serves many passes: every acquire finds its block in its slot and every transition is legal', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 12 }),
        fc.integer({ min: 1, max: 14 }),
        fc.integer({ min: 1, max: 6 }),
        fc.boolean(),
        fc.constantFrom<'vram' | 'dram'>('vram', 'dram'),
        (n, k, passes, prime, tier) => {
          vi.restoreAllMocks();
          const seen = recordTransitions(tier);
          const { loads, stalls } = simulate(n, k, passes, prime, tier);
          const primed = Math.min(k, n);
          // Primed: no block is ever loaded at its point of use. Unprimed: only the first pass's first k.
          expect(stalls).toBe(prime ? 0 : primed);
          expect(loads).toBe(primed + n * passes);
          // Each slot replica goes around core's cycle: load, one use per pass, evict; the blocks
          // that start the next pass end loading.
          for (let j = 0; j < n; j++) {
            expect(seen.get(`L${j}`)).toBe('aprurdex'.repeat(passes) + (j < primed ? 'ap' : ''));
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  it('refuses blocks out of order, a block not in its slot, and a release of a block not in use', () => {
    const schedule = new StagingSchedule(ids(3), 2);
    const ring = new RingState(schedule, () => 8);
    // Not loaded yet.
    expect(() => ring.acquire(0)).toThrow(/block L0 is not in its slot/);
    for (const i of schedule.initial()) ring.loadIssued(i);
    ring.loadAwaited(0);
    ring.loadAwaited(1);
    expect(() => ring.acquire(1)).toThrow(PagerStateError);
    expect(() => ring.acquire(1)).toThrow(/used in order: expected L0, got L1/);
    expect(() => ring.release(0)).toThrow(/release of block L0, which is Ready/);
    expect(() => ring.release(2)).toThrow(/release of block L2, which is Unmapped/);
    ring.acquire(0);
    // Its slot cannot take another block while it is read.
    expect(() => ring.loadIssued(2)).toThrow(/slot 0 is overwritten while block L0 is in use/);
    ring.release(0);
    expect(() => ring.release(0)).toThrow(PagerStateError);
    expect(() => ring.release(0)).toThrow(/which is Ready/);
    expect(ring.expected).toBe(1);
    expect(() => ring.release(7)).toThrow(/no streamed block at index 7/);
    // The refusals changed nothing: the pass goes on.
    ring.loadIssued(2);
    ring.acquire(1);
    ring.release(1);
    ring.loadIssued(1);
    ring.loadAwaited(2);
    ring.acquire(2);
    ring.release(2);
    expect(ring.expected).toBe(0);
  });

  it('a load awaited twice, or awaited before it is issued, changes nothing', () => {
    const ring = new RingState(new StagingSchedule(ids(2), 1), () => 8, 'dram');
    ring.loadAwaited(0);
    expect(ring.blocks.get('L0')!.state('dram')).toBe('Unmapped');
    ring.loadIssued(0);
    ring.loadAwaited(0);
    ring.loadAwaited(0);
    expect(ring.blocks.get('L0')!.state('dram')).toBe('Ready');
  });
});
