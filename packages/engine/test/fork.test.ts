import { copyFile, mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, type GenerateOptions, InvalidParamsError, type RequestOutcome, type StepSignals } from '../src/index.js';
import { MODELS } from './fixtures.js';

const MODEL = join(MODELS, 'tiny-random-qwen3');
// 37 tokens over blocks of 16: two full blocks the forks share, and a partial one each copies.
const PROMPT = Array.from({ length: 37 }, (_, i) => 1 + ((i * 37 + 11) % 400));
const SAMPLED: GenerateOptions = { temperature: 0.9, topK: 50, topP: 0.95, seed: 40, maxTokens: 24, ignoreEos: true };

function expectAllFree(e: Engine): void {
  const s = e.kv.stats();
  expect(s.sequences).toBe(0);
  expect(s.freeBlocks).toBe(s.totalBlocks - 1);
  expect(s.sharedBlocks).toBe(0);
  e.kv.checkInvariants();
  expect(e.numRunning + e.numWaiting).toBe(0);
}

/** The same prompt and options as n separate requests, one after the other, seed + i each. */
async function separately(e: Engine, n: number, o: GenerateOptions, prompt: readonly number[] = PROMPT): Promise<RequestOutcome[]> {
  const out: RequestOutcome[] = [];
  for (let i = 0; i < n; i++) out.push(await e.submit(prompt, { ...o, seed: (o.seed ?? 0) + i }).done);
  return out;
}

/** Step signals and KV usage while `fn` runs. */
async function watch<T>(e: Engine, fn: () => Promise<T>): Promise<{ result: T; steps: StepSignals[]; maxUsed: number; maxShared: number; maxRunning: number }> {
  const steps: StepSignals[] = [];
  let maxUsed = 0;
  let maxShared = 0;
  let maxRunning = 0;
  const off = e.onStep((s) => {
    steps.push(s);
    const k = e.kv.stats();
    maxUsed = Math.max(maxUsed, k.usedBlocks - 1);
    maxShared = Math.max(maxShared, k.sharedBlocks);
    maxRunning = Math.max(maxRunning, s.running);
  });
  try {
    return { result: await fn(), steps, maxUsed, maxShared, maxRunning };
  } finally {
    off();
  }
}

