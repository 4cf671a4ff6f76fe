import { KvCacheManager } from '@nerva/kv';
import { describe, expect, it } from 'vitest';
import { Engine, ENGINE_OPTIONS, Request, resolveSamplingParams, Scheduler, type StepSignals } from '../src/index.js';
import { DEFAULT_MODEL } from './fixtures.js';

const params = resolveSamplingParams({ temperature: 0, maxTokens: 64, seed: 1 }, { maxTokens: 1000, vocabSize: 100 });
let nextId = 1;
const req = (len: number) => new Request(nextId++, Array.from({ length: len }, (_, i) => (i * 7 + nextId) % 100), params, 0, undefined, nextId);

function finishStep(plan: ReturnType<Scheduler['schedule']>): void {
  for (const { req: r, numTokens } of plan.scheduled) {
    r.numComputedTokens += numTokens;
    if (r.numComputedTokens === r.numTokens) r.appendToken(1);
  }
}

describe('Scheduler with a prompt budget', () => {
  it('a burst of prompts arriving while requests decode takes the prompt budget a step, every decode row served; with no decode row, the whole budget', () => {
    const kv = new KvCacheManager({ numBlocks: 512, blockSize: 4, enablePrefixCaching: false });
    const s = new Scheduler({ maxNumBatchedTokens: 64, maxNumSeqs: 16, decodePromptBudget: 10 }, kv);
    // Four prompts of 12 arrive together: nothing decodes, so the first step takes 48 tokens.
    const first = [req(12), req(12), req(12), req(12)];
    for (const r of first) s.add(r);
    let p = s.schedule();
    expect(p.numScheduledTokens).toBe(48);
    finishStep(p);
    // A burst of six prompts of 7 while the four decode: at most 10 prompt tokens a step.
    const burst = Array.from({ length: 6 }, () => req(7));
    for (const r of burst) s.add(r);
    let steps = 0;
    while (burst.some((r) => r.outputIds.length === 0)) {
      p = s.schedule();
      const rows = new Map(p.scheduled.map((x) => [x.req, x.numTokens]));
      for (const d of first) expect(rows.get(d)).toBe(1);
      const prompt = p.scheduled.filter((x) => x.req.numTokens - x.req.numComputedTokens > 1).reduce((n, x) => n + x.numTokens, 0);
      expect(prompt).toBeLessThanOrEqual(10);
      finishStep(p);
      steps++;
    }
    // 42 prompt tokens at 10 a step: 5 steps (the last prompt's final token shares a step).
    expect(steps).toBe(5);
    // Once nothing decodes, prompts take the whole budget again.
    for (const r of [...first, ...burst]) s.remove(r);
    const next = [req(40), req(40)];
    for (const r of next) s.add(r);
    expect(s.schedule().numScheduledTokens).toBe(64);
  });

  it('batch-invariant steps keep their own pace: a prompt chunk alone takes the whole budget while others decode', () => {
    const kv = new KvCacheManager({ numBlocks: 256, blockSize: 4, enablePrefixCaching: false });
    const s = new Scheduler({ maxNumBatchedTokens: 32, maxNumSeqs: 8, batchInvariant: true, decodePromptBudget: 4 }, kv);
    const d = req(3);
    s.add(d);
    finishStep(s.schedule());
    const a = req(20);
    s.add(a);
    const p = s.schedule();
    expect(p.scheduled.map((x) => [x.req.id, x.numTokens])).toEqual([[a.id, 20]]);
  });
});

describe('EngineOptions.decodePromptBudget', () => {
  it('is declared once, with no constant default (the engine takes the step budget)', () => {
    const spec = ENGINE_OPTIONS.find((o) => o.name === 'decodePromptBudget');
    expect(spec).toMatchObject({ flag: '--decode-prompt-budget <n>', toml: 'decode_prompt_budget', kind: 'posint' });
    expect(spec).not.toHaveProperty('default');
  });

  it('prompts arriving while others decode enter a fixed number of tokens a step, with the same tokens as unpaced', async () => {
    const paced = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', maxNumBatchedTokens: 64, decodePromptBudget: 8 });
    const free = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', maxNumBatchedTokens: 64 });
    try {
      const steps: StepSignals[] = [];
      paced.onStep((s) => steps.push(s));
      const opts = (seed: number) => ({ temperature: 0.8, seed, maxTokens: 24, ignoreEos: true });
      const ids = (n: number, k: number) => Array.from({ length: n }, (_, i) => 1 + ((i * 13 + k * 7) % 60));
      const run = async (e: Engine) => {
        const early = [e.submit(ids(5, 0), opts(0)), e.submit(ids(6, 1), opts(1))];
        // Once both decode, three 30-token prompts arrive together.
        await new Promise<void>((resolve) => {
          const off = e.onStep((s) => {
            if (s.promptTokens === 0 && s.scheduledTokens === 2) {
              off();
              resolve();
            }
          });
        });
        const late = [2, 3, 4].map((k) => e.submit(ids(30, k), opts(k)));
        return Promise.all([...early, ...late].map((h) => h.done));
      };
      const got = await run(paced);
      const want = await run(free);
      for (let i = 0; i < want.length; i++) expect(got[i].tokenIds).toEqual(want[i].tokenIds);
      const mixed = steps.filter((s) => s.scheduledTokens > s.promptTokens && s.promptTokens > 0);
      expect(mixed.length).toBeGreaterThanOrEqual(90 / 8);
      for (const s of mixed) expect(s.promptTokens).toBeLessThanOrEqual(8);
    } finally {
      paced.dispose();
      free.dispose();
    }
  });

  it('refuses a bad value with a clear error', async () => {
    for (const decodePromptBudget of [0, -4, 2.5, '8' as unknown as number])
      await expect(Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', decodePromptBudget })).rejects.toThrow(/decodePromptBudget must be a positive integer/);
  });
});
