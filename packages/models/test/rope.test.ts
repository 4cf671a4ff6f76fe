import { describe, expect, it } from 'vitest';
import { parseModelConfig, ropeInvFreq } from '../src/index.js';

const base = { vocab_size: 8, hidden_size: 512, intermediate_size: 8, num_hidden_layers: 1, num_attention_heads: 4, head_dim: 128 };

describe('ropeInvFreq', () => {
  it('default: theta^(-2i/d)', () => {
    const f = ropeInvFreq(parseModelConfig({ ...base, model_type: 'qwen3', rope_theta: 1e6 }));
    expect(f.length).toBe(64);
    expect(f[0]).toBe(1);
    expect(f[1]).toBeCloseTo(1e6 ** (-2 / 128), 15);
    expect(f[63]).toBeCloseTo(1e6 ** (-126 / 128), 18);
  });

  it('linear divides every frequency by the factor', () => {
    const f = ropeInvFreq(parseModelConfig({ ...base, model_type: 'llama', rope_theta: 10000, rope_scaling: { type: 'linear', factor: 4 } }));
    expect(f[0]).toBe(0.25);
    expect(f[10]).toBeCloseTo(10000 ** (-20 / 128) / 4, 15);
  });

  it('llama3 matches the formula in the high, medium and low frequency bands', () => {
    // Llama 3.1 parameters: theta 500000, factor 8, low 1, high 4, original 8192.
    const spec = parseModelConfig({
      ...base,
      model_type: 'llama',
      rope_theta: 500000,
      rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 },
    });
    const f = ropeInvFreq(spec);
    const raw = (i: number) => Math.pow(500000, -(2 * i) / 128);
    // Wavelength 2π/f; bands: < 8192/4 = 2048 kept, > 8192/1 = 8192 divided by 8, between: blend.
    const wl = (i: number) => (2 * Math.PI) / raw(i);
    const high = [0, 10, 20].filter((i) => wl(i) < 2048);
    const low = [50, 63].filter((i) => wl(i) > 8192);
    const mid = Array.from({ length: 64 }, (_, i) => i).filter((i) => wl(i) >= 2048 && wl(i) <= 8192);
    expect(high.length).toBe(3);
    expect(low.length).toBe(2);
    expect(mid.length).toBeGreaterThan(0);
    for (const i of high) expect(f[i]).toBe(raw(i));
    for (const i of low) expect(f[i]).toBeCloseTo(raw(i) / 8, 18);
    for (const i of mid) {
      // smooth = (original / wavelength - low) / (high - low); blend of f/factor and f.
      const smooth = (8192 / wl(i) - 1) / (4 - 1);
      const want = (1 - smooth) * (raw(i) / 8) + smooth * raw(i);
      expect(f[i]).toBeCloseTo(want, 15);
      expect(f[i]).toBeLessThan(raw(i));
      expect(f[i]).toBeGreaterThan(raw(i) / 8);
    }
    // Hand-evaluated (Python, float64) medium-band point: i = 32 → f = 500000^-0.5,
    // wavelength 4442.88, smooth 0.2812826, scaled 0.000524846161.
    expect(f[32]).toBeCloseTo(0.0005248461609929547, 15);
  });
});
