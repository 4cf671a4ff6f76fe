import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { DeviceBackend, StreamHandle, Tier } from '@nerva/core';
import type { CpuBackend } from '@nerva/cpu-backend';
import { afterEach, describe, expect, it } from 'vitest';
import { OffloadDirError, PagerStateError, planResidency, type ResidencyPlan, type TensorSet, WeightPager } from '../src/index.js';
import { BLOCK_BYTES, blockData, cpu, LAYOUT, model, storeAll, tempDir } from './helpers.js';

/** embed (4 blocks' worth) + 2 slots + one hot layer: L0 hot, L1..L5 streamed. */
const DEVICE = 4 * BLOCK_BYTES + 2 * BLOCK_BYTES + BLOCK_BYTES;
const planOf = (extra: { deviceBytes?: number; hostBytes?: number; slots?: number; disk?: boolean } = {}): ResidencyPlan =>
  planResidency({ blocks: model(6), deviceBytes: DEVICE, ...extra });

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

/** The slot holds block `id`'s stored data (read back from the backend). */
function expectHolds(be: DeviceBackend, set: TensorSet, id: string): void {
  const d = blockData(Number(id.slice(1)));
  expect(Array.from(be.read(set.w)), `${id}.w`).toEqual(Array.from(d.w));
  expect(Array.from(be.read(set.n)), `${id}.n`).toEqual(Array.from(d.n));
}

/** One forward pass in the pager's protocol, checking each slot's contents. */
function pass(pager: WeightPager, check = true): void {
  for (const id of pager.plan.streamed) {
    const set = pager.acquire(id);
    expect(set).toBe(pager.slotFor(id));
    if (check) expectHolds(pager.backend, set, id);
    pager.release(id);
  }
  pager.endPass();
}

/** Acquire and release one block (its layer's ops would be enqueued in between). */
function use(pager: WeightPager, id: string): void {
  pager.acquire(id);
  pager.release(id);
}

function primed(be: CpuBackend, plan = planOf(), extra: { offloadDir?: string } = {}): WeightPager {
  const pager = new WeightPager({ backend: be, plan, layout: LAYOUT, hostTier: 'pinned', ...extra });
  cleanups.push(() => pager.dispose());
  storeAll(pager, plan);
  pager.prime();
  return pager;
}

