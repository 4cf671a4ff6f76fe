import { copyFile, mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SafetensorsFile } from '@nerva/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, type EngineOptions, type RequestOutcome } from '../src/index.js';
import { MODELS, type ReferenceCase } from './fixtures.js';
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
