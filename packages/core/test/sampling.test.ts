import { describe, expect, it } from 'vitest';
import { argmaxRow, bf16ToF32, decodeHalf, encodeHalf, f16ToF32, f32ToBf16, f32ToF16, mix32, sampleRow, type SampleParams, uniformFromSeed } from '../src/index.js';

describe('sampling rule', () => {
  it('uniformFromSeed is deterministic, in [0,1) and roughly uniform', () => {
    expect(uniformFromSeed(42, 7)).toBe(uniformFromSeed(42, 7));
    expect(uniformFromSeed(42, 7)).not.toBe(uniformFromSeed(42, 8));
    const bins = new Array(10).fill(0);
    for (let i = 0; i < 20000; i++) {
      const u = uniformFromSeed(1234, i);
      expect(u).toBeGreaterThanOrEqual(0);
      expect(u).toBeLessThan(1);
      bins[Math.floor(u * 10)]++;
    }
    for (const b of bins) expect(Math.abs(b - 2000)).toBeLessThan(200);
    expect(mix32(0)).toBe(0);
    expect(mix32(1)).not.toBe(1);
  });

  it('greedy at temperature 0 picks the lowest index among ties', () => {
    expect(argmaxRow([1, 3, 3, 2])).toBe(1);
    expect(sampleRow([1, 3, 3, 2], 0, 4, { temperature: 0, topK: 0, topP: 1, minP: 0 }, 0.99)).toBe(1);
  });

  it('matches the softmax distribution, and top-k / top-p / min-p restrict the support', () => {
    const logits = [2, 1, 0.5, 0, -1];
    const p = { temperature: 1, topK: 0, topP: 1, minP: 0 };
    const counts = new Array(5).fill(0);
    const N = 20000;
    for (let i = 0; i < N; i++) counts[sampleRow(logits, 0, 5, p, uniformFromSeed(9, i))]++;
    const z = logits.reduce((a, l) => a + Math.exp(l), 0);
    logits.forEach((l, i) => expect(Math.abs(counts[i] / N - Math.exp(l) / z)).toBeLessThan(0.015));
    const support = (q: typeof p) => {
      const s = new Set<number>();
      for (let i = 0; i < 3000; i++) s.add(sampleRow(logits, 0, 5, q, uniformFromSeed(3, i)));
      return [...s].sort();
    };
    expect(support({ ...p, topK: 2 })).toEqual([0, 1]);
    // softmax: 0.574, 0.211, 0.128, ... -> top_p 0.7 keeps the first two
    expect(support({ ...p, topP: 0.7 })).toEqual([0, 1]);
    // min_p 0.3 keeps tokens with p >= 0.3 * 0.574 = 0.172
    expect(support({ ...p, minP: 0.3 })).toEqual([0, 1]);
    expect(support({ ...p, topK: 1 })).toEqual([0]);
  });
});

describe('half-precision conversions', () => {
  it('round-trips bf16 and f16 with round-to-nearest-even', () => {
    expect(bf16ToF32(f32ToBf16(1))).toBe(1);
    expect(bf16ToF32(f32ToBf16(-2.5))).toBe(-2.5);
    // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (1.0).
    expect(bf16ToF32(f32ToBf16(1 + 2 ** -8))).toBe(1);
    expect(bf16ToF32(f32ToBf16(1 + 3 * 2 ** -8))).toBe(1 + 2 ** -6);
    expect(f16ToF32(f32ToF16(0.1))).toBeCloseTo(0.0999755859375, 12);
    expect(f16ToF32(f32ToF16(65504))).toBe(65504);
    expect(f16ToF32(f32ToF16(1e6))).toBe(Infinity);
    expect(f16ToF32(f32ToF16(2 ** -24))).toBe(2 ** -24);
    expect(Number.isNaN(bf16ToF32(f32ToBf16(NaN)))).toBe(true);
    const src = Float32Array.from([0, 1.5, -3.25, 1024]);
    expect([...decodeHalf('bf16', encodeHalf('bf16', src))]).toEqual([...src]);
    expect([...decodeHalf('f16', encodeHalf('f16', src))]).toEqual([...src]);
  });
});