describe('WeightPager on the CPU backend', () => {
  it('streams every block through its slot, pass after pass, with the data stored for it', () => {
    const plan = planOf();
    expect(plan.streamed).toEqual(['L1', 'L2', 'L3', 'L4', 'L5']);
    // The compute tier holds the two slots and nothing else; the host tier the five master copies.
    const be = cpu(2 * BLOCK_BYTES, 5 * BLOCK_BYTES);
    const pager = primed(be, plan);
    expect(pager.capturable).toBe(true);
    expect(pager.hostBytes).toBe(5 * BLOCK_BYTES);
    expect(pager.slotBytes).toBe(2 * BLOCK_BYTES);
    expect(pager.isStreamed('L1')).toBe(true);
    expect(pager.isStreamed('L0')).toBe(false);
    expect(pager.isStreamed('embed')).toBe(false);
    // Block j always passes through slot j mod 2.
    expect(pager.slotFor('L1')).toBe(pager.slotFor('L3'));
    expect(pager.slotFor('L1')).not.toBe(pager.slotFor('L2'));
    expect(pager.slotFor('L1').w.tier).toBe('dram');
    expect(pager.slotFor('L1').w.dtype).toBe('f32');
    expect(pager.slotFor('L1').n.dtype).toBe('bf16');
    for (let p = 0; p < 4; p++) pass(pager);
    expect(pager.stats()).toEqual({
      passes: 4,
      loads: 2 + 4 * 5, // the primed two, then one per streamed block per pass
      h2dBytes: (2 + 4 * 5) * BLOCK_BYTES,
      diskReadBytes: 0,
      diskReadMs: 0,
      hits: 4 * 5,
      stalls: 0,
      hostWaits: 0,
    });
    expect(be.stats().syncs.hard).toBe(4 * 5 * 2); // the test's own reads, nothing of the pager's
  });

  it('loads at the point of use when it was not primed, then runs ahead', () => {
    const be = cpu();
    const plan = planOf();
    const pager = new WeightPager({ backend: be, plan, layout: LAYOUT, hostTier: 'pinned' });
    cleanups.push(() => pager.dispose());
    storeAll(pager, plan);
    pass(pager);
    expect(pager.stats()).toMatchObject({ passes: 1, stalls: 2, hits: 3, loads: 2 + 5 });
    pass(pager);
    expect(pager.stats()).toMatchObject({ passes: 2, stalls: 2, hits: 8, loads: 2 + 10 });
  });

  it('streams through a single slot, and through as many slots as blocks', () => {
    for (const slots of [1, 5]) {
      const plan = planOf({ deviceBytes: 4 * BLOCK_BYTES + slots * BLOCK_BYTES, slots });
      expect(plan.streamed).toHaveLength(6);
      expect(plan.slots).toBe(slots);
      const pager = primed(cpu(slots * BLOCK_BYTES), plan);
      for (let p = 0; p < 3; p++) pass(pager);
      expect(pager.stats()).toMatchObject({ passes: 3, loads: slots + 18, hits: 18, stalls: 0 });
    }
  });

  it('starts again from a pass boundary after every endPass, and reloads what it overwrote', () => {
    const be = cpu();
    const pager = primed(be);
    pass(pager);
    // Overwrite a master copy: the next time the block is loaded, the slot holds the new data.
    const fresh = Float32Array.from({ length: 48 }, (_, e) => -e);
    pager.store('L4', 'w', fresh);
    const got: number[][] = [];
    for (const id of pager.plan.streamed) {
      const set = pager.acquire(id);
      got.push(Array.from(be.read(set.w, 0, 2)));
      pager.release(id);
    }
    pager.endPass();
    expect(got[3]).toEqual([-0, -1]);
    expect(got[0]).toEqual([1000.25, 1001.25]);
  });
});

