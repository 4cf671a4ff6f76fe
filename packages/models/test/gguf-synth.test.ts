import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { GGUF_CONVERT_TYPES, GgufCheckpoint, GgufError, writeSyntheticGguf, type GgufConvertType } from '../src/index.js';
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

  it('every type nerva convert writes: finite weights of about the synthetic scale (0.02)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'nerva-synth-gguf-'));
    // 256-wide rows: the k-quants are not replaced by their 32-block fallbacks.
    const wide = JSON.parse(readFileSync(join(FIXTURES, 'models/tiny-shakespeare-qwen3/config.json'), 'utf8')) as object;
    for (const type of GGUF_CONVERT_TYPES) {
      const out = join(dir, `${type}.gguf`);
      const r = await writeSyntheticGguf({ config: wide, out, type, seed: 5 });
      const c = await GgufCheckpoint.open(out);
      try {
        expect(c.info('model.layers.0.self_attn.q_proj.weight').ggmlType, type).toBe(type.replace(/_[SML]$/, '')); // a mix's base type
        for (const n of ['model.layers.0.self_attn.q_proj.weight', 'model.layers.0.mlp.down_proj.weight']) {
          const w = await c.readF32(n);
          expect(w.every((v) => Number.isFinite(v)), `${type} ${n}`).toBe(true);
          const rms = Math.sqrt(w.reduce((a, v) => a + v * v, 0) / w.length);
          expect(rms, `${type} ${n}`).toBeGreaterThan(0.002);
          expect(rms, `${type} ${n}`).toBeLessThan(0.2);
        }
      } finally {
        await c.close();
      }
      expect(Object.keys(r.types).length).toBeGreaterThan(0);
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
