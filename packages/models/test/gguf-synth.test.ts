import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { GgufCheckpoint, GgufError, writeSyntheticGguf, type GgufConvertType } from '../src/index.js';
import { FIXTURES } from './helpers.js';

const config = JSON.parse(readFileSync(join(FIXTURES, 'models/tiny-random-qwen3/config.json'), 'utf8')) as object;

describe('writeSyntheticGguf', () => {
  it('writes a file the GGUF loader opens, at the requested type rules', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'nerva-synth-gguf-'));
    const out = join(dir, 'x.gguf');
    const r = await writeSyntheticGguf({ config, out, type: 'Q8_0', seed: 3 });
    expect(r.types.Q8_0).toBeGreaterThan(0);
    const c = await GgufCheckpoint.open(out);
    try {
      const names = c.names();
      expect(names.length).toBeGreaterThan(0);
      const w = await c.readF32(names.find((n) => n.endsWith('q_proj.weight'))!);
      expect(w.every((v) => Number.isFinite(v))).toBe(true);
      expect(w.some((v) => v !== 0)).toBe(true);
    } finally {
      await c.close();
    }
  });

  it('refuses an unknown type with BAD_INPUT and leaves no file', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'nerva-synth-gguf-'));
    const err = await writeSyntheticGguf({ config, out: join(dir, 'y.gguf'), type: 'Q3_X' as GgufConvertType }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GgufError);
    expect((err as GgufError).code).toBe('BAD_INPUT');
    expect(readdirSync(dir)).toEqual([]);
  });
});