describe('WeightPager protocol errors', () => {
  it('refuses endPass before every streamed block was used', () => {
    const pager = primed(cpu());
    use(pager, 'L1');
    expect(() => pager.endPass()).toThrow(PagerStateError);
    expect(() => pager.endPass()).toThrow(/pass ended after 1 of 5 streamed blocks/);
    for (const id of ['L2', 'L3', 'L4']) use(pager, id);
    expect(() => pager.endPass()).toThrow(/after 4 of 5/);
    pager.acquire('L5');
    expect(() => pager.endPass()).toThrow(PagerStateError);
    pager.release('L5');
    pager.endPass();
    expect(pager.stats().passes).toBe(1);
  });

  it('refuses endPass while the first block is acquired and not released', () => {
    const be = cpu();
    const pager = primed(be);
    pager.acquire('L1');
    expect(() => pager.endPass()).toThrow(PagerStateError);
    expect(pager.stats().passes).toBe(0);
    pager.release('L1');
    for (const id of ['L2', 'L3', 'L4', 'L5']) use(pager, id);
    pager.endPass();
    pass(pager);
    expect(pager.stats()).toMatchObject({ passes: 2, stalls: 0 });
  });

  it('refuses blocks it does not stream', () => {
    const pager = primed(cpu());
    for (const id of ['L0', 'embed', 'nope']) {
      expect(() => pager.acquire(id)).toThrow(PagerStateError);
      expect(() => pager.acquire(id)).toThrow(`block ${id} is not streamed`);
      expect(() => pager.release(id)).toThrow(PagerStateError);
      expect(() => pager.slotFor(id)).toThrow(PagerStateError);
      expect(() => pager.store(id, 'w', new Float32Array(1))).toThrow(`block ${id} is not streamed`);
    }
    expect(() => pager.store('L1', 'nope', new Float32Array(1))).toThrow(/block L1 has no tensor nope/);
    pass(pager);
  });

  it('refuses an acquire out of order, or twice, without disturbing the ring', () => {
    for (const slots of [1, 2]) {
      const be = cpu();
      const plan = planOf({ deviceBytes: 4 * BLOCK_BYTES + slots * BLOCK_BYTES, slots });
      const pager = primed(be, plan);
      const before = pager.stats();
      expect(() => pager.acquire('L3')).toThrow(PagerStateError);
      expect(() => pager.acquire('L3')).toThrow(/used in order: expected L0, got L3/);
      expect(pager.stats()).toEqual(before);
      pager.acquire('L0');
      expect(() => pager.acquire('L0')).toThrow(PagerStateError);
      expect(() => pager.acquire('L1')).toThrow(PagerStateError);
      pager.release('L0');
      expect(() => pager.release('L0')).toThrow(PagerStateError);
      expect(() => pager.release('L0')).toThrow(/release of block L0/);
      for (const id of plan.streamed.slice(1)) {
        const set = pager.acquire(id);
        expectHolds(be, set, id);
        pager.release(id);
      }
      pager.endPass();
      pass(pager);
      expect(pager.stats()).toMatchObject({ passes: 2, stalls: 0, hits: 12, loads: slots + 12 });
    }
  });

  it('refuses a resident plan, a layout larger than a slot, and a disk tier without a directory', () => {
    const be = cpu();
    const start = be.stats().liveBuffers;
    const resident = planResidency({ blocks: model(6), deviceBytes: 1e6 });
    expect(() => new WeightPager({ backend: be, plan: resident, layout: LAYOUT, hostTier: 'pinned' })).toThrow(/needs a paged plan/);
    const wide = [...LAYOUT, { name: 'extra', dtype: 'f32' as const, length: 1 }];
    expect(() => new WeightPager({ backend: be, plan: planOf(), layout: wide, hostTier: 'pinned' })).toThrow(/does not fit a slot of 224/);
    const disk = planOf({ hostBytes: 2 * BLOCK_BYTES, disk: true });
    expect(() => new WeightPager({ backend: be, plan: disk, layout: LAYOUT, hostTier: 'pinned' })).toThrow(/no offload dir was given/);
    const t = tempDir();
    cleanups.push(t.cleanup);
    const missing = join(t.dir, 'missing');
    expect(() => new WeightPager({ backend: be, plan: disk, layout: LAYOUT, hostTier: 'pinned', offloadDir: missing })).toThrow(OffloadDirError);
    // A compute tier one byte short of the ring: the backend refuses, and what was allocated is freed.
    const small = cpu(2 * BLOCK_BYTES - 1);
    const smallStart = small.stats().liveBuffers;
    expect(() => new WeightPager({ backend: small, plan: planOf(), layout: LAYOUT, hostTier: 'pinned' })).toThrow();
    expect(small.stats().liveBuffers).toBe(smallStart);
    expect(be.stats().liveBuffers).toBe(start);
  });
});

describe('WeightPager graph capture', () => {
  it('a captured pass replays the loads: one pass worth of loads per replay, with the right data', () => {
    const be = cpu();
    const plan = planOf();
    const pager = primed(be, plan);
    pass(pager);
    const n = plan.streamed.length;
    const out = be.alloc({ dtype: 'f32', length: n * 48, usage: 'io' });
    cleanups.push(() => be.free(out));
    const eager = pager.stats();
    // Capture: each block's slot is copied out where a layer would read it.
    be.beginCapture();
    pager.beginCapture();
    plan.streamed.forEach((id, j) => {
      const set = pager.acquire(id);
      be.copy(out, set.w, 48, j * 48);
      pager.release(id);
    });
    pager.endPass();
    pager.endCapture();
    const graph = be.endCapture();
    // Recording a pass moves nothing and serves no pass.
    expect(pager.stats()).toEqual(eager);
    for (let r = 1; r <= 3; r++) {
      be.write(out, new Float32Array(n * 48));
      be.replay(graph);
      pager.replayed();
      const got = be.read(out);
      plan.streamed.forEach((id, j) => expect(Array.from(got.subarray(j * 48, (j + 1) * 48))).toEqual(Array.from(blockData(Number(id.slice(1))).w)));
      expect(pager.stats()).toEqual({ ...eager, passes: eager.passes + r, loads: eager.loads + r * n, h2dBytes: eager.h2dBytes + r * n * BLOCK_BYTES, hits: eager.hits + r * n });
    }
    // Eager passes and replays mix: the ring is at a pass boundary after either.
    pass(pager);
    be.replay(graph);
    pager.replayed();
    pass(pager);
    expect(pager.stats()).toMatchObject({ passes: eager.passes + 6, stalls: 0 });
    be.destroyGraph(graph);
  });
});

