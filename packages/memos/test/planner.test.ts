import { NervaError } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import { fmt, PlanInputError, type PlanBlock, planResidency, type ResidencyPlan, WorkingSetTooLargeError } from '../src/index.js';

/** An always-hot 100-byte block and six 50-byte layers in execution order (400 bytes). */
const SIX: PlanBlock[] = [{ id: 'embed', bytes: 100 }, ...Array.from({ length: 6 }, (_, i) => ({ id: `L${i}`, bytes: 50, order: i }))];

const byPlacement = (plan: ResidencyPlan, placement: string): string[] =>
  [...plan.placements.values()].filter((p) => p.placement === placement).map((p) => p.id);

function planError(fn: () => unknown): WorkingSetTooLargeError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(WorkingSetTooLargeError);
    return e as WorkingSetTooLargeError;
  }
  throw new Error('expected a WorkingSetTooLargeError');
}

describe('planResidency: resident', () => {
  it('keeps every block hot when the total fits, up to the last byte', () => {
    for (const deviceBytes of [400, 10_000]) {
      const plan = planResidency({ blocks: SIX, deviceBytes });
      expect(plan.mode).toBe('resident');
      expect(plan.placements.size).toBe(7);
      for (const b of SIX) expect(plan.placements.get(b.id)).toEqual({ id: b.id, bytes: b.bytes, placement: 'hot', home: 'vram' });
      expect(plan).toMatchObject({ streamed: [], slots: 0, slotBytes: 0, hotBytes: 400, streamedBytes: 0, pinnedBytes: 0, diskBytes: 0, deviceBytesUsed: 400, notes: [] });
    }
    expect(planResidency({ blocks: SIX, deviceBytes: 399 }).mode).toBe('paged');
  });

  it('plans an empty model as resident', () => {
    expect(planResidency({ blocks: [], deviceBytes: 0 })).toMatchObject({ mode: 'resident', hotBytes: 0, deviceBytesUsed: 0 });
  });

  it('keeps a gathered block hot when everything fits', () => {
    const plan = planResidency({ blocks: [{ id: 'embed', bytes: 100, access: 'gather' }, ...SIX.slice(1)], deviceBytes: 400 });
    expect(plan.mode).toBe('resident');
    expect(plan.placements.get('embed')?.placement).toBe('hot');
    expect(plan.pinnedBytes).toBe(0);
  });
});

