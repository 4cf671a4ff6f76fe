import { Engine, type TokenEvent, WorkerEngine } from '@nerva/engine';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defaultModelDir } from '../src/default-model.js';

let w: WorkerEngine;
let e: Engine;
beforeAll(async () => {
  [w, e] = await Promise.all([WorkerEngine.create({ model: defaultModelDir(), backend: 'cpu' }), Engine.create({ model: defaultModelDir(), backend: 'cpu' })]);
});
afterAll(async () => {
  await w?.dispose();
  e?.dispose();
});

/** What a consumer of the stream sees of each event, ledger aside. */
const seen = (ev: TokenEvent) => ({ index: ev.index, token: ev.token, text: ev.text, logprob: ev.logprob, topLogprobs: ev.topLogprobs, finishReason: ev.finishReason, stopReason: ev.stopReason });

describe('WorkerEngine: a step crosses the thread boundary as one message', () => {
  it('requests running together get, event by event, what each gets alone in-process: tokens, texts, logprobs, finish and stop reasons', async () => {
    const jobs = [
      { prompt: 'ROMEO:', opts: { maxTokens: 9, temperature: 0, logprobs: true, topLogprobs: 3, ignoreEos: true } },
      { prompt: 'JULIET:', opts: { maxTokens: 14, temperature: 0, logprobs: true, topLogprobs: 2, ignoreEos: true } },
      { prompt: 'KING:', opts: { maxTokens: 40, temperature: 0.8, seed: 3, stop: [' the', 'e'], ignoreEos: true } },
      { prompt: 'To be', opts: { maxTokens: 5, temperature: 0, ignoreEos: true } },
    ];
    const alone: { events: ReturnType<typeof seen>[]; tokenIds: number[]; finishReason: string; stopReason: unknown }[] = [];
    for (const j of jobs) {
      const h = e.submit(j.prompt, j.opts);
      const events: ReturnType<typeof seen>[] = [];
      for await (const ev of h.events) events.push(seen(ev));
      const o = await h.done;
      alone.push({ events, tokenIds: o.tokenIds, finishReason: o.finishReason, stopReason: o.stopReason });
    }
    // All submitted in one turn: their prompts share steps, and every decode step after carries
    // one event per running request in its message.
    const perStep: number[] = [];
    const off = w.onStep((s) => perStep.push(s.generationTokens));
    const hs = jobs.map((j) => w.submit(j.prompt, j.opts));
    const together = await Promise.all(
      hs.map(async (h) => {
        const events: ReturnType<typeof seen>[] = [];
        for await (const ev of h.events) events.push(seen(ev));
        const o = await h.done;
        return { events, tokenIds: o.tokenIds, finishReason: o.finishReason, stopReason: o.stopReason };
      }),
    );
    off();
    expect(together).toEqual(alone);
    expect(Math.max(...perStep)).toBeGreaterThan(1);
    expect(perStep.reduce((a, b) => a + b, 0)).toBe(alone.reduce((a, r) => a + r.tokenIds.length, 0));
    expect(alone[2].finishReason).toBe('stop');
    expect(alone[0].events[0].topLogprobs).toHaveLength(3);
  }, 60_000);
});
