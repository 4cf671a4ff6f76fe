import { chmodSync, chownSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { OffloadDirError } from '@nerva/memos';
import { afterAll, describe, expect, it } from 'vitest';
import { Engine } from '../src/index.js';
import type { DeviceBackend, DeviceBuffer } from '@nerva/core';
import { createCpuBackend } from '@nerva/cpu-backend';
import { KvBudgetError, planKvTiers, stageSpan } from '../src/kv-tiering.js';
import { DEFAULT_MODEL, fixtureModels, MODELS } from './fixtures.js';
import { recordingBackend } from './recording-backend.js';
import { asNobody, ENGINE_DIST, NOBODY } from './unprivileged.js';

// A long prompt (for these models) over small pages: many pages per sequence, most of them warm
// once the hot pool holds only the sinks and the recent window.
const PROMPT = Array.from({ length: 61 }, (_, i) => 1 + ((i * 37 + 11) % 97));
const BS = 4;
const SHAPE = { backend: 'cpu' as const, maxNumSeqs: 8, maxNumBatchedTokens: 32, blockSize: BS, importanceCache: false as const };
const pageBytes = (e: Engine) => 2 * e.spec.numLayers * e.spec.numKvHeads * e.spec.headDim * 4 * BS;

const models = [DEFAULT_MODEL, ...fixtureModels().map((m) => join(MODELS, m))];

async function run(e: Engine, prompt = PROMPT, n = 16) {
  return e.submit(prompt, { temperature: 0, maxTokens: n, ignoreEos: true, returnPromptLogits: true }).done;
}

/** Last prompt position: within 1e-5 of max |logit| (float rounding of a split softmax sum). */
function expectLogitsClose(got: ArrayLike<number>, ref: ArrayLike<number>): void {
  let max = 0;
  let worst = 0;
  for (let i = 0; i < ref.length; i++) {
    max = Math.max(max, Math.abs(ref[i]));
    worst = Math.max(worst, Math.abs(got[i] - ref[i]));
  }
  expect(got.length).toBe(ref.length);
  expect(worst).toBeLessThanOrEqual(1e-5 * max);
}

describe.each(models)('tiered KV gives the all-hot run\'s tokens and logits: %s', (model) => {
  it('with a hot pool of the sinks and the window, the rest warm (host partials merged)', async () => {
    const hot = await Engine.create({ model, ...SHAPE });
    const want = await run(hot);
    const pb = pageBytes(hot);
    hot.dispose();

    // 5 hot pages (the smallest: null, sink, window of 2, the page being written).
    const e = await Engine.create({ model, ...SHAPE, kvVramBudget: 5 * pb });
    const got = await run(e);
    expect(got.tokenIds).toEqual(want.tokenIds);
    expectLogitsClose(got.promptLogits!, want.promptLogits!);
    const r = e.memoryReport().kv!;
    expect(r.tiers.hot.capacity).toBe(4);
    expect(r.demotions).toBeGreaterThan(0);
    expect(r.tieredPasses).toBeGreaterThan(0);
    expect(r.moved.d2h.bytes).toBe(r.demotions * pb);
    // The CPU backend computes in host memory: no link, so no staging by default.
    expect(r.staging).toBeUndefined();
    expect(got.ledger.summary().hot_path_allocations).toBe(0);
    // Every page comes back once the request is done.
    expect(r.tiers.hot.used + r.tiers.warm.used).toBeLessThanOrEqual(Math.ceil((PROMPT.length + 16) / BS));
    e.dispose();
  });
});

describe('kvWarmLinkShare: the device attends over a share of the warm pages itself (three partials)', () => {
  it('defaults the share by the staging a quarter of the hot budget holds (with a link), the option first', () => {
    const pb = 64 * 36; // a page of every layer's K and V: 36 layers of 64 bytes
    const link = { numLayers: 36 };
    // 10 hot pages, warm pool 8x: staging of all 80 warm pages is 2 * 80 * 64 bytes, 1.1x the
    // budget; a quarter of it holds floor(0.25 * 10 * 36 / 2) = 45 pages.
    const d = planKvTiers({ kvVramBudget: 10 * pb }, pb, link);
    expect(d.warmSlots).toBe(80);
    expect(d.linkPages).toBe(45);
    expect(d.linkShare).toBe(45 / 80);
    // The staging stays within a quarter of the budget.
    expect(4 * d.linkPages * (pb / (2 * 36))).toBeLessThanOrEqual(0.25 * 10 * pb);
    // A warm pool the staging holds whole: share 1, every warm page staged.
    const w = planKvTiers({ kvVramBudget: 10 * pb, kvHostBudget: 40 * pb }, pb, link);
    expect(w).toMatchObject({ warmSlots: 40, linkPages: 40, linkShare: 1 });
    // No link (compute in host memory): the host takes every warm page.
    expect(planKvTiers({ kvVramBudget: 10 * pb }, pb)).toMatchObject({ linkShare: 0, linkPages: 0 });
    // The option wins, uncapped.
    expect(planKvTiers({ kvVramBudget: 10 * pb, kvWarmLinkShare: 1 }, pb, link)).toMatchObject({ linkShare: 1, linkPages: 80 });
    expect(planKvTiers({ kvVramBudget: 10 * pb, kvWarmLinkShare: 0.3 }, pb, link)).toMatchObject({ linkShare: 0.3, linkPages: 24 });
    expect(planKvTiers({ kvVramBudget: 10 * pb, kvWarmLinkShare: 0 }, pb, link)).toMatchObject({ linkShare: 0, linkPages: 0 });
  });

  it('stages the leading warm slots up to the highest one read, in eighths of the staging', () => {
    expect(stageSpan(0, 16)).toBe(0);
    expect(stageSpan(5, 0)).toBe(0);
    expect(stageSpan(1, 16)).toBe(2);
    expect(stageSpan(3, 16)).toBe(4);
    expect(stageSpan(4, 16)).toBe(4);
    expect(stageSpan(16, 16)).toBe(16);
    // Rounded up, never past the staging's pages.
    expect(stageSpan(15, 17)).toBe(15);
    expect(stageSpan(16, 17)).toBe(17);
    expect(stageSpan(1, 1)).toBe(1);
    // At most 8 distinct spans for any staging size.
    for (const lp of [1, 7, 64, 197]) expect(new Set(Array.from({ length: lp }, (_, i) => stageSpan(i + 1, lp))).size).toBeLessThanOrEqual(8);
  });

  // Share 0.1 (4 of the 40 warm slots staged): the warm pages soon pass the link's slots, so later
  // passes add a host partial. 0.75 (30 slots) and 1: every warm page is staged, so no pass has one.
  it.each([0.1, 0.75, 1])('share %s: the all-hot run\'s tokens and logits, with the partials it promises', async (share) => {
    const hot = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE });
    const want = await run(hot);
    const pb = pageBytes(hot);
    hot.dispose();
    const { backend, calls, copies } = recordingBackend();
    const e = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE, backend, kvVramBudget: 5 * pb, kvWarmLinkShare: share });
    try {
      const got = await run(e);
      expect(got.tokenIds).toEqual(want.tokenIds);
      // Three partials instead of two: still float rounding of a split softmax sum.
      expectLogitsClose(got.promptLogits!, want.promptLogits!);
      const kv = e.memoryReport().kv!;
      expect(kv.tieredPasses).toBeGreaterThan(0);
      // The staging: that share of the warm pool per layer, two buffers of K and V, pages staged each step.
      expect(kv.staging!.share).toBe(share);
      expect(kv.staging!.capacityPages).toBe(Math.ceil(share * kv.tiers.warm.capacity));
      const layerPage = kv.pageBytes / (2 * e.spec.numLayers);
      expect(kv.staging!.bytes).toBe(4 * kv.staging!.capacityPages * layerPage);
      expect(kv.staging!.stagedBytes).toBeGreaterThan(0);
      expect(kv.staging!.stagedBytes % kv.pageBytes).toBe(0);
      // Partials over the warm pool (the host's share, with host staging) and over the pages
      // staged into VRAM (the link's share), each layer staged by two copies (K and V) of the
      // pool's leading slots, never more than the staging holds.
      const over = (prefix: string) => calls.filter((c) => c.op === 'attention' && (c.args.kCache as DeviceBuffer).label?.startsWith(prefix));
      const host = over('kv.warm.').length;
      const link = over('kv.stage.').length;
      expect(over('kv.warm.').every((c) => c.args.qHost !== undefined)).toBe(true);
      const staging = copies.filter((c) => c.src.label?.startsWith('kv.warm.') && c.dst.label?.startsWith('kv.stage.'));
      expect(staging.length).toBe(2 * link);
      const pageElems = layerPage / 4;
      for (const c of staging) {
        expect(c.srcOffset).toBe(0);
        expect(c.dstOffset).toBe(0);
        expect(c.length % pageElems).toBe(0);
        expect(c.length / pageElems).toBeLessThanOrEqual(kv.staging!.capacityPages);
      }
      expect(calls.some((c) => c.op === 'gather_rows' && (c.args.x as DeviceBuffer).label?.startsWith('kv.warm.'))).toBe(false);
      const merges = calls.filter((c) => c.op === 'attention_merge').length;
      expect(link).toBeGreaterThan(0);
      // A host partial only in passes whose tables give the host a warm page (past the link's
      // slots): none while the staging holds them all, one beside each link partial after.
      const warmUsed = kv.tiers.warm.used;
      expect(warmUsed).toBeGreaterThan(4);
      expect(warmUsed).toBeLessThanOrEqual(30);
      if (share === 0.1) {
        expect(host).toBeGreaterThan(0);
        expect(host).toBeLessThan(link);
        expect(host % e.spec.numLayers).toBe(0);
      } else expect(host).toBe(0);
      expect(merges).toBe(link + host);
    } finally {
      e.dispose();
      backend.dispose();
    }
  });

  it('refuses a share outside 0..1 or without kvVramBudget', async () => {
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, kvVramBudget: 1 << 20, kvWarmLinkShare: 1.5 })).rejects.toThrow(/kvWarmLinkShare must be a number from 0 to 1, got 1.5/);
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, kvVramBudget: 1 << 20, kvWarmLinkShare: Number.NaN })).rejects.toThrow(/kvWarmLinkShare must be a number/);
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, kvWarmLinkShare: 0.5 })).rejects.toThrow(/^kvWarmLinkShare needs kvVramBudget/);
  });
});