describe('planResidency: paged', () => {
  it('fills what the ring leaves with hot layers, in execution order, and streams the rest', () => {
    const plan = planResidency({ blocks: SIX, deviceBytes: 300 });
    expect(plan.mode).toBe('paged');
    // embed 100 + ring 2 x 50 leaves 100: two layers hot.
    expect(byPlacement(plan, 'hot')).toEqual(['embed', 'L0', 'L1']);
    expect(plan.streamed).toEqual(['L2', 'L3', 'L4', 'L5']);
    expect(byPlacement(plan, 'streamed')).toEqual(plan.streamed);
    expect(plan).toMatchObject({ slots: 2, slotBytes: 50, hotBytes: 200, streamedBytes: 200, pinnedBytes: 200, diskBytes: 0, deviceBytesUsed: 300 });
    for (const id of plan.streamed) expect(plan.placements.get(id)?.home).toBe('pinned');
    expect(plan.notes).toEqual(['paged weights: 2 of 6 layer blocks hot (200 B), 4 streamed (200 B) through 2 slots of 50 B']);
  });

  it('keeps hot blocks plus the ring within the device budget for every budget and slot count', () => {
    for (let slots = 1; slots <= 7; slots++) {
      for (let deviceBytes = 0; deviceBytes <= 420; deviceBytes += 7) {
        let plan: ResidencyPlan;
        try {
          plan = planResidency({ blocks: SIX, deviceBytes, slots });
        } catch (e) {
          expect(e).toBeInstanceOf(WorkingSetTooLargeError);
          expect((e as WorkingSetTooLargeError).minimumBytes).toBe(100 + Math.min(slots, 6) * 50);
          expect(deviceBytes).toBeLessThan(100 + Math.min(slots, 6) * 50);
          continue;
        }
        expect(plan.deviceBytesUsed).toBeLessThanOrEqual(deviceBytes);
        expect(plan.deviceBytesUsed).toBe(plan.hotBytes + plan.slots * plan.slotBytes);
        expect(plan.slots).toBe(Math.min(slots, plan.streamed.length));
      }
    }
  });

  it('picks hot layers by importance, then execution order', () => {
    const importance = [0, 5, 0, 9, 0, 0];
    const blocks = SIX.map((b, i) => (i === 0 ? b : { ...b, importance: importance[i - 1] }));
    const plan = planResidency({ blocks, deviceBytes: 300 });
    expect(byPlacement(plan, 'hot').sort()).toEqual(['L1', 'L3', 'embed']);
    // The streamed rest keep execution order whatever made the others hot.
    expect(plan.streamed).toEqual(['L0', 'L2', 'L4', 'L5']);
    // Equal importance: the earlier block wins.
    const tie = planResidency({ blocks: SIX.map((b) => ({ ...b, importance: 3 })), deviceBytes: 300 });
    expect(tie.streamed).toEqual(['L2', 'L3', 'L4', 'L5']);
  });

  it('skips an important block that does not fit for the next one that does', () => {
    const blocks: PlanBlock[] = [
      { id: 'embed', bytes: 100 },
      { id: 'big', bytes: 120, order: 0, importance: 9 },
      ...Array.from({ length: 4 }, (_, i) => ({ id: `L${i + 1}`, bytes: 60, order: i + 1 })),
    ];
    // The ring holds the largest layer (120): 100 + 2 x 120 = 340, leaving 100 of 440.
    const plan = planResidency({ blocks, deviceBytes: 440 });
    expect(plan.slotBytes).toBe(120);
    expect(byPlacement(plan, 'hot').sort()).toEqual(['L1', 'embed']);
    expect(plan.streamed).toEqual(['big', 'L2', 'L3', 'L4']);
    expect(plan.deviceBytesUsed).toBe(100 + 60 + 240);
  });

  it('keeps blocks without an execution order hot, whatever their importance or size', () => {
    const blocks: PlanBlock[] = [...SIX, { id: 'lm_head', bytes: 150, importance: -100 }, { id: 'final_norm', bytes: 0, importance: -1 }];
    const plan = planResidency({ blocks, deviceBytes: 350 });
    expect(plan.mode).toBe('paged');
    for (const id of ['embed', 'lm_head', 'final_norm']) expect(plan.placements.get(id)).toMatchObject({ placement: 'hot', home: 'vram' });
    expect(plan.streamed).toEqual(['L0', 'L1', 'L2', 'L3', 'L4', 'L5']);
    expect(plan.hotBytes).toBe(250);
    // Ordered blocks of importance far above theirs still cannot displace them.
    const important = planResidency({ blocks: blocks.map((b) => (b.order !== undefined ? { ...b, importance: 1000 } : b)), deviceBytes: 350 });
    expect(byPlacement(important, 'hot').sort()).toEqual(['embed', 'final_norm', 'lm_head']);
  });

  it('streams through one slot when asked, and never through more slots than streamed blocks', () => {
    const one = planResidency({ blocks: SIX, deviceBytes: 300, slots: 1 });
    expect(one).toMatchObject({ slots: 1, deviceBytesUsed: 300, hotBytes: 250 });
    expect(one.streamed).toEqual(['L3', 'L4', 'L5']);
    // A gathered block read in place frees room: one layer streams, through one slot, and the note says one.
    const blocks: PlanBlock[] = [{ id: 'embed', bytes: 100, access: 'gather' }, ...Array.from({ length: 3 }, (_, i) => ({ id: `L${i}`, bytes: 50, order: i }))];
    const plan = planResidency({ blocks, deviceBytes: 240 });
    expect(plan.streamed).toEqual(['L2']);
    expect(plan.slots).toBe(1);
    expect(plan.deviceBytesUsed).toBe(150);
    expect(plan.notes[0]).toBe('paged weights: 2 of 3 layer blocks hot (100 B), 1 streamed (50 B) through 1 slots of 50 B');
  });
});

