import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { logSoftmax, QuantErrorStats, quantErrorProbe } from '../src/probes/quant-error.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '../../..');
const TINY = join(root, '../shared/fixtures/models/tiny-shakespeare-qwen3');
const TEXT = join(root, '../shared/fixtures/text/tinyshakespeare-last10pct.txt');

describe('quantization error metrics', () => {
  it('log-softmax sums to one and survives large logits', () => {
    const l = logSoftmax(Float32Array.from([1000, 1000, 998]));
    expect(l.reduce((s, v) => s + Math.exp(v), 0)).toBeCloseTo(1, 12);
    expect(l[0]).toBeCloseTo(-Math.log(2 + Math.exp(-2)), 12);
  });

  it('identical distributions: no KL, full agreement, equal perplexity', () => {
    const s = new QuantErrorStats();
    s.add(Float32Array.from([0, 1, 2]), Float32Array.from([0, 1, 2]), 1);
    s.add(Float32Array.from([3, 1, 0]), Float32Array.from([3, 1, 0]), 0);
    expect(s.summary()).toMatchObject({ positions: 2, kl_mean: 0, kl_max: 0, top1_agreement: 1, ppl_delta: 0 });
  });

  it('KL, perplexity and agreement of a known pair', () => {
    const s = new QuantErrorStats();
    // P = (1/2, 1/2), Q = (1/(1+e), e/(1+e)): KL = log((1+e)/2) - 1/2; the argmaxes differ (0 vs 1).
    s.add(Float32Array.from([0, 0]), Float32Array.from([0, 1]), 0);
    const r = s.summary();
    expect(r.kl_mean).toBeCloseTo(Math.log((1 + Math.E) / 2) - 0.5, 12);
    expect(r.ppl_original).toBeCloseTo(2, 12);
    expect(r.ppl).toBeCloseTo(1 + Math.E, 6);
    expect(r.top1_agreement).toBe(0);
    expect(() => s.add(new Float32Array(2), new Float32Array(3), 0)).toThrow(RangeError);
  });
});

describe('nerva-bench quant-error', () => {
  it('scores the original and a quantized type on the same teacher-forced windows', async () => {
    const lines = await quantErrorProbe({ model: TINY, text: TEXT, tokens: 33, window: 16, types: ['Q8_0'], backend: 'cpu' });
    expect(lines).toHaveLength(1);
    const r = lines[0] as Record<string, number> & { weights: { exact: boolean; file: string } };
    // 33 tokens: windows of 16, 16 and 1 (too short to score, dropped); 15 positions each.
    expect(r).toMatchObject({ probe: 'quant-error', type: 'Q8_0', backend: 'cpu', windows: 2, window: 16, positions: 30 });
    expect(r.weights).toMatchObject({ file: 'gguf', exact: false });
    expect(r.kl_mean).toBeGreaterThan(0);
    expect(r.kl_max).toBeGreaterThanOrEqual(r.kl_mean);
    expect(r.top1_agreement).toBeGreaterThan(0.5);
    expect(r.ppl_original).toBeGreaterThan(1);
    expect(r.ppl_delta).toBeCloseTo(r.ppl - r.ppl_original, 12);
  });

  it('refuses a window beyond the model and too little text', async () => {
    await expect(quantErrorProbe({ model: TINY, text: TEXT, tokens: 64, window: 100_000, types: ['Q8_0'] })).rejects.toThrow(/window must be/);
    await expect(quantErrorProbe({ model: TINY, text: TEXT, tokens: 1, types: ['Q8_0'] })).rejects.toThrow(/at least 2/);
  });
});