describe('host time over warm pages: in the KV report and each token\'s ledger', () => {
  it('a backend that measures its host attention apart (as the CUDA one) gets hostAttentionMs and cpuActiveMs', async () => {
    // The CPU backend whose stats report 0.5 ms of host compute per host partial (the attention
    // call over the warm pool, which carries the pinned q/out staging), split by op as the CUDA
    // backend's native counters are.
    const inner = createCpuBackend();
    let hostCalls = 0;
    const backend = new Proxy(inner, {
      get(target, prop, recv) {
        if (prop === 'run')
          return (op: string, args: Record<string, unknown>, stream?: unknown) => {
            if (op === 'attention' && args.qHost !== undefined) hostCalls++;
            return (target.run as (o: string, a: unknown, s?: unknown) => void)(op, args, stream);
          };
        if (prop === 'stats') return () => ({ ...target.stats(), hostComputeMs: 0.5 * hostCalls, hostComputeMsByOp: { mlp_slice: 0, attention: 0.5 * hostCalls } });
        const v = Reflect.get(target, prop, recv) as unknown;
        return typeof v === 'function' ? (v as (...x: unknown[]) => unknown).bind(target) : v;
      },
    }) as DeviceBackend;
    const probe = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE });
    const pb = pageBytes(probe);
    probe.dispose();
    const e = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE, backend, kvVramBudget: 5 * pb });
    try {
      // The ledger explains the steps that produce tokens (prompt chunks before the last sample
      // nothing): the host calls of those steps.
      let seen = 0;
      let inTokenSteps = 0;
      const off = e.onStep((sig) => {
        if (sig.generationTokens > 0) inTokenSteps += hostCalls - seen;
        seen = hostCalls;
      });
      const got = await run(e);
      off();
      expect(hostCalls).toBeGreaterThan(0);
      expect(inTokenSteps).toBeGreaterThan(0);
      const r = e.memoryReport();
      expect(r.kv!.hostAttentionMs).toBe(0.5 * hostCalls);
      // The host MLP's time alone under the weights' cpu_compute path (none here).
      expect(r.moved.cpuCompute.ms).toBe(0);
      // The tokens' shares add up to the host time of the steps that sampled them.
      const s = got.ledger.summary();
      expect(s.cpu_active_ms_total).toBeCloseTo(0.5 * inTokenSteps, 2);
      expect(got.ledger.all().every((rec) => rec.cpuActiveMs !== undefined && rec.cpuActiveMs >= 0)).toBe(true);
    } finally {
      e.dispose();
      inner.dispose();
    }
    // The plain CPU backend does not measure host compute apart: neither appears.
    const plain = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE, kvVramBudget: 5 * pb });
    try {
      const out = await run(plain, PROMPT, 4);
      expect(plain.memoryReport().kv!.hostAttentionMs).toBeUndefined();
      expect(out.ledger.summary().cpu_active_ms_total).toBeUndefined();
    } finally {
      plain.dispose();
    }
  });
});

