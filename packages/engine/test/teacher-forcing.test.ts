import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, InvalidParamsError } from '../src/index.js';
import { DEFAULT_MODEL } from './fixtures.js';

describe('teacher forcing and step logits', () => {
  let engine: Engine;
  beforeAll(async () => {
    engine = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu' });
  });
  afterAll(() => engine?.dispose());

  it('step k logits equal the last-position logits of the prompt extended by the first k forced tokens', async () => {
    const prompt = engine.encode('ROMEO:\n');
    const forced = engine.encode(' What light through yonder window breaks');
    const out = await engine.submit(prompt, { temperature: 0, maxTokens: forced.length, ignoreEos: true, forceTokens: forced, returnStepLogits: true }).done;
    expect(out.tokenIds).toEqual(forced);
    expect(out.stepLogits).toHaveLength(forced.length);
    for (const k of [0, 3, forced.length - 1]) {
      const ext = await engine.submit([...prompt, ...forced.slice(0, k)], { temperature: 0, maxTokens: 1, returnPromptLogits: true }).done;
      const a = out.stepLogits![k];
      const b = ext.promptLogits!;
      let maxAbs = 0;
      let maxErr = 0;
      for (let i = 0; i < a.length; i++) {
        maxAbs = Math.max(maxAbs, Math.abs(b[i]));
        maxErr = Math.max(maxErr, Math.abs(a[i] - b[i]));
      }
      // Rows are computed independently, so decode and prefill agree to float32 rounding.
      expect(maxErr).toBeLessThanOrEqual(1e-6 * maxAbs);
    }
  });

  it('rejects forced tokens outside the vocabulary or beyond max_tokens', () => {
    expect(() => engine.submit([1, 2], { forceTokens: [1, 99999], maxTokens: 4 })).toThrow(InvalidParamsError);
    expect(() => engine.submit([1, 2], { forceTokens: [1, 2, 3], maxTokens: 2 })).toThrow(/force_tokens/);
    expect(engine.kv.stats().sequences).toBe(0);
  });
});
