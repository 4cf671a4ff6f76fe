import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { type PlanBlock, type PlanInput, planResidency, type ResidencyPlan, WorkingSetTooLargeError } from '../src/index.js';
import { sum } from './helpers.js';

/** Random blocks with unique ids: sizes, optional (possibly repeated) orders, importance, gather. */
const blocksArb: fc.Arbitrary<PlanBlock[]> = fc
  .array(
    fc.record({
      // Mostly layer-like sizes close to each other, sometimes an outlier (or an empty block).
      bytes: fc.oneof({ arbitrary: fc.integer({ min: 40, max: 100 }), weight: 4 }, { arbitrary: fc.integer({ min: 0, max: 1000 }), weight: 1 }),
      order: fc.option(fc.integer({ min: 0, max: 40 }), { freq: 4 }),
      importance: fc.option(fc.integer({ min: -3, max: 3 }), { freq: 2 }),
      gather: fc.boolean(),
    }),
    { maxLength: 14 },
  )
  .map((rs) =>
    rs.map((r, i) => ({
      id: `b${i}`,
      bytes: r.bytes,
      ...(r.order !== null ? { order: r.order } : {}),
      ...(r.importance !== null ? { importance: r.importance } : {}),
      ...(r.gather && i % 3 === 0 ? { access: 'gather' as const } : {}),
    })),
  );

/** Budgets as fractions of the total, so resident, paged, refused, mapped and disk plans all come up. */
const inputArb: fc.Arbitrary<PlanInput> = blocksArb.chain((blocks) => {
  const total = blocks.reduce((s, b) => s + b.bytes, 0);
  const share = (minPercent: number, maxPercent: number) => fc.integer({ min: minPercent, max: maxPercent }).map((p) => Math.floor((total * p) / 100));
  return fc
    .record({
      deviceBytes: fc.oneof({ arbitrary: share(50, 100), weight: 4 }, { arbitrary: share(0, 110), weight: 1 }, { arbitrary: fc.integer({ min: 0, max: 3000 }), weight: 1 }),
      hostBytes: fc.option(share(0, 100), { freq: 3 }),
      slots: fc.option(fc.integer({ min: 1, max: 5 })),
      disk: fc.boolean(),
    })
    .map(({ hostBytes, slots, ...rest }) => ({ blocks, ...rest, ...(hostBytes !== null ? { hostBytes } : {}), ...(slots !== null ? { slots } : {}) }));
});

/** Every structural promise of a plan, against its input. */
function checkPlan(input: PlanInput, plan: ResidencyPlan): void {
  const { blocks, deviceBytes } = input;
  const slots = input.slots ?? 2;
  const hostBytes = input.hostBytes ?? Number.POSITIVE_INFINITY;
  const total = sum(blocks.map((b) => b.bytes));
  const byId = new Map(blocks.map((b) => [b.id, b]));
  const placed = [...plan.placements.values()];

  // Every block placed exactly once, with its own size.
  expect(plan.placements.size).toBe(blocks.length);
  for (const b of blocks) {
    const p = plan.placements.get(b.id);
    expect(p?.id).toBe(b.id);
    expect(p?.bytes).toBe(b.bytes);
  }
  expect(plan.mode).toBe(total <= deviceBytes ? 'resident' : 'paged');
  expect(plan.deviceBytesUsed).toBeLessThanOrEqual(deviceBytes);

  const of = (placement: string) => placed.filter((p) => p.placement === placement);
  const bytesOf = (placement: string) => sum(of(placement).map((p) => p.bytes));
  expect(bytesOf('hot')).toBe(plan.hotBytes);
  expect(bytesOf('streamed')).toBe(plan.streamedBytes);
  expect(plan.hotBytes + plan.streamedBytes + bytesOf('mapped')).toBe(total);
  for (const p of of('hot')) expect(p.home).toBe('vram');
  for (const p of of('mapped')) expect(p.home).toBe('pinned');
  for (const p of of('streamed')) expect(['pinned', 'disk']).toContain(p.home);

  // Streamed ids: exactly the streamed placements, in execution order.
  expect(new Set(plan.streamed)).toEqual(new Set(of('streamed').map((p) => p.id)));
  expect(plan.streamed).toHaveLength(of('streamed').length);
  const orders = plan.streamed.map((id) => byId.get(id)!.order);
  for (const o of orders) expect(o).toBeDefined();
  for (let i = 1; i < orders.length; i++) expect(orders[i]!).toBeGreaterThanOrEqual(orders[i - 1]!);

  if (plan.mode === 'resident') {
    expect(placed.every((p) => p.placement === 'hot')).toBe(true);
    expect(plan).toMatchObject({ streamed: [], slots: 0, slotBytes: 0, hotBytes: total, deviceBytesUsed: total, pinnedBytes: 0, diskBytes: 0 });
    return;
  }
  // Blocks without an execution order never stream; only gathered blocks are mapped.
  for (const b of blocks) {
    const p = plan.placements.get(b.id)!.placement;
    if (b.order === undefined) expect(p).not.toBe('streamed');
    if (p === 'mapped') expect(b.access).toBe('gather');
  }
  // The ring: as many slots as asked, no more than streamed blocks, each holding any streamed block.
  expect(plan.slots).toBe(Math.min(slots, plan.streamed.length));
  for (const id of plan.streamed) expect(plan.slotBytes).toBeGreaterThanOrEqual(byId.get(id)!.bytes);
  expect(plan.deviceBytesUsed).toBe(plan.hotBytes + plan.slots * plan.slotBytes);
  // Host and disk tiers.
  const home = (h: string) => sum(placed.filter((p) => p.home === h && p.placement !== 'hot').map((p) => p.bytes));
  expect(plan.pinnedBytes).toBe(home('pinned'));
  expect(plan.diskBytes).toBe(home('disk'));
  expect(plan.pinnedBytes).toBeLessThanOrEqual(hostBytes);
  if (plan.diskBytes > 0) expect(input.disk).toBe(true);
  // Greedy hot picks are maximal: no streamed block would also have fit hot beside the ring.
  const ringReserved = Math.min(slots, blocks.filter((b) => b.order !== undefined && plan.placements.get(b.id)!.placement !== 'mapped').length) * plan.slotBytes;
  for (const id of plan.streamed) expect(plan.hotBytes + byId.get(id)!.bytes + ringReserved).toBeGreaterThan(deviceBytes);
}