describe('planResidency: gathered blocks', () => {
  const blocks: PlanBlock[] = [
    { id: 'embed', bytes: 100, access: 'gather' },
    { id: 'norm', bytes: 10 },
    ...Array.from({ length: 4 }, (_, i) => ({ id: `L${i}`, bytes: 50, order: i })),
  ];

  it('are mapped from host memory when weights are paged and the host budget has room', () => {
    const plan = planResidency({ blocks, deviceBytes: 200 });
    expect(plan.mode).toBe('paged');
    expect(plan.placements.get('embed')).toEqual({ id: 'embed', bytes: 100, placement: 'mapped', home: 'pinned' });
    // norm 10 + ring 100 leaves 90: one layer hot.
    expect(byPlacement(plan, 'hot')).toEqual(['norm', 'L0']);
    expect(plan).toMatchObject({ hotBytes: 60, streamedBytes: 150, pinnedBytes: 250, deviceBytesUsed: 160 });
    // A host budget of exactly its size still maps it (the streamed blocks then go to disk).
    const tight = planResidency({ blocks, deviceBytes: 200, hostBytes: 100, disk: true });
    expect(tight.placements.get('embed')?.placement).toBe('mapped');
    expect(tight).toMatchObject({ pinnedBytes: 100, diskBytes: 150 });
  });

  it('are hot when the host budget has no room for them', () => {
    // embed hot: 110 always-hot + ring 100 does not fit 200.
    const err = planError(() => planResidency({ blocks, deviceBytes: 200, hostBytes: 99 }));
    expect(err.minimumBytes).toBe(210);
    const plan = planResidency({ blocks, deviceBytes: 260, hostBytes: 99, disk: true });
    expect(plan.placements.get('embed')).toMatchObject({ placement: 'hot', home: 'vram' });
    expect(plan.streamed).toEqual(['L1', 'L2', 'L3']);
    expect(plan.streamed.map((id) => plan.placements.get(id)?.home)).toEqual(['pinned', 'disk', 'disk']);
    expect(plan).toMatchObject({ hotBytes: 160, pinnedBytes: 50, diskBytes: 100 });
  });

  it('can leave nothing to stream: a paged plan with every layer hot and no ring', () => {
    const wide: PlanBlock[] = [{ id: 'embed', bytes: 300, access: 'gather' }, ...blocks.slice(1, 5)];
    const plan = planResidency({ blocks: wide, deviceBytes: 300 });
    expect(plan.mode).toBe('paged');
    expect(plan.streamed).toEqual([]);
    expect(plan).toMatchObject({ slots: 0, hotBytes: 160, deviceBytesUsed: 160, streamedBytes: 0, pinnedBytes: 300 });
  });
});

describe('planResidency: host and disk tiers', () => {
  it('spills streamed blocks beyond the host budget to disk when there is a disk tier', () => {
    const plan = planResidency({ blocks: SIX, deviceBytes: 300, hostBytes: 120, disk: true });
    expect(plan.streamed).toEqual(['L2', 'L3', 'L4', 'L5']);
    expect(plan.streamed.map((id) => plan.placements.get(id)?.home)).toEqual(['pinned', 'pinned', 'disk', 'disk']);
    expect(plan).toMatchObject({ pinnedBytes: 100, diskBytes: 100, streamedBytes: 200 });
    expect(plan.notes[1]).toBe('disk tier: 100 B of streamed blocks beyond the host budget of 120 B are read from the offload dir each pass');
    // A later, smaller block still takes host room a larger one could not.
    const mixed = planResidency({ blocks: [...SIX.slice(0, 6), { id: 'L5', bytes: 20, order: 5 }], deviceBytes: 300, hostBytes: 125, disk: true });
    expect(mixed.streamed.map((id) => mixed.placements.get(id)?.home)).toEqual(['pinned', 'pinned', 'disk', 'pinned']);
  });

  it('refuses host overflow without a disk tier, naming the host budget', () => {
    for (const disk of [undefined, false]) {
      const err = planError(() => planResidency({ blocks: SIX, deviceBytes: 300, hostBytes: 120, ...(disk === undefined ? {} : { disk }) }));
      expect(err.budgetBytes).toBe(120);
      expect(err.minimumBytes).toBe(150);
      expect(err.message).toMatch(/no offload dir/);
      expect(err.code).toBe('WORKING_SET_TOO_LARGE');
    }
    // A host budget of exactly the streamed bytes needs no disk.
    expect(planResidency({ blocks: SIX, deviceBytes: 300, hostBytes: 200 }).diskBytes).toBe(0);
  });
});

