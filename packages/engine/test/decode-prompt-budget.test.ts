import { describe, expect, it } from 'vitest';
import { Engine, ENGINE_OPTIONS, type StepSignals } from '../src/index.js';
import { DEFAULT_MODEL } from './fixtures.js';

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