describe('WeightPager disk tier', () => {
  it('reads spilled blocks from the offload dir through host bounce buffers; the file is unlinked once open', () => {
    const { dir, cleanup } = tempDir();
    cleanups.push(cleanup);
    const plan = planOf({ hostBytes: 2 * BLOCK_BYTES, disk: true });
    expect(plan.streamed.map((id) => plan.placements.get(id)?.home)).toEqual(['pinned', 'pinned', 'disk', 'disk', 'disk']);
    const be = cpu();
    const start = be.stats().liveBuffers;
    const pager = new WeightPager({ backend: be, plan, layout: LAYOUT, hostTier: 'pinned', offloadDir: dir });
    // The spill file is unlinked once open (nothing stays after a crash): the dir looks empty while in use.
    expect(readdirSync(dir)).toEqual([]);
    expect(pager.spill?.file.startsWith(join(dir, 'nerva-spill-'))).toBe(true);
    expect(pager.spill?.bytes).toBe(3 * BLOCK_BYTES);
    expect(pager.capturable).toBe(false);
    // Two master copies and one bounce set per slot.
    expect(pager.hostBytes).toBe((2 + 2) * BLOCK_BYTES);
    storeAll(pager, plan);
    pager.prime();
    for (let p = 0; p < 3; p++) pass(pager);
    const s = pager.stats();
    expect(s).toMatchObject({ passes: 3, loads: 2 + 15, hits: 15, stalls: 0, hostWaits: 0 });
    expect(s.diskReadBytes).toBe(3 * 3 * BLOCK_BYTES);
    expect(s.diskReadMs).toBeGreaterThanOrEqual(0);
    const file = pager.spill!.file;
    pager.dispose();
    expect(existsSync(file)).toBe(false);
    expect(readdirSync(dir)).toEqual([]);
    expect(be.stats().liveBuffers).toBe(start);
  });
});

describe('WeightPager with nothing to stream', () => {
  it('serves a paged plan whose only paged block is read in place', () => {
    // The embedding is gathered from host memory; that frees room for every layer to be hot.
    const blocks = [{ id: 'embed', bytes: 20 * BLOCK_BYTES, access: 'gather' as const }, ...model(3).slice(1)];
    const plan = planResidency({ blocks, deviceBytes: 6 * BLOCK_BYTES });
    expect(plan.mode).toBe('paged');
    expect(plan.streamed).toEqual([]);
    expect(plan.placements.get('embed')?.placement).toBe('mapped');
    const be = cpu();
    const start = be.stats().liveBuffers;
    const pager = new WeightPager({ backend: be, plan, layout: LAYOUT, hostTier: 'pinned' });
    expect(pager.isStreamed('L0')).toBe(false);
    expect(pager.hostBytes).toBe(0);
    expect(pager.slotBytes).toBe(0);
    pager.prime();
    pager.endPass();
    pager.endPass();
    expect(pager.stats()).toMatchObject({ passes: 2, loads: 0, hits: 0 });
    pager.dispose();
    expect(be.stats().liveBuffers).toBe(start);
  });
});

