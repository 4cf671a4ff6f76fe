import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { OffloadDirError, WorkingSetTooLargeError } from '@nerva/memos';
import { afterAll, describe, expect, it } from 'vitest';
import { Engine } from '../src/index.js';
import { DEFAULT_MODEL, fixtureModels, MODELS, nonEmpty } from './fixtures.js';

const PROMPT = [1, 5, 9, 14, 3, 27, 8, 2, 11, 6, 19, 4];
// Small shapes keep the activations and the KV cache, and so the smallest budget, small.
const SHAPE = { backend: 'cpu' as const, maxNumSeqs: 4, maxNumBatchedTokens: 16, kvCacheBytes: 2 ** 20, importanceCache: false as const };

async function greedy(e: Engine, n = 12): Promise<number[]> {
  return (await e.submit(PROMPT, { temperature: 0, maxTokens: n, ignoreEos: true }).done).tokenIds;
}

/** The smallest VRAM budget the engine accepts for a model, read off the error a tiny one gives. */
async function minimumBudget(model: string, extra: { hostBudget?: number; offloadDir?: string; hostCompute?: number } = {}): Promise<number> {
  try {
    (await Engine.create({ model, ...SHAPE, ...extra, vramBudget: 2 ** 10 })).dispose();
  } catch (e) {
    expect(e).toBeInstanceOf(WorkingSetTooLargeError);
    return (e as WorkingSetTooLargeError).minimumBytes;
  }
  throw new Error('a 1 KiB budget was accepted');
}

const models = [DEFAULT_MODEL, ...fixtureModels().map((m) => join(MODELS, m))];

