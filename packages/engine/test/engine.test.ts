import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, InvalidParamsError, type RequestOutcome } from '../src/index.js';
import { DEFAULT_MODEL } from './fixtures.js';

/** Every KV block is back in the pool (the null block is never handed out). */
function expectAllFree(e: Engine): void {
  const s = e.kv.stats();
  expect(s.sequences).toBe(0);
  expect(s.freeBlocks).toBe(s.totalBlocks - 1);
  e.kv.checkInvariants();
}

const PROMPTS = ['ROMEO:', 'First Citizen:\nBefore we proceed', 'KING HENRY', 'O, what a', 'JULIET:\nAy me'];

describe('engine on the default model (CPU)', () => {
  let engine: Engine;
  beforeAll(async () => {
    engine = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', maxNumSeqs: 16 });
  });
  afterAll(() => engine?.dispose());

  const run = (prompt: string, seed: number, maxTokens = 24, extra = {}) =>
    engine.submit(prompt, { temperature: 0.9, topK: 40, topP: 0.95, seed, maxTokens, ignoreEos: true, ...extra }).done;

  it('gives the same tokens alone and batched with others (same seed)', async () => {
    const alone: RequestOutcome[] = [];
    for (let i = 0; i < PROMPTS.length; i++) alone.push(await run(PROMPTS[i], 100 + i));
    const batched = await Promise.all(PROMPTS.map((p, i) => run(p, 100 + i)));
    for (let i = 0; i < PROMPTS.length; i++) {
      expect(batched[i].tokenIds).toEqual(alone[i].tokenIds);
      expect(batched[i].text).toEqual(alone[i].text);
    }
    // Different seeds give different samples (the seed is honoured).
    expect((await run(PROMPTS[0], 7)).tokenIds).not.toEqual(alone[0].tokenIds);
    expectAllFree(engine);
  });

  it('host sampling (penalties) and device sampling agree when penalties are neutral', async () => {
    const device = await run(PROMPTS[1], 5, 24);
    // A neutral repetition penalty written out explicitly still takes the device path; logprobs force the host path.
    const host = await run(PROMPTS[1], 5, 24, { logprobs: true });
    expect(host.tokenIds).toEqual(device.tokenIds);
  });

  it('replays a captured decode graph with no allocation on the hot path', async () => {
    const out = await run(PROMPTS[2], 1, 32);
    const s = out.ledger.summary();
    expect(s.decode_tokens).toBe(31);
    expect(s.graph_replays_per_decode_token).toBe(1);
    expect(s.hot_path_allocations).toBe(0);
    // Decode tokens need only the policy sync that reads the sampled token.
    expect(s.syncs_per_decode_token.hard).toBe(0);
    expect(s.syncs_per_decode_token.policy).toBe(1);
    expect(Object.keys(engine.graphNodes()).length).toBeGreaterThan(0);
  });

  it('streams text deltas that add up to the final text, one event per token', async () => {
    const h = engine.submit('ROMEO:', { temperature: 0, maxTokens: 20, ignoreEos: true });
    let text = '';
    const idx: number[] = [];
    for await (const ev of h.events) {
      text += ev.text;
      idx.push(ev.index);
    }
    const out = await h.done;
    expect(idx).toEqual([...Array(20).keys()]);
    expect(text).toBe(out.text);
    expect(out.text).toBe(engine.tokenizer!.decode(out.tokenIds));
    expect(out.finishReason).toBe('length');
  });

  it('stops at a stop string, excluding it from the text', async () => {
    const free = await engine.submit('ROMEO:', { temperature: 0, maxTokens: 40, ignoreEos: true }).done;
    const stop = free.text.slice(8, 11);
    const cut = free.text.indexOf(stop);
    const out = await engine.submit('ROMEO:', { temperature: 0, maxTokens: 40, ignoreEos: true, stop: [stop] }).done;
    expect(out.finishReason).toBe('stop');
    expect(out.stopReason).toBe(stop);
    expect(out.text).toBe(free.text.slice(0, cut));
  });

  it('stops at a stop token id and honours min_tokens', async () => {
    const free = await engine.submit('ROMEO:', { temperature: 0, maxTokens: 10, ignoreEos: true }).done;
    const stopId = free.tokenIds[3];
    const out = await engine.submit('ROMEO:', { temperature: 0, maxTokens: 10, ignoreEos: true, stopTokenIds: [stopId] }).done;
    expect(out.finishReason).toBe('stop');
    expect(out.tokenIds[out.tokenIds.length - 1]).toBe(stopId);
    expect(out.tokenIds.length).toBe(free.tokenIds.indexOf(stopId) + 1);
    const min = await engine.submit('ROMEO:', { temperature: 0, maxTokens: 10, ignoreEos: true, stopTokenIds: [stopId], minTokens: 8 }).done;
    expect(min.tokenIds.length).toBeGreaterThanOrEqual(8);
    expect(min.tokenIds.slice(0, 8)).not.toContain(stopId);
  });

  it('aborting frees the request blocks at once', async () => {
    const ac = new AbortController();
    const h = engine.submit('ROMEO:', { temperature: 0, maxTokens: 200, ignoreEos: true, signal: ac.signal });
    let n = 0;
    for await (const _ev of h.events) {
      if (++n === 3) ac.abort();
    }
    const out = await h.done;
    expect(out.finishReason).toBe('abort');
    // Aborted by its caller: no error to report.
    expect(out.error).toBeUndefined();
    expect(out.tokenIds.length).toBeLessThan(200);
    expectAllFree(engine);
  });

  it('serves a repeated prompt from the prefix cache with the same result', async () => {
    const prompt = 'First Citizen:\nBefore we proceed any further, hear me speak. You are all resolved rather to die than to famish?';
    const a = await engine.submit(prompt, { temperature: 0, maxTokens: 8 }).done;
    const b = await engine.submit(prompt, { temperature: 0, maxTokens: 8 }).done;
    expect(b.numCachedTokens).toBeGreaterThan(0);
    expect(b.tokenIds).toEqual(a.tokenIds);
  });

  it('rejects bad parameters before anything changes', () => {
    const before = engine.kv.stats();
    expect(() => engine.submit('ROMEO:', { temperature: -1 })).toThrow(InvalidParamsError);
    expect(() => engine.submit('ROMEO:', { maxTokens: 10 ** 9 })).toThrow(/max_tokens/);
    expect(() => engine.submit([], {})).toThrow(/prompt/);
    expect(() => engine.submit([1, 999999], {})).toThrow(/token id/);
    expect(() => engine.submit('x', { topP: 0 })).toThrow(/top_p/);
    expect(() => engine.submit('x', { stop: [''] })).toThrow(/stop/);
    expect(engine.kv.stats()).toEqual(before);
    expect(engine.numWaiting + engine.numRunning).toBe(0);
  });
});

describe('preemption by recompute', () => {
  it('preempts when KV blocks run out and still gives the same tokens', async () => {
    // 12 blocks of 16 tokens: four 60-token requests cannot all hold their KV at once.
    const small = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', blockSize: 16, kvCacheBytes: 12 * 16 * 12288 + 1 });
    const big = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu' });
    try {
      let preemptions = 0;
      small.onStep((s) => (preemptions = s.preemptions));
      const opts = (seed: number) => ({ temperature: 0.8, seed, maxTokens: 40, ignoreEos: true });
      const prompts = PROMPTS.slice(0, 4);
      const got = await Promise.all(prompts.map((p, i) => small.submit(p, opts(i)).done));
      const want = await Promise.all(prompts.map((p, i) => big.submit(p, opts(i)).done));
      expect(preemptions).toBeGreaterThan(0);
      for (let i = 0; i < prompts.length; i++) expect(got[i].tokenIds).toEqual(want[i].tokenIds);
      expectAllFree(small);
    } finally {
      small.dispose();
      big.dispose();
    }
  });
});
