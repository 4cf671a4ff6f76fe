import { existsSync, readdirSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { Engine, type EngineOptions } from '../src/index.js';
import { DEFAULT_MODEL } from './fixtures.js';

// Engine.create checks its options before it opens the checkpoint: a refused option is one clear
// error and leaves no file of the model open (before, numerics, kvCacheDtype and the residency and
// KV tier options were checked after the open, and each refusal left the safetensors handle to GC).
const openFds = (): number => readdirSync('/proc/self/fd').length;

describe('Engine.create with a refused option', () => {
  it.runIf(existsSync('/proc/self/fd'))('throws a RangeError naming it and leaves no file of the model open', async () => {
    // Warm the loaders up once, so lazily opened files are not counted against the refusals.
    (await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu' })).dispose();
    const before = openFds();
    const refused: Array<[Partial<EngineOptions>, RegExp]> = [
      [{ numerics: 'f16' as 'bf16' }, /numerics must be/],
      [{ kvCacheDtype: 'f16' as 'bf16' }, /kvCacheDtype must be/],
      [{ vramBudget: -1 }, /vramBudget must be a positive whole number of bytes/],
      [{ kvVramBudget: 1.5 }, /kvVramBudget must be a positive whole number of bytes/],
    ];
    for (const [o, msg] of refused) {
      await expect(Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', ...o })).rejects.toThrow(msg);
    }
    expect(openFds()).toBe(before);
  });
});