/** The rule as written before partial selection: a full sort of the row, then the cuts. */
function sampleRowFullSort(logits: Float32Array, vocab: number, p: SampleParams, u: number): number {
  if (!(p.temperature > 0)) return argmaxRow(logits, 0, vocab);
  let max = -Infinity;
  for (let i = 0; i < vocab; i++) max = Math.max(max, logits[i]);
  const prob = new Float64Array(vocab);
  let sum = 0;
  for (let i = 0; i < vocab; i++) sum += prob[i] = Math.exp((logits[i] - max) / p.temperature);
  for (let i = 0; i < vocab; i++) prob[i] /= sum;
  const idx = Int32Array.from({ length: vocab }, (_, i) => i).sort((a, b) => prob[b] - prob[a] || a - b);
  let n = vocab;
  if (p.topK > 0 && p.topK < n) n = p.topK;
  if (p.topP < 1) {
    let c = 0;
    let k = 0;
    while (k < n) {
      c += prob[idx[k]];
      k++;
      if (c >= p.topP) break;
    }
    n = Math.max(1, k);
  }
  if (p.minP > 0) {
    const floor = p.minP * prob[idx[0]];
    let k = 1;
    while (k < n && prob[idx[k]] >= floor) k++;
    n = k;
  }
  let kept = 0;
  for (let k = 0; k < n; k++) kept += prob[idx[k]];
  let c = 0;
  for (let k = 0; k < n; k++) {
    c += prob[idx[k]];
    if (c > u * kept) return idx[k];
  }
  return idx[n - 1];
}

describe('sampleRow with partial selection', () => {
  it('gives the full sort\'s token for every cut, on rows with ties, flat and peaked rows', () => {
    let seed = 7;
    const rnd = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
    for (let t = 0; t < 400; t++) {
      const vocab = [5, 100, 3000, 20000][t % 4];
      const kind = t % 5;
      const logits = Float32Array.from({ length: vocab }, (_, i) =>
        kind === 0 ? 0 : kind === 1 ? Math.round(rnd() * 4) : kind === 2 ? -i * 0.001 : kind === 3 ? rnd() * 30 : rnd() * 3,
      );
      const p: SampleParams = {
        temperature: [0.3, 1, 2.5, 100][t % 4],
        topK: [0, 1, 7, 50, 5000, vocab + 3][Math.floor(rnd() * 6)],
        topP: [1, 0.999, 0.9, 0.5, 0.01][Math.floor(rnd() * 5)],
        minP: [0, 0, 0.05, 0.5, 1e-9][Math.floor(rnd() * 5)],
      };
      for (const u of [0, rnd(), 0.999999]) {
        expect(sampleRow(logits, 0, vocab, p, u), JSON.stringify({ t, vocab, kind, p, u })).toBe(sampleRowFullSort(logits, vocab, p, u));
      }
    }
  });

  it('a float32 row without a cut (sorted by radix) gives the comparator sort\'s token: ties, -0, -Infinity, equal p from distinct logits', () => {
    let seed = 11;
    const rnd = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
    const none = { topK: 0, topP: 1, minP: 0 };
    const rows: [string, Float32Array][] = [
      ['random', Float32Array.from({ length: 30000 }, () => rnd() * 20 - 10)],
      ['ties', Float32Array.from({ length: 30000 }, () => Math.round(rnd() * 8) - 4)],
      ['signed zeros and bans', Float32Array.from({ length: 5000 }, (_, i) => [0, -0, -Infinity, 1, -1][i % 5])],
      // Neighbouring float32 logits whose p an extreme temperature rounds to one value: ordered by id.
      ['near-equal', Float32Array.from({ length: 5000 }, (_, i) => 1 + (i % 7) * 2 ** -23)],
    ];
    for (const [name, logits] of rows)
      for (const temperature of [0.5, 1, 100, 1e12])
        for (const u of [0, 0.25, rnd(), 0.999999]) {
          const p = { temperature, ...none };
          // A float64 copy takes the comparator sort: the same rule, sorted the slow way.
          expect(sampleRow(logits, 0, logits.length, p, u), `${name} T=${temperature} u=${u}`).toBe(sampleRow(Float64Array.from(logits), 0, logits.length, p, u));
          expect(sampleRow(logits, 0, logits.length, p, u)).toBe(sampleRowFullSort(logits, logits.length, p, u));
        }
  });
});