describe('tiered KV under load', () => {
  // Also with a link share: the device's slots and the host's interleave across 64 sequences
  // whose pages are freed, reused and shared by the prefix cache.
  it.each([undefined, 0.5])('64 concurrent streams with a tiny hot pool (link share %s): outputs equal the unconstrained run, nothing lost or duplicated, every page returned', async (share) => {
    const prompts = Array.from({ length: 64 }, (_, k) => Array.from({ length: 9 + (k % 13) }, (_, i) => 1 + ((k * 131 + i * 17) % 300)));
    const opts = (i: number) => ({ temperature: i % 3 === 0 ? 0 : 0.8, seed: 1000 + i, maxTokens: 6 + (i % 7), ignoreEos: true });
    const base = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE, maxNumSeqs: 16 });
    const want = await Promise.all(prompts.map((p, i) => base.submit(p, opts(i)).done));
    const pb = pageBytes(base);
    base.dispose();

    const e = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE, maxNumSeqs: 16, kvVramBudget: 8 * pb, kvHostBudget: 24 * pb, kvWarmLinkShare: share });
    const seen = new Map<number, number>();
    const handles = prompts.map((p, i) => e.submit(p, opts(i)));
    const got = await Promise.all(
      handles.map(async (h, i) => {
        let n = 0;
        for await (const t of h.events) {
          expect(t.index).toBe(n++);
          seen.set(i, n);
        }
        return h.done;
      }),
    );
    for (let i = 0; i < prompts.length; i++) {
      expect(got[i].tokenIds).toEqual(want[i].tokenIds);
      expect(seen.get(i)).toBe(want[i].tokenIds.length);
    }
    const r = e.memoryReport().kv!;
    expect(r.demotions).toBeGreaterThan(0);
    if (share) expect(r.staging!.stagedBytes).toBeGreaterThan(0);
    else expect(r.staging).toBeUndefined();
    // Every page is back: only the prefix cache may hold pages, and none is held.
    expect(e.kv.stats().usedBlocks).toBe(1);
    expect(r.tiers.hot.used + r.tiers.warm.used + r.tiers.cold.used).toBeLessThanOrEqual(e.kv.stats().cachedBlocks);
    e.dispose();
  });
});

