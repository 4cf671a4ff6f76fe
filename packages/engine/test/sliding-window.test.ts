import { readFileSync } from 'node:fs';
import { copyFile, mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SafetensorsFile } from '@nerva/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, type EngineOptions, type RequestOutcome } from '../src/index.js';
import { LOCAL_MODELS, localFixtureModels, MODELS, nonEmpty, type ReferenceCase } from './fixtures.js';
import { ReferenceModel } from './reference-forward.js';

/**
 * Sliding-window attention end to end on the CPU backend, with checkpoints made here: a fixture
 * model's folder copied with its config.json edited to slide (no torch needed). The engine is
 * checked against an independent float64 forward (test/reference-forward.ts, itself checked
 * against transformers' float64 logits of the unedited fixtures), and against itself across every
 * way of cutting the same work (one prefill chunk, token by token, chunked, prefix-cache hits).
 */

/** A copy of fixture `name` with `edit` merged into its config.json. */
async function slidingCopy(name: string, edit: Record<string, unknown>): Promise<string> {
  const src = join(MODELS, name);
  const dir = await mkdtemp(join(tmpdir(), `nerva-swa-${name}-`));
  const config = JSON.parse(await readFile(join(src, 'config.json'), 'utf8')) as Record<string, unknown>;
  await writeFile(join(dir, 'config.json'), JSON.stringify({ ...config, ...edit }, null, 2));
  await copyFile(join(src, 'model.safetensors'), join(dir, 'model.safetensors'));
  return dir;
}

/** max |a - b| relative to max |b|. */
function relErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let maxAbs = 0;
  let maxErr = 0;
  for (let i = 0; i < b.length; i++) {
    maxAbs = Math.max(maxAbs, Math.abs(b[i]));
    maxErr = Math.max(maxErr, Math.abs(a[i] - b[i]));
  }
  return maxErr / maxAbs;
}

/** A deterministic prompt of `n` token ids below `vocab`. */
const promptOf = (n: number, vocab: number, seed = 1): number[] => Array.from({ length: n }, (_, i) => (i * 7919 + seed * 104729 + 13) % vocab);

const greedy = (e: Engine, prompt: readonly number[], maxTokens: number): Promise<RequestOutcome> =>
  e.submit(prompt, { temperature: 0, maxTokens, ignoreEos: true, returnPromptLogits: true, returnStepLogits: true }).done;

describe('the float64 reference forward agrees with transformers (full attention)', () => {
  it.each(['tiny-random-qwen3', 'tiny-random-qwen2'])('%s: last-position logits of every reference case', async (name) => {
    const dir = join(MODELS, name);
    const ref = await ReferenceModel.load(dir);
    const cases = (JSON.parse(await readFile(join(dir, 'reference.json'), 'utf8')) as { cases: ReferenceCase[] }).cases;
    const f = await SafetensorsFile.open(join(dir, 'reference.safetensors'));
    try {
      for (const c of cases) {
        const want = await f.readF32(c.logits_tensor);
        expect(relErr(ref.lastLogits(c.prompt_ids), want)).toBeLessThan(1e-5);
      }
    } finally {
      await f.close();
    }
  });
});

const WINDOW = 4;
const PROMPT_LEN = 21;
const STEPS = 16;