describe.each(models)('paged weights give the resident run\'s tokens: %s', (model) => {
  it('at the smallest budget (one staging slot), at two slots, and with a disk tier', async () => {
    const resident = await Engine.create({ model, ...SHAPE });
    const want = await greedy(resident);
    expect(resident.memoryReport().mode).toBe('resident');
    resident.dispose();

    const min = await minimumBudget(model);
    let slotBytes = 0;
    for (const [budget, slots] of [
      [min, 1],
      [min, 2], // one slot more than the minimum: two slots
    ] as const) {
      const e = await Engine.create({ model, ...SHAPE, vramBudget: budget + (slots - 1) * slotBytes });
      const r = e.memoryReport();
      if (slots === 1) {
        slotBytes = r.weights.slotBytes;
        expect(r.mode).toBe('paged');
        expect(r.weights.slots).toBe(1);
      } else if (r.mode === 'resident') {
        // A 2-layer model with tied embeddings: one slot more holds every layer.
        expect(r.weights.totalBytes).toBeLessThanOrEqual(budget + slotBytes);
        e.dispose();
        continue;
      } else expect(r.weights.slots).toBe(2);
      const out = await e.submit(PROMPT, { temperature: 0, maxTokens: 12, ignoreEos: true }).done;
      expect(out.tokenIds).toEqual(want);
      const s = out.ledger.summary();
      expect(s.hot_path_allocations).toBe(0);
      // Every streamed block is loaded once per forward pass: 12 passes (1 prefill + 11 decode).
      expect(s.prefetched_blocks).toBeCloseTo(12 * r.weights.streamedBlocks, 6);
      const after = e.memoryReport();
      expect(after.moved.h2d.bytes).toBeGreaterThanOrEqual(12 * r.weights.streamedBytes);
      expect(after.prefetch.stalls).toBe(0);
      e.dispose();
    }

    // A host budget of one and a half slots: the bounce buffers and no whole block; the rest spill to the offload
    // dir and are read back each pass.
    const dir = mkdtempSync(join(tmpdir(), 'nerva-offload-'));
    try {
      const disk = { hostBudget: Math.floor(1.5 * slotBytes), offloadDir: dir };
      const e = await Engine.create({ model, ...SHAPE, ...disk, vramBudget: await minimumBudget(model, disk) });
      const r = e.memoryReport();
      expect(r.weights.diskBlocks).toBeGreaterThan(0);
      // The spill file is unlinked once open (nothing stays after a crash).
      expect(readdirSync(dir)).toHaveLength(0);
      expect(await greedy(e)).toEqual(want);
      expect(e.memoryReport().moved.diskRead.bytes).toBeGreaterThan(0);
      e.dispose();
      expect(readdirSync(dir)).toHaveLength(0); // the spill file goes with the engine
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// Sparse (MoE) layers keep their experts whole: compute near data splits dense MLPs only.
const dense = nonEmpty(
  models.filter((m) => !('num_experts' in JSON.parse(readFileSync(join(m, 'config.json'), 'utf8')))),
  'dense models',
);

describe.each(dense)('compute near data (host MLP slices) gives the resident run\'s tokens: %s', (model) => {
  it('half of each streamed layer\'s MLP channels computed by op mlp_slice, the rest streamed', async () => {
    const resident = await Engine.create({ model, ...SHAPE });
    const want = await greedy(resident);
    resident.dispose();
    const split = { hostCompute: 0.5 };
    const e = await Engine.create({ model, ...SHAPE, ...split, vramBudget: await minimumBudget(model, split) });
    const r = e.memoryReport();
    expect(r.mode).toBe('paged');
    expect(r.notes.join('\n')).toMatch(/compute near data: the host computes \d+ of \d+ MLP channels/);
    const out = await e.submit(PROMPT, { temperature: 0, maxTokens: 12, ignoreEos: true }).done;
    expect(out.tokenIds).toEqual(want);
    expect(out.ledger.summary().hot_path_allocations).toBe(0);
    const after = e.memoryReport();
    // Decode passes compute the host slices near the data; the prefill pass read them in place.
    expect(after.moved.cpuCompute.bytes).toBeGreaterThan(0);
    e.dispose();
  });
});

describe('importance profile', () => {
  it('a paged start without a profile calibrates and saves one; the next start loads it and keeps the most important layers hot', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'nerva-importance-'));
    try {
      const opts = { model: DEFAULT_MODEL, ...SHAPE, importanceCache: dir };
      const min = await minimumBudget(DEFAULT_MODEL);
      const first = await Engine.create({ ...opts, vramBudget: min });
      const slot = first.memoryReport().weights.slotBytes;
      const want = await greedy(first);
      expect(first.notes.join('\n')).toMatch(/importance profile: calibrated on \d+ tokens, saved to/);
      first.dispose();
      const files = readdirSync(dir);
      expect(files).toHaveLength(1);
      const profile = JSON.parse(readFileSync(join(dir, files[0]), 'utf8')) as { layers: number[]; tokens: number };
      expect(profile.layers).toHaveLength(6);
      expect(profile.layers.every((v) => v > 0)).toBe(true);

      // Room for two hot layers beside two slots: the hot ones are the profile's top two.
      const second = await Engine.create({ ...opts, vramBudget: min + 3 * slot });
      expect(second.notes.join('\n')).toMatch(/importance profile: loaded from/);
      const r = second.memoryReport();
      const hot = [0, 1, 2, 3, 4, 5].filter((l) => !r.weights.streamedIds.includes(`layer.${l}`));
      expect(hot.length).toBeGreaterThan(0);
      const ranked = profile.layers.map((v, l) => [v, l] as const).sort((a, b) => b[0] - a[0] || a[1] - b[1]).map(([, l]) => l);
      expect(hot.sort()).toEqual(ranked.slice(0, hot.length).sort());
      // Placement changes time, never tokens.
      expect(await greedy(second)).toEqual(want);
      second.dispose();

      // A corrupt cache file is a miss with a reason, not an error.
      writeFileSync(join(dir, files[0]), '{ not json');
      const third = await Engine.create({ ...opts, vramBudget: min });
      expect(third.notes.join('\n')).toMatch(/is not JSON/);
      third.dispose();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('paged weights: bad input', () => {
  const dirs: string[] = [];
  afterAll(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  it('a budget below the minimum working set is one clear error naming the minimum', async () => {
    const min = await minimumBudget(DEFAULT_MODEL);
    const err = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE, vramBudget: min - 1 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(WorkingSetTooLargeError);
    expect((err as Error).message).toMatch(/cannot hold the minimum working set/);
    expect((err as WorkingSetTooLargeError).minimumBytes).toBe(min);
  });

  it('with the default KV cache, the smallest budget the error names is accepted (the cache shrinks first)', async () => {
    const { kvCacheBytes: _kv, ...noKv } = SHAPE;
    let min = 0;
    try {
      (await Engine.create({ model: DEFAULT_MODEL, ...noKv, vramBudget: 2 ** 20 })).dispose();
    } catch (e) {
      min = (e as WorkingSetTooLargeError).minimumBytes;
    }
    expect(min).toBeGreaterThan(2 ** 20);
    const e = await Engine.create({ model: DEFAULT_MODEL, ...noKv, vramBudget: min });
    expect(e.memoryReport().mode).toBe('paged');
    expect((await e.submit(PROMPT, { temperature: 0, maxTokens: 4, ignoreEos: true }).done).tokenIds).toHaveLength(4);
    e.dispose();
  });

  it('rejects malformed budgets before loading anything', async () => {
    for (const vramBudget of [0, -5, 1.5, Number.NaN]) {
      await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, vramBudget })).rejects.toThrow(/vramBudget must be a positive whole number/);
    }
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, hostBudget: -1 })).rejects.toThrow(/hostBudget/);
    for (const hostCompute of [0, 1, 'sometimes'] as const) {
      await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, hostCompute: hostCompute as never })).rejects.toThrow(/hostCompute must be/);
    }
  });

  it('an offload dir that is missing or a file is one clear error', async () => {
    const missing = join(tmpdir(), 'nerva-no-such-dir-' + process.pid);
    const e1 = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE, offloadDir: missing }).catch((e: unknown) => e);
    expect(e1).toBeInstanceOf(OffloadDirError);
    expect((e1 as Error).message).toContain(missing);
    const d = mkdtempSync(join(tmpdir(), 'nerva-file-'));
    dirs.push(d);
    const file = join(d, 'f');
    writeFileSync(file, 'x');
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, offloadDir: file })).rejects.toThrow(/is not a directory/);
  });

  it('a disk tier without an offload dir is refused, naming the host budget', async () => {
    const min = await minimumBudget(DEFAULT_MODEL);
    const err = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE, vramBudget: min, hostBudget: 1024 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(WorkingSetTooLargeError);
    expect((err as Error).message).toMatch(/no offload dir/);
  });
});