describe('Engine.submitFork: shared-prefix forks (CPU, tiny-random-qwen3)', () => {
  let e: Engine;
  beforeAll(async () => {
    // Prefix caching off: every block the forks share is shared by the fork, not found in the cache.
    e = await Engine.create({ model: MODEL, backend: 'cpu', maxNumSeqs: 8, enablePrefixCaching: false });
  });
  afterAll(() => e?.dispose());

  it('sampled forks equal separate runs with seed + i, prefill once, and share the prompt blocks', async () => {
    const n = 5;
    const want = await separately(e, n, SAMPLED);
    const w = await watch(e, () => Promise.all(e.submitFork(PROMPT, n, SAMPLED).map((h) => h.done)));
    const got = w.result;
    for (let i = 0; i < n; i++) {
      expect(got[i].tokenIds, `fork ${i}`).toEqual(want[i].tokenIds);
      expect(got[i].finishReason).toBe('length');
      expect(got[i].promptIds).toEqual(PROMPT);
    }
    // Different seeds: really n samples.
    expect(new Set(got.map((o) => o.tokenIds.join(','))).size).toBeGreaterThan(1);
    // The prompt's 37 tokens were computed in one step, once (not once per fork).
    expect(w.steps.reduce((a, s) => a + s.promptTokens, 0)).toBe(PROMPT.length);
    // The first step samples n rows from the one prefill; then the n forks decode together.
    expect(w.steps[0].generationTokens).toBe(n);
    expect(w.steps.slice(1).every((s) => s.scheduledTokens === n && s.generationTokens === n)).toBe(true);
    expect(w.steps.length).toBe(SAMPLED.maxTokens);
    // The two full prompt blocks are held once: 2 + 5 x 2 private blocks (61 tokens = 4 blocks each),
    // where 5 separate copies would hold 5 x 4.
    expect(w.maxShared).toBe(2);
    expect(w.maxUsed).toBe(2 + n * 2);
    // Every decode step's tables read the 2 shared blocks from all 5 forks: 4 reads beyond the first each.
    expect(w.steps.slice(1).every((s) => s.sharedBlocks === 2 && s.sharedBlockReads === 2 * (n - 1))).toBe(true);
    for (const o of got) expect(o.ledger.summary().hot_path_allocations).toBe(0);
    expectAllFree(e);
  });

  it('greedy forks are one sequence n times, equal to a greedy submit', async () => {
    const o = { temperature: 0, maxTokens: 16, ignoreEos: true };
    const want = await e.submit(PROMPT, o).done;
    const got = await Promise.all(e.submitFork(PROMPT, 3, o).map((h) => h.done));
    for (const g of got) expect(g.tokenIds).toEqual(want.tokenIds);
    expectAllFree(e);
  });

  it('host sampling (penalties, logprobs) gives each fork its own history', async () => {
    const o: GenerateOptions = { ...SAMPLED, repetitionPenalty: 1.3, frequencyPenalty: 0.5, logprobs: true, topLogprobs: 2, maxTokens: 12 };
    const want = await separately(e, 3, o);
    const hs = e.submitFork(PROMPT, 3, o);
    const events = await Promise.all(
      hs.map(async (h) => {
        const evs = [];
        for await (const ev of h.events) evs.push(ev);
        return evs;
      }),
    );
    const got = await Promise.all(hs.map((h) => h.done));
    for (let i = 0; i < 3; i++) {
      expect(got[i].tokenIds).toEqual(want[i].tokenIds);
      expect(events[i].map((ev) => ev.token)).toEqual(want[i].tokenIds);
      expect(events[i].every((ev) => ev.requestId === hs[i].id && ev.topLogprobs?.length === 2)).toBe(true);
    }
    expectAllFree(e);
  });

  it('aborting one fork mid-decode leaves the others intact; its blocks return', async () => {
    const n = 4;
    const want = await separately(e, n, SAMPLED);
    const hs = e.submitFork(PROMPT, n, SAMPLED);
    let seen = 0;
    for await (const ev of hs[1].events) {
      if (++seen === 5) {
        expect(ev.index).toBe(4);
        break; // ends the iteration: aborts fork 1
      }
    }
    const got = await Promise.all(hs.map((h) => h.done));
    expect(got[1].finishReason).toBe('abort');
    expect(got[1].tokenIds).toEqual(want[1].tokenIds.slice(0, got[1].tokenIds.length));
    for (const i of [0, 2, 3]) expect(got[i].tokenIds).toEqual(want[i].tokenIds);
    expectAllFree(e);
  });

  it('forks aborted before the prompt is prefilled: the rest still fork; all aborted frees everything', async () => {
    const want = await separately(e, 3, SAMPLED);
    const hs = e.submitFork(PROMPT, 3, SAMPLED);
    hs[0].abort();
    const got = await Promise.all(hs.map((h) => h.done));
    expect(got[0].finishReason).toBe('abort');
    expect(got[0].tokenIds).toEqual([]);
    expect(got[1].tokenIds).toEqual(want[1].tokenIds);
    expect(got[2].tokenIds).toEqual(want[2].tokenIds);
    expectAllFree(e);

    const all = e.submitFork(PROMPT, 4, SAMPLED);
    expect(e.numWaiting).toBe(1); // one prompt request for the four
    for (const h of all) h.abort();
    expect(e.numWaiting).toBe(0);
    for (const o of await Promise.all(all.map((h) => h.done))) expect(o.finishReason).toBe('abort');
    await e.idle();
    expectAllFree(e);

    const ac = new AbortController();
    const sig = e.submitFork(PROMPT, 3, { ...SAMPLED, signal: ac.signal });
    ac.abort(new Error('stop'));
    for (const o of await Promise.all(sig.map((h) => h.done))) expect(o.finishReason).toBe('abort');
    await e.idle();
    expectAllFree(e);
  });

  it('a prompt as long as n: the fork step is not mistaken for a batch of decode rows', async () => {
    // 3 prompt rows and 3 sampled rows: rows === logit rows, yet one sequence with 3 rows.
    for (const [len, n] of [[3, 3], [1, 2], [2, 2]]) {
      const want = await separately(e, n, SAMPLED, PROMPT.slice(0, len));
      const got = await Promise.all(e.submitFork(PROMPT.slice(0, len), n, SAMPLED).map((h) => h.done));
      for (let i = 0; i < n; i++) expect(got[i].tokenIds, `prompt ${len}, fork ${i}`).toEqual(want[i].tokenIds);
    }
    expectAllFree(e);
  });

  it('n = 1 is a plain submit', async () => {
    const want = await e.submit(PROMPT, SAMPLED).done;
    const hs = e.submitFork(PROMPT, 1, SAMPLED);
    expect(hs).toHaveLength(1);
    const got = await hs[0].done;
    expect(got.tokenIds).toEqual(want.tokenIds);
    expectAllFree(e);
  });

  it('a bad n (or n > 1 with forced tokens) is an InvalidParamsError naming n, and changes nothing', async () => {
    const before = e.kv.stats();
    for (const n of [0, -1, 1.5, Number.NaN, 9, '2' as unknown as number]) {
      expect(() => e.submitFork(PROMPT, n, SAMPLED), String(n)).toThrow(InvalidParamsError);
      expect(() => e.submitFork(PROMPT, n, SAMPLED)).toThrow(/^n: must be an integer in \[1, 8\]/);
    }
    expect(() => e.submitFork(PROMPT, 2, { ...SAMPLED, forceTokens: [1, 2] })).toThrow(/^n: forced tokens/);
    // The request's own fields are checked as for submit.
    expect(() => e.submitFork(PROMPT, 2, { ...SAMPLED, temperature: -1 })).toThrow(/^temperature:/);
    expect(() => e.submitFork([], 2, SAMPLED)).toThrow(/^prompt:/);
    expect(e.limits.maxForks).toBe(8);
    expect(e.numWaiting + e.numRunning).toBe(0);
    expect(e.kv.stats()).toEqual(before);
    // Still serves.
    expect((await Promise.all(e.submitFork(PROMPT, 2, { ...SAMPLED, maxTokens: 2 }).map((h) => h.done))).map((o) => o.tokenIds.length)).toEqual([2, 2]);
  });

  it('forks wait for n free seats, and run beside other requests with their tokens unchanged', async () => {
    const other = { ...SAMPLED, seed: 900, maxTokens: 30 };
    const wantOther = await separately(e, 5, other, PROMPT.slice(0, 20));
    const wantForks = await separately(e, 6, SAMPLED);
    // Five running requests leave 3 of 8 seats: the 6 forks wait until enough of them finish.
    const others = Array.from({ length: 5 }, (_, i) => e.submit(PROMPT.slice(0, 20), { ...other, seed: 900 + i, maxTokens: 30 - i }));
    const w = await watch(e, async () => {
      const forks = e.submitFork(PROMPT, 6, SAMPLED);
      return Promise.all([...others, ...forks].map((h) => h.done));
    });
    const outs = w.result;
    for (let i = 0; i < 5; i++) expect(outs[i].tokenIds).toEqual(wantOther[i].tokenIds.slice(0, 30 - i));
    for (let i = 0; i < 6; i++) expect(outs[5 + i].tokenIds).toEqual(wantForks[i].tokenIds);
    expect(w.maxRunning).toBeLessThanOrEqual(8);
    // The prompt of the forks waited (5 running) rather than taking 6 of the 3 free seats.
    expect(w.steps.some((s) => s.running === 5 && s.waiting === 1)).toBe(true);
    expectAllFree(e);
  });
});