describe.each([
  // Every layer slides: max_window_layers 0.
  { name: 'tiny-random-qwen3', edit: { use_sliding_window: true, sliding_window: WINDOW, max_window_layers: 0 }, windows: [WINDOW, WINDOW] },
  // Mixed: layer 0 full, layer 1 sliding (max_window_layers 1).
  { name: 'tiny-random-qwen3', edit: { use_sliding_window: true, sliding_window: WINDOW, max_window_layers: 1 }, windows: [0, WINDOW] },
  // layer_types wins over max_window_layers; qwen2 layout (q/k/v bias, MQA, tied embeddings, f16 weights).
  { name: 'tiny-random-qwen2', edit: { use_sliding_window: true, sliding_window: WINDOW + 1, max_window_layers: 2, layer_types: ['sliding_attention', 'full_attention'] }, windows: [WINDOW + 1, 0] },
])('sliding-window attention on $name with windows $windows (CPU)', ({ name, edit, windows }) => {
  let dir: string;
  let ref: ReferenceModel;
  const engines: Engine[] = [];
  const make = async (o: Partial<EngineOptions> = {}) => {
    const e = await Engine.create({ model: dir, backend: 'cpu', maxNumSeqs: 4, kvCacheBytes: 2 ** 20, blockSize: 4, ...o });
    engines.push(e);
    return e;
  };
  let prompt: number[];
  let want: { tokens: number[]; logits: Float64Array[] };
  beforeAll(async () => {
    dir = await slidingCopy(name, edit);
    ref = await ReferenceModel.load(dir);
    expect(ref.windows()).toEqual(windows);
    prompt = promptOf(PROMPT_LEN, ref.spec.vocabSize);
    want = ref.greedy(prompt, STEPS);
  });
  afterAll(() => {
    for (const e of engines) e.dispose();
  });

  it('the window changes the result (the reference with full attention differs)', () => {
    const full = ref.greedy(prompt, STEPS, windows.map(() => 0));
    expect(relErr(full.logits[0], want.logits[0])).toBeGreaterThan(1e-2);
  });

  it('greedy tokens and the logits of every step equal the float64 reference', async () => {
    const e = await make();
    expect(e.spec.layerWindows).toEqual(windows);
    const out = await greedy(e, prompt, STEPS);
    expect(out.tokenIds).toEqual(want.tokens);
    expect(out.stepLogits).toHaveLength(STEPS);
    for (let i = 0; i < STEPS; i++) expect(relErr(out.stepLogits![i], want.logits[i])).toBeLessThan(1e-5);
  });

  it('one prefill chunk, token by token, chunks of 5, and a prefix-cache hit give identical tokens and logits', async () => {
    const one = await greedy(await make(), prompt, STEPS);
    const byToken = await greedy(await make({ maxNumSeqs: 1, maxNumBatchedTokens: 1 }), prompt, STEPS);
    const chunked = await greedy(await make({ maxNumSeqs: 1, maxNumBatchedTokens: 5 }), prompt, STEPS);
    expect(one.tokenIds).toEqual(want.tokens);
    for (const o of [byToken, chunked]) {
      expect(o.tokenIds).toEqual(one.tokenIds);
      expect(o.promptLogits).toEqual(one.promptLogits);
      for (let i = 0; i < STEPS; i++) expect(o.stepLogits![i]).toEqual(one.stepLogits![i]);
    }
    // A second request for the same prompt starts from cached pages (20 of 21 tokens).
    const e = await make();
    const first = await greedy(e, prompt, STEPS);
    const again = await greedy(e, prompt, STEPS);
    expect(first.numCachedTokens).toBe(0);
    expect(again.numCachedTokens).toBe(20);
    expect(again.tokenIds).toEqual(one.tokenIds);
    expect(again.promptLogits).toEqual(one.promptLogits);
    // A longer prompt sharing the first 21 tokens (and the 16 generated): its prefix is served
    // from the cache and its window reaches back into cached pages.
    const longer = [...prompt, ...one.tokenIds, ...promptOf(5, ref.spec.vocabSize, 3)];
    const hit = await greedy(e, longer, 4);
    expect(hit.numCachedTokens).toBeGreaterThanOrEqual(36);
    const cold = await greedy(await make({ enablePrefixCaching: false }), longer, 4);
    expect(cold.numCachedTokens).toBe(0);
    expect(hit.tokenIds).toEqual(cold.tokenIds);
    expect(hit.promptLogits).toEqual(cold.promptLogits);
    expect(relErr(hit.promptLogits!, ref.lastLogits(longer))).toBeLessThan(1e-5);
  });

  it('batched with other requests and sampled on the device (decode graphs): the same greedy tokens', async () => {
    const e = await make();
    const other = promptOf(9, ref.spec.vocabSize, 2);
    const [a, b] = await Promise.all([
      e.submit(prompt, { temperature: 0, maxTokens: STEPS, ignoreEos: true }).done,
      e.submit(other, { temperature: 0, maxTokens: STEPS, ignoreEos: true }).done,
    ]);
    expect(a.tokenIds).toEqual(want.tokens);
    expect(b.tokenIds).toEqual(ref.greedy(other, STEPS).tokens);
    expect(a.ledger.summary().graph_replays_per_decode_token).toBeGreaterThan(0);
  });
});