describe('cold KV pages', () => {
  const dirs: string[] = [];
  afterAll(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  it('spill cached pages to the offload dir and bring them back for a prefix hit, with the same tokens', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'nerva-kv-'));
    dirs.push(dir);
    const probe = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE });
    const pb = pageBytes(probe);
    const want = await run(probe);
    probe.dispose();
    const e = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE, kvVramBudget: 6 * pb, kvHostBudget: 18 * pb, kvOffloadDir: dir });
    // The cold file is created exclusively, private, and unlinked once open: nothing stays after a crash.
    expect(readdirSync(dir)).toHaveLength(0);
    expect((await run(e)).tokenIds).toEqual(want.tokenIds);
    // Unrelated work pushes the first prompt's cached pages down to disk.
    for (let k = 0; k < 3; k++) await run(e, PROMPT.map((t) => (t * (k + 3)) % 500), 4);
    const mid = e.memoryReport().kv!;
    expect(mid.moved.diskWrite.bytes).toBeGreaterThan(0);
    // The first prompt again: a prefix hit on pages that come back from disk, and the same tokens.
    const again = await run(e);
    expect(again.tokenIds).toEqual(want.tokenIds);
    expect(e.memoryReport().kv!.moved.diskRead.bytes).toBeGreaterThan(0);
    expect(again.ledger.summary().hot_path_allocations).toBe(0);
    e.dispose();
    expect(readdirSync(dir)).toHaveLength(0);
  });

  it('bad budgets and directories are one clear error before anything runs', async () => {
    const probe = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE });
    const pb = pageBytes(probe);
    probe.dispose();
    const err = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE, kvVramBudget: 2 * pb }).catch((x: unknown) => x);
    expect(err).toBeInstanceOf(KvBudgetError);
    expect(String((err as Error).message)).toContain(`use at least ${5 * pb} bytes`);
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, kvVramBudget: 8 * pb, kvOffloadDir: '/nonexistent/nerva-kv' })).rejects.toBeInstanceOf(OffloadDirError);
    const file = mkdtempSync(join(tmpdir(), 'nerva-kv-ro-'));
    dirs.push(file);
    chmodSync(file, 0o500);
    if (process.getuid?.() !== 0) {
      await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, kvVramBudget: 8 * pb, kvOffloadDir: file })).rejects.toBeInstanceOf(OffloadDirError);
    } else {
      // Root writes whatever the mode says: the same create runs as nobody, who owns the folder
      // (so that only the missing write bit stops it).
      chownSync(file, NOBODY, NOBODY);
      const opts = { model: DEFAULT_MODEL, ...SHAPE, kvVramBudget: 8 * pb, kvOffloadDir: file };
      const got = asNobody(`
        import { Engine } from ${JSON.stringify(ENGINE_DIST.href)};
        const r = await Engine.create(${JSON.stringify(opts)}).then(
          (e) => (e.dispose(), { created: true }),
          (e) => ({ name: e.name, code: e.code, message: e.message }),
        );
        console.log(JSON.stringify(r));`);
      expect(got).toMatchObject({ name: 'OffloadDirError', code: 'OFFLOAD_DIR', message: expect.stringContaining(`${file}: is not readable and writable (EACCES)`) });
    }
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, kvHostBudget: 8 * pb })).rejects.toThrow(/^kvHostBudget needs kvVramBudget/);
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, kvHostBudget: 8 * pb, kvOffloadDir: '/tmp' })).rejects.toThrow(/^kvHostBudget and kvOffloadDir need kvVramBudget \(the hot KV pool they extend\)$/);
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, kvVramBudget: 8 * pb, numerics: 'bf16' })).rejects.toThrow(/needs numerics 'exact'/);
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, kvVramBudget: -1 })).rejects.toThrow(/kvVramBudget must be a positive whole number/);
  });
});