describe('planResidency: budget too small', () => {
  it('names the minimum working set: always-hot blocks plus the ring', () => {
    for (const [slots, minimum] of [
      [1, 150],
      [2, 200],
      [3, 250],
      [6, 400],
      [9, 400],
    ] as const) {
      const err = planError(() => planResidency({ blocks: SIX, deviceBytes: minimum - 1, slots }));
      expect(err.budgetBytes).toBe(minimum - 1);
      expect(err.minimumBytes).toBe(minimum);
      expect(err.message).toContain(`cannot hold the minimum working set of ${minimum} B`);
      expect(err).toBeInstanceOf(NervaError);
      if (minimum < 400) {
        // Exactly the minimum works: every layer streams.
        const plan = planResidency({ blocks: SIX, deviceBytes: minimum, slots });
        expect(plan).toMatchObject({ mode: 'paged', deviceBytesUsed: minimum, hotBytes: 100 });
        expect(plan.streamed).toHaveLength(6);
      }
    }
  });

  it('sizes the ring by the largest ordered block, and counts always-hot blocks alone', () => {
    const blocks = [...SIX.slice(0, 6), { id: 'L5', bytes: 80, order: 5 }];
    expect(planError(() => planResidency({ blocks, deviceBytes: 200 })).minimumBytes).toBe(260);
    expect(planError(() => planResidency({ blocks: SIX, deviceBytes: 90, slots: 1 })).minimumBytes).toBe(150);
    const onlyHot = planError(() => planResidency({ blocks: [{ id: 'a', bytes: 60 }, { id: 'b', bytes: 70 }], deviceBytes: 100 }));
    expect(onlyHot.minimumBytes).toBe(130);
  });
});

describe('planResidency: bad input', () => {
  const bad: [string, () => unknown, RegExp][] = [
    ['a negative size', () => planResidency({ blocks: [{ id: 'a', bytes: -1 }], deviceBytes: 10 }), /block a: bad size -1/],
    ['a NaN size', () => planResidency({ blocks: [{ id: 'a', bytes: Number.NaN }], deviceBytes: 10 }), /bad size NaN/],
    ['an infinite size', () => planResidency({ blocks: [{ id: 'a', bytes: Number.POSITIVE_INFINITY }], deviceBytes: 10 }), /bad size Infinity/],
    ['a duplicate id', () => planResidency({ blocks: [{ id: 'a', bytes: 1 }, { id: 'a', bytes: 2, order: 0 }], deviceBytes: 10 }), /duplicate block id a/],
    ['a NaN device budget', () => planResidency({ blocks: SIX, deviceBytes: Number.NaN }), /device budget/],
    ['a negative device budget', () => planResidency({ blocks: SIX, deviceBytes: -1 }), /device budget/],
    ['an infinite device budget', () => planResidency({ blocks: SIX, deviceBytes: Number.POSITIVE_INFINITY }), /device budget/],
    ['zero slots', () => planResidency({ blocks: SIX, deviceBytes: 300, slots: 0 }), /slots must be a positive integer, got 0/],
    ['fractional slots', () => planResidency({ blocks: SIX, deviceBytes: 300, slots: 1.5 }), /slots/],
    ['a NaN host budget', () => planResidency({ blocks: SIX, deviceBytes: 300, hostBytes: Number.NaN }), /host budget/],
    ['a negative host budget', () => planResidency({ blocks: SIX, deviceBytes: 300, hostBytes: -5 }), /host budget/],
  ];
  for (const [what, fn, message] of bad) {
    it(`refuses ${what} with PlanInputError`, () => {
      expect(fn).toThrow(PlanInputError);
      expect(fn).toThrow(message);
      try {
        fn();
      } catch (e) {
        expect((e as PlanInputError).code).toBe('PLAN_INPUT');
        expect(e).toBeInstanceOf(NervaError);
      }
    });
  }

  it('checks its inputs even when everything would fit', () => {
    expect(() => planResidency({ blocks: [{ id: 'a', bytes: 1 }, { id: 'a', bytes: 1 }], deviceBytes: 1000 })).toThrow(PlanInputError);
    expect(() => planResidency({ blocks: [], deviceBytes: 0, slots: 0 })).toThrow(PlanInputError);
  });
});

describe('fmt', () => {
  it('prints bytes as a user would type them', () => {
    expect(fmt(0)).toBe('0 B');
    expect(fmt(1023)).toBe('1023 B');
    expect(fmt(1024)).toBe('1.00 KiB');
    expect(fmt(1536)).toBe('1.50 KiB');
    expect(fmt(5 * 2 ** 20)).toBe('5.00 MiB');
    expect(fmt(2.25 * 2 ** 30)).toBe('2.25 GiB');
  });
});