describe('pages behind the window go back to the pool (every layer slides)', () => {
  const W = 6;
  const BS = 4;
  const LONG = 120;
  let dir: string;
  let ref: ReferenceModel;
  let prompt: number[];
  const engines: Engine[] = [];
  const make = async (o: Partial<EngineOptions> = {}) => {
    const e = await Engine.create({ model: dir, backend: 'cpu', maxNumSeqs: 4, blockSize: BS, kvCacheBytes: 2 ** 20, importanceCache: false, ...o });
    engines.push(e);
    return e;
  };
  /** Blocks held after each step (the null block aside). */
  const watch = (e: Engine): number[] => {
    const held: number[] = [];
    e.onStep(() => held.push(e.kv.stats().usedBlocks - 1));
    return held;
  };
  const pageBytes = (e: Engine) => 2 * e.spec.numLayers * e.spec.numKvHeads * e.spec.headDim * 4 * BS;
  beforeAll(async () => {
    dir = await slidingCopy('tiny-random-qwen3', { use_sliding_window: true, sliding_window: W, max_window_layers: 0 });
    ref = await ReferenceModel.load(dir);
    prompt = promptOf(21, ref.spec.vocabSize, 5);
  });
  afterAll(() => {
    for (const e of engines) e.dispose();
  });

  it('a long generation holds ceil((W - 1) / blockSize) + 1 blocks while decoding, with the tokens and logits of the run that keeps every page', async () => {
    const keep = await make({ kvFreeOutsideWindow: false });
    const keepHeld = watch(keep);
    const want = await greedy(keep, prompt, LONG);
    expect(Math.max(...keepHeld)).toBe(Math.ceil((prompt.length + LONG - 1) / BS));

    const free = await make();
    expect(free.notes.some((n) => n.includes('KV pages behind it go back to the pool'))).toBe(true);
    const held = watch(free);
    const got = await greedy(free, prompt, LONG);
    expect(got.tokenIds).toEqual(want.tokenIds);
    expect(got.promptLogits).toEqual(want.promptLogits);
    for (let i = 0; i < LONG; i++) expect(got.stepLogits![i]).toEqual(want.stepLogits![i]);
    // Step 0 is the prefill (all 21 prompt positions); every decode step after it holds the
    // blocks of positions p - W + 1 .. p only.
    expect(held[0]).toBe(Math.ceil(prompt.length / BS));
    expect(Math.max(...held.slice(1))).toBe(Math.ceil((W - 1) / BS) + 1);
    // The first 40 tokens against the float64 reference (it recomputes the whole sequence per token).
    const r = ref.greedy(prompt, 40);
    expect(got.tokenIds.slice(0, 40)).toEqual(r.tokens);
    expect(relErr(got.stepLogits![39], r.logits[39])).toBeLessThan(1e-5);
    // Everything comes back, and the bookkeeping is sound.
    const s = free.kv.stats();
    expect(s.sequences).toBe(0);
    expect(s.freeBlocks).toBe(s.totalBlocks - 1);
    free.kv.checkInvariants();
  });

  it('a pool of 7 blocks serves a 141-token sequence and concurrent ones (preempted and re-admitted), with the unconstrained tokens', async () => {
    const big = await make({ kvFreeOutsideWindow: false, maxNumBatchedTokens: 8 });
    const tiny = await make({ maxNumBatchedTokens: 8, kvCacheBytes: 8 * pageBytes(big) });
    expect(tiny.numBlocks).toBe(8);
    // Without freeing, the same pool refuses the request up front.
    const strict = await make({ maxNumBatchedTokens: 8, kvCacheBytes: 8 * pageBytes(big), kvFreeOutsideWindow: false });
    expect(() => strict.submit(prompt, { maxTokens: LONG })).toThrow(/KV blocks/);

    const prompts = [prompt, promptOf(13, ref.spec.vocabSize, 6), promptOf(30, ref.spec.vocabSize, 7)];
    const opts = (i: number) => ({ temperature: i === 0 ? 0 : 0.9, seed: 40 + i, maxTokens: LONG - 20 * i, ignoreEos: true });
    const want = await Promise.all(prompts.map((p, i) => big.submit(p, opts(i)).done));
    let preemptions = 0;
    tiny.onStep((s) => (preemptions = s.preemptions));
    const got = await Promise.all(prompts.map((p, i) => tiny.submit(p, opts(i)).done));
    for (let i = 0; i < prompts.length; i++) expect(got[i].tokenIds).toEqual(want[i].tokenIds);
    expect(preemptions).toBeGreaterThan(0);
    tiny.kv.checkInvariants();
    expect(tiny.kv.stats().freeBlocks).toBe(7);
  });

  it('with tiered KV: windows across hot and warm partials, with and without freeing, give the reference tokens', async () => {
    const pb = pageBytes(await make());
    const r = ref.greedy(prompt, 24);
    for (const kvFreeOutsideWindow of [false, true]) {
      const e = await make({ maxNumSeqs: 8, maxNumBatchedTokens: 32, kvVramBudget: 5 * pb, kvFreeOutsideWindow });
      const out = await greedy(e, prompt, 24);
      expect(out.tokenIds).toEqual(r.tokens);
      for (let i = 0; i < 24; i++) expect(relErr(out.stepLogits![i], r.logits[i])).toBeLessThan(1e-5);
      const rep = e.memoryReport().kv!;
      // Keeping every page needs the warm pool; freeing keeps the window hot.
      if (!kvFreeOutsideWindow) expect(rep.tieredPasses).toBeGreaterThan(0);
    }
  });
});