describe('Engine.submitFork under memory pressure and other layouts', () => {
  const blockBytes = (e: Engine) => 2 * e.spec.numLayers * e.spec.numKvHeads * e.spec.headDim * 4 * e.kv.blockSize;

  it('without a free block for every copy, and with preemption, the tokens are still those of separate runs', async () => {
    const probe = await Engine.create({ model: MODEL, backend: 'cpu', maxNumSeqs: 8 });
    const want = await separately(probe, 4, { ...SAMPLED, maxTokens: 40 });
    const bb = blockBytes(probe);
    probe.dispose();
    for (const enablePrefixCaching of [true, false]) {
      // 6 usable blocks: the prompt holds 3, so only 3 of 4 forks get a block for their copy at
      // once (the fourth is recomputed), and growing to 77 tokens (5 blocks each) preempts.
      const e = await Engine.create({ model: MODEL, backend: 'cpu', maxNumSeqs: 8, kvCacheBytes: 7 * bb, enablePrefixCaching });
      expect(e.kv.stats().totalBlocks).toBe(7);
      const w = await watch(e, () => Promise.all(e.submitFork(PROMPT, 4, { ...SAMPLED, maxTokens: 40 }).map((h) => h.done)));
      for (let i = 0; i < 4; i++) expect(w.result[i].tokenIds, `fork ${i}, prefix caching ${enablePrefixCaching}`).toEqual(want[i].tokenIds);
      // Right after the fork, one fork waits for blocks.
      expect(w.steps[0].running).toBe(3);
      expect(w.steps[0].waiting).toBe(1);
      expect(w.steps[w.steps.length - 1].preemptions).toBeGreaterThan(0);
      expectAllFree(e);
      e.dispose();
    }
  });

  it.each([
    ['shared backend', {}],
    ['2 micro-batches', { pipelineMicroBatches: 2 }],
  ])('pipeline stages copy the partial block in every stage (%s)', async (_, extra) => {
    const e = await Engine.create({ model: MODEL, backend: 'cpu', maxNumSeqs: 8, pipelineParallel: 2, ...extra });
    const want = await separately(e, 3, SAMPLED);
    // Beside another request, so the fork's sampled rows share a pass with another sequence's.
    const other = e.submit(PROMPT.slice(0, 9), { ...SAMPLED, seed: 77 });
    const got = await Promise.all(e.submitFork(PROMPT, 3, SAMPLED).map((h) => h.done));
    await other.done;
    for (let i = 0; i < 3; i++) expect(got[i].tokenIds).toEqual(want[i].tokenIds);
    expectAllFree(e);
    e.dispose();
  });

  it('sliding window in every layer: pages released before the fork stay released in every fork', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'nerva-fork-swa-'));
    const config = JSON.parse(await readFile(join(MODEL, 'config.json'), 'utf8')) as Record<string, unknown>;
    await writeFile(join(dir, 'config.json'), JSON.stringify({ ...config, use_sliding_window: true, sliding_window: 8, max_window_layers: 0 }));
    await copyFile(join(MODEL, 'model.safetensors'), join(dir, 'model.safetensors'));
    // Chunks of 16: before the last prompt chunk (from 32) the pages wholly below 25 go back.
    const e = await Engine.create({ model: dir, backend: 'cpu', maxNumSeqs: 8, blockSize: 4, maxNumBatchedTokens: 16 });
    expect(e.maxNumBatchedTokens).toBe(16);
    const want = await separately(e, 3, SAMPLED);
    const w = await watch(e, () => Promise.all(e.submitFork(PROMPT, 3, SAMPLED).map((h) => h.done)));
    for (let i = 0; i < 3; i++) expect(w.result[i].tokenIds).toEqual(want[i].tokenIds);
    // Each fork holds about window / blockSize + 1 pages, never the whole sequence's 16.
    expect(w.maxUsed).toBeLessThanOrEqual(3 * 4 + 3);
    expectAllFree(e);
    e.dispose();
  });

  it('tiered KV: the forks share the full pages and recompute the partial one', async () => {
    const base = await Engine.create({ model: MODEL, backend: 'cpu', maxNumSeqs: 8, blockSize: 4 });
    const want = await separately(base, 3, { ...SAMPLED, maxTokens: 12 });
    const pb = blockBytes(base);
    base.dispose();
    const e = await Engine.create({ model: MODEL, backend: 'cpu', maxNumSeqs: 8, blockSize: 4, kvVramBudget: 12 * pb, importanceCache: false });
    const w = await watch(e, () => Promise.all(e.submitFork(PROMPT, 3, { ...SAMPLED, maxTokens: 12 }).map((h) => h.done)));
    for (let i = 0; i < 3; i++) expect(w.result[i].tokenIds).toEqual(want[i].tokenIds);
    // 37 tokens in pages of 4: 9 full pages shared, the 1-token tail recomputed with each fork's first token.
    expect(w.maxShared).toBe(9);
    expect(w.steps.reduce((a, s) => a + s.promptTokens, 0)).toBe(PROMPT.length + 3);
    expectAllFree(e);
    e.dispose();
  });

  it('tiered KV with every warm page staged (kvWarmLinkShare 1): the forks\' tokens, shared warm pages staged once a step', async () => {
    const base = await Engine.create({ model: MODEL, backend: 'cpu', maxNumSeqs: 8, blockSize: 4 });
    const want = await separately(base, 3, { ...SAMPLED, maxTokens: 12 });
    const pb = blockBytes(base);
    base.dispose();
    // 6 hot pages: most of the 9 shared prompt pages are warm, read by all three forks each step.
    const e = await Engine.create({ model: MODEL, backend: 'cpu', maxNumSeqs: 8, blockSize: 4, kvVramBudget: 6 * pb, kvHostBudget: 12 * pb, kvWarmLinkShare: 1, importanceCache: false });
    const w = await watch(e, () => Promise.all(e.submitFork(PROMPT, 3, { ...SAMPLED, maxTokens: 12 }).map((h) => h.done)));
    for (let i = 0; i < 3; i++) expect(w.result[i].tokenIds).toEqual(want[i].tokenIds);
    const kv = e.memoryReport().kv!;
    expect(kv.tieredPasses).toBeGreaterThan(0);
    // Staged pages never exceed the warm pages in use: a page the forks share is gathered once, not three times.
    const staged = kv.staging!.stagedBytes / kv.pageBytes;
    expect(staged).toBeGreaterThan(0);
    expect(staged).toBeLessThanOrEqual(kv.tieredPasses * kv.tiers.warm.capacity);
    expect(kv.staging!.capacityPages).toBe(kv.tiers.warm.capacity);
    expectAllFree(e);
    e.dispose();
  });
});