describe('planResidency properties', () => {
  it('either refuses with WorkingSetTooLargeError or returns a plan that keeps every promise', () => {
    let refused = 0;
    const seen = { resident: 0, paged: 0, streamed: 0, mapped: 0, disk: 0, hotLayers: 0 };
    fc.assert(
      fc.property(inputArb, (input) => {
        let plan: ResidencyPlan;
        try {
          plan = planResidency(input);
        } catch (e) {
          expect(e).toBeInstanceOf(WorkingSetTooLargeError);
          const err = e as WorkingSetTooLargeError;
          expect(err.minimumBytes).toBeGreaterThan(err.budgetBytes);
          refused++;
          if (/no offload dir/.test(err.message)) {
            expect(input.disk).not.toBe(true);
            expect(err.budgetBytes).toBe(input.hostBytes);
            // With a disk tier the same input plans.
            checkPlan({ ...input, disk: true }, planResidency({ ...input, disk: true }));
          } else {
            expect(err.budgetBytes).toBe(input.deviceBytes);
            // The minimum it names is enough for the compute tier (the host may still be short).
            try {
              checkPlan({ ...input, deviceBytes: err.minimumBytes }, planResidency({ ...input, deviceBytes: err.minimumBytes }));
            } catch (e2) {
              expect(e2).toBeInstanceOf(WorkingSetTooLargeError);
              expect((e2 as Error).message).toMatch(/no offload dir/);
            }
          }
          return;
        }
        checkPlan(input, plan);
        seen[plan.mode]++;
        const placed = [...plan.placements.values()];
        if (plan.streamed.length > 0) seen.streamed++;
        if (placed.some((p) => p.placement === 'mapped')) seen.mapped++;
        if (plan.diskBytes > 0) seen.disk++;
        if (plan.mode === 'paged' && input.blocks.some((b) => b.order !== undefined && plan.placements.get(b.id)!.placement === 'hot')) seen.hotLayers++;
      }),
      { numRuns: 1500 },
    );
    // The generator reaches every kind of outcome often (disk plans, the rarest, about 50 times).
    for (const n of [...Object.values(seen), refused]) expect(n).toBeGreaterThan(15);
  });

  it('plans the same whatever order the blocks are listed in', () => {
    fc.assert(
      fc.property(
        inputArb.chain((input) => fc.tuple(fc.constant(input), fc.shuffledSubarray([...input.blocks], { minLength: input.blocks.length }))),
        ([input, shuffled]) => {
          // Distinct orders make the execution order (and the importance tie-break) total. Gathered
          // blocks take host room first come, first served, so they are left out here.
          const blocks = input.blocks.map(({ access: _access, ...b }, i) => (b.order !== undefined ? { ...b, order: i } : b));
          const reordered = shuffled.map((b) => blocks[Number(b.id.slice(1))]);
          const run = (bs: PlanBlock[]) => {
            try {
              const p = planResidency({ ...input, blocks: bs });
              return { placements: Object.fromEntries([...p.placements].sort(([a], [b]) => a.localeCompare(b))), streamed: p.streamed, used: p.deviceBytesUsed };
            } catch (e) {
              return { error: (e as Error).message };
            }
          };
          expect(run(reordered)).toEqual(run(blocks));
        },
      ),
      { numRuns: 1000 },
    );
  });

  it('is resident at a budget of exactly the total, and paged or refused one byte below', () => {
    fc.assert(
      fc.property(blocksArb, fc.integer({ min: 1, max: 4 }), (blocks, slots) => {
        const total = sum(blocks.map((b) => b.bytes));
        const plan = planResidency({ blocks, deviceBytes: total, slots });
        expect(plan.mode).toBe('resident');
        if (total > 0) {
          try {
            expect(planResidency({ blocks, deviceBytes: total - 1, slots }).mode).toBe('paged');
          } catch (e) {
            expect(e).toBeInstanceOf(WorkingSetTooLargeError);
          }
        }
      }),
      { numRuns: 500 },
    );
  });
});