describe('a model with a full-attention layer frees nothing early', () => {
  it('mixed layers: every page stays held until the request ends', async () => {
    const dir = await slidingCopy('tiny-random-qwen3', { use_sliding_window: true, sliding_window: 4, max_window_layers: 1 });
    const e = await Engine.create({ model: dir, backend: 'cpu', maxNumSeqs: 2, blockSize: 4, kvCacheBytes: 2 ** 20 });
    try {
      const held: number[] = [];
      e.onStep(() => held.push(e.kv.stats().usedBlocks - 1));
      await e.submit(promptOf(10, 512), { temperature: 0, maxTokens: 30, ignoreEos: true }).done;
      expect(Math.max(...held)).toBe(Math.ceil(39 / 4));
      expect(e.notes.some((n) => n.includes('go back to the pool'))).toBe(false);
    } finally {
      e.dispose();
    }
  });
});

// Fixtures with sliding windows made by transformers 5.x (tools/gpu/make_swa_fixture.py, in
// <repo root>/fixtures/models): the engine against transformers' own float64 answers.
describe.each(localFixtureModels())('CPU parity with transformers float64 on a sliding-window fixture: %s', (name) => {
  const dir = join(LOCAL_MODELS, name);
  const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { cases: ReferenceCase[]; sliding: { sliding_window: number; layer_types: string[] } };
  let logitsFile: SafetensorsFile;
  const engines: Engine[] = [];
  const make = async (o: Partial<EngineOptions> = {}) => {
    const e = await Engine.create({ model: dir, backend: 'cpu', maxNumSeqs: 4, blockSize: 4, kvCacheBytes: 2 ** 20, ...o });
    engines.push(e);
    return e;
  };
  beforeAll(async () => {
    logitsFile = await SafetensorsFile.open(join(dir, 'reference.safetensors'));
  });
  afterAll(async () => {
    for (const e of engines) e.dispose();
    await logitsFile?.close();
  });

  it('the config gives the layer windows transformers used', async () => {
    const e = await make();
    const w = ref.sliding.sliding_window;
    expect(ref.sliding.layer_types.map((_, l) => e.spec.layerWindows?.[l] ?? 0)).toEqual(ref.sliding.layer_types.map((t) => (t === 'sliding_attention' ? w : 0)));
  });

  it.each(nonEmpty(ref.cases, `cases in ${name}/reference.json`).map((c, i) => [i, c] as const))('case %i: greedy tokens and last-position logits, in one chunk, chunked, with and without freeing pages', async (_i, c) => {
    const want = await logitsFile.readF32(c.logits_tensor);
    // A float32 engine may legitimately flip a step whose top-2 margin is below its error.
    const low = c.step_top2_margin.findIndex((m) => m < 1e-4);
    const comparable = low >= 0 ? low + 1 : c.greedy_f64.length;
    const outs: RequestOutcome[] = [];
    // Also as a 2-stage pipeline (CPU stages share one backend): each stage's layers keep their windows.
    for (const o of [{}, { maxNumSeqs: 1, maxNumBatchedTokens: 3 }, { kvFreeOutsideWindow: false }, { pipelineParallel: 2 }]) {
      const out = await greedy(await make(o), c.prompt_ids, c.greedy_f64.length);
      expect(out.tokenIds.slice(0, comparable)).toEqual(c.greedy_f64.slice(0, comparable));
      expect(relErr(out.promptLogits!, want)).toBeLessThan(1e-5);
      outs.push(out);
    }
    for (const o of outs.slice(1)) expect(o.tokenIds).toEqual(outs[0].tokenIds);
    // The independent float64 forward agrees with transformers too.
    const mine = await ReferenceModel.load(dir);
    expect(relErr(mine.lastLogits(c.prompt_ids), want)).toBeLessThan(1e-5);
  });
});