describe('WeightPager dispose', () => {
  it('frees every buffer it allocated, and a second dispose does nothing', () => {
    const be = cpu();
    const before = be.stats();
    const pager = primed(be);
    expect(be.stats().liveBuffers).toBe(before.liveBuffers + 2 * (5 + 2));
    pass(pager);
    pager.dispose();
    expect(be.stats().liveBuffers).toBe(before.liveBuffers);
    expect(be.stats().liveBytes).toBe(before.liveBytes);
    pager.dispose();
  });
});

/**
 * The CPU backend presenting itself as a backend that computes in VRAM: the pager then takes a copy
 * stream of its own and orders loads against compute with events, as it does on a GPU.
 */
function vramLike(be: CpuBackend): { backend: DeviceBackend; created: StreamHandle[]; destroyed: StreamHandle[] } {
  const created: StreamHandle[] = [];
  const destroyed: StreamHandle[] = [];
  const capabilities = { ...be.capabilities, computeTier: 'vram' as Tier };
  const backend = new Proxy(be, {
    get(target, prop) {
      if (prop === 'capabilities') return capabilities;
      if (prop === 'createStream') {
        return () => {
          const s = target.createStream();
          created.push(s);
          return s;
        };
      }
      if (prop === 'destroyStream') {
        return (s: StreamHandle) => {
          target.destroyStream(s);
          destroyed.push(s);
        };
      }
      const v = Reflect.get(target, prop, target) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  }) as DeviceBackend;
  return { backend, created, destroyed };
}

describe('WeightPager on a backend with copy engines', () => {
  it('loads on a copy stream of its own, ordered by events: no host sync, and the stream goes with it', () => {
    const be = cpu();
    const { backend, created, destroyed } = vramLike(be);
    const plan = planOf();
    const pager = new WeightPager({ backend, plan, layout: LAYOUT, hostTier: 'pinned' });
    expect(created).toHaveLength(1);
    expect(pager.ring.slotTier).toBe('vram');
    storeAll(pager, plan);
    pager.prime();
    pass(pager, false);
    const before = be.stats().syncs;
    for (let p = 0; p < 3; p++) pass(pager, false);
    const after = be.stats().syncs;
    expect(after.hard).toBe(before.hard);
    // Per pass: every load waits for its slot's last reader, and compute waits for every load once.
    expect(after.soft_visibility - before.soft_visibility).toBe(3 * 2 * 5);
    // The data still arrive where they should.
    for (const id of plan.streamed) {
      const set = pager.acquire(id);
      expectHolds(be, set, id);
      pager.release(id);
    }
    pager.endPass();
    pager.dispose();
    expect(destroyed).toEqual(created);
  });

  it('waits on the host for disk reads into bounce buffers, and counts those waits', () => {
    const { dir, cleanup } = tempDir();
    cleanups.push(cleanup);
    const { backend } = vramLike(cpu());
    const plan = planOf({ hostBytes: 2 * BLOCK_BYTES, disk: true });
    const pager = new WeightPager({ backend, plan, layout: LAYOUT, hostTier: 'pinned', offloadDir: dir });
    cleanups.push(() => pager.dispose());
    storeAll(pager, plan);
    pager.prime();
    for (let p = 0; p < 2; p++) pass(pager);
    expect(pager.stats().hostWaits).toBe(2 * 3);
  });

  it('gives its copy stream back when construction fails', () => {
    const { backend, created, destroyed } = vramLike(cpu());
    const wide = [...LAYOUT, { name: 'extra', dtype: 'f32' as const, length: 1 }];
    expect(() => new WeightPager({ backend, plan: planOf(), layout: wide, hostTier: 'pinned' })).toThrow(PagerStateError);
    const disk = planOf({ hostBytes: 2 * BLOCK_BYTES, disk: true });
    expect(() => new WeightPager({ backend, plan: disk, layout: LAYOUT, hostTier: 'pinned' })).toThrow(PagerStateError);
    expect(created).toHaveLength(destroyed.length);
  });
});
