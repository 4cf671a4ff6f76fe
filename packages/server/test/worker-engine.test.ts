import { Engine, InvalidParamsError, WorkerEngine } from '@nerva/engine';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defaultModelDir } from '../src/default-model.js';

let w: WorkerEngine;
beforeAll(async () => {
  w = await WorkerEngine.create({ model: defaultModelDir(), backend: 'cpu' });
});
afterAll(async () => {
  await w?.dispose();
});

describe('WorkerEngine', () => {
  it('gives the same tokens as the in-process engine, with ledger summaries', async () => {
    const e = await Engine.create({ model: defaultModelDir(), backend: 'cpu' });
    try {
      const opts = { maxTokens: 6, seed: 5, temperature: 0.9, topK: 20, ignoreEos: true };
      const local = await e.submit('ROMEO:', opts).done;
      const h = w.submit('ROMEO:', opts);
      const streamed: number[] = [];
      for await (const ev of h.events) streamed.push(ev.token);
      const remote = await h.done;
      expect(remote.tokenIds).toEqual(local.tokenIds);
      expect(streamed).toEqual(local.tokenIds);
      expect(remote.text).toBe(local.text);
      expect(remote.ledger.tokens).toBe(6);
      expect(remote.times.finished).toBeGreaterThanOrEqual(remote.times.firstToken!);
    } finally {
      e.dispose();
    }
  });

  it('throws InvalidParamsError synchronously, naming the parameter', () => {
    expect(() => w.submit('x', { temperature: -1 })).toThrow(InvalidParamsError);
    expect(() => w.submit([1, 2], { maxTokens: 10_000_000 })).toThrow(InvalidParamsError);
    expect(() => w.submit([1, 2], { maxTokens: 10_000_000 })).toThrow(expect.objectContaining({ param: 'max_tokens' }));
    expect(() => w.submit([], {})).toThrow(/prompt/);
  });

  it('abort reaches the worker at once: the request ends and its blocks are freed', async () => {
    const h = w.submit('To be', { maxTokens: 500, ignoreEos: true });
    let n = 0;
    for await (const _ev of h.events) {
      if (++n === 2) h.abort();
    }
    const o = await h.done;
    expect(o.finishReason).toBe('abort');
    // Tokens of at most one more step may arrive after the abort was sent.
    expect(o.tokenIds.length).toBeLessThanOrEqual(3);
    const s = await w.stats();
    expect(s.kv.sequences).toBe(0);
    expect(s.kv.freeBlocks).toBe(s.kv.totalBlocks - 1);
    await w.checkInvariants();
  });

  it("reads the engine thread's own heap (its isolate, not the server's)", async () => {
    const h = await w.query('heap');
    expect(h.usedBytes).toBeGreaterThan(0);
    expect(h.totalBytes).toBeGreaterThanOrEqual(h.usedBytes);
    // Another isolate than this thread's: the numbers are the worker's, not process.memoryUsage()'s.
    expect(h.usedBytes).not.toBe(process.memoryUsage().heapUsed);
  });

  it('an AbortSignal and an early break both cancel', async () => {
    const ac = new AbortController();
    const h = w.submit('O', { maxTokens: 500, ignoreEos: true, signal: ac.signal });
    setTimeout(() => ac.abort(), 50);
    expect((await h.done).finishReason).toBe('abort');
    const h2 = w.submit('O', { maxTokens: 500, ignoreEos: true });
    for await (const _ev of h2.events) break;
    expect((await h2.done).finishReason).toBe('abort');
  });

  it('reports steps and finishes', async () => {
    const steps: number[] = [];
    const finished: string[] = [];
    const off1 = w.onStep((s) => steps.push(s.generationTokens));
    const off2 = w.onFinish((o) => finished.push(o.finishReason));
    await w.submit('KING:', { maxTokens: 3, ignoreEos: true }).done;
    off1();
    off2();
    expect(steps.reduce((a, b) => a + b, 0)).toBe(3);
    expect(finished).toEqual(['length']);
  });
});
