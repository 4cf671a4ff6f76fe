import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { Engine } from '../src/index.js';
import { DEFAULT_MODEL, fixtureModels, MODELS, nonEmpty } from './fixtures.js';
import { ReferenceModel } from './reference-forward.js';

// A bf16 KV cache rounds each key and value once, when stored: the engine's logits must match a
// float64 forward that rounds keys and values the same way, and differ from one that does not.
const PROMPT = [1, 7, 3, 22, 9, 14, 2, 30, 5, 11, 8, 19, 4, 27, 6, 13, 21];
const dense = nonEmpty(
  fixtureModels().filter((m) => m.includes('qwen') && !m.includes('moe')),
  'dense Qwen fixture models',
);

function relErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let d = 0;
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    d = Math.max(d, Math.abs(a[i] - b[i]));
    m = Math.max(m, Math.abs(b[i]));
  }
  return d / m;
}

describe('kvCacheDtype', () => {
  it.each(dense)('bf16 keys and values: last-prompt logits as a float64 forward that rounds them (%s)', async (name) => {
    const dir = join(MODELS, name);
    const ref = await ReferenceModel.load(dir);
    const rounded = ref.lastLogits(PROMPT, undefined, { kvBf16: true });
    const plain = ref.lastLogits(PROMPT);
    const e = await Engine.create({ model: dir, backend: 'cpu', kvCacheDtype: 'bf16', maxNumSeqs: 4 });
    try {
      expect(e.kvDtype).toBe('bf16');
      const out = await e.submit(PROMPT, { temperature: 0, maxTokens: 1, ignoreEos: true, returnPromptLogits: true }).done;
      // The CPU backend is float32 throughout: 1e-5 of the largest logit (as the parity tests).
      expect(relErr(out.promptLogits!, rounded)).toBeLessThan(1e-5);
      // The rounding is real: the unrounded forward is measurably further away.
      expect(relErr(out.promptLogits!, plain)).toBeGreaterThan(10 * relErr(out.promptLogits!, rounded));
    } finally {
      e.dispose();
    }
  });

  it('bf16 holds twice the tokens of f32 in the same bytes', async () => {
    const bytes = 2 ** 20;
    const a = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', kvCacheBytes: bytes });
    const b = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', kvCacheBytes: bytes, kvCacheDtype: 'bf16' });
    try {
      expect(a.kvDtype).toBe('f32');
      expect(b.numBlocks).toBeGreaterThanOrEqual(2 * a.numBlocks - 1);
      const x = await b.submit([1, 2, 3, 4, 5], { temperature: 0, maxTokens: 6, ignoreEos: true }).done;
      expect(x.tokenIds).toHaveLength(6);
    } finally {
      a.dispose();
      b.dispose();
    }
  });

  it('rejects an unknown dtype and f32 under bf16 numerics', async () => {
    await expect(Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', kvCacheDtype: 'f16' as 'bf16' })).rejects.toThrow(/kvCacheDtype must be auto, f32, bf16/);
    await expect(Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', numerics: 'bf16', kvCacheDtype: 'f32' })).rejects.toThrow(/contradicts bf16 numerics/);
    const e = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', numerics: 'bf16' });
    try {
      expect(e.kvDtype).toBe('bf16');
    } finally {
      e.dispose();
    }
  });
});
