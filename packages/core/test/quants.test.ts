/**
 * ggml block formats: hand-built blocks decode to the values the layouts define (the expected
 * values are worked out here from the layout description, with scales that are powers of two so
 * every expected value is exact), quantization error bounds, exact round trips, zero blocks, bad
 * lengths and determinism. Bytes and values against llama.cpp itself: quants-known-answers.test.ts.
 */
import { f16ToF32, f32ToF16 } from '../src/dtype.js';
import { describe, expect, it } from 'vitest';
import { GGML_TYPES, type GgmlTypeName } from '../src/quant/ggml-types.js';
import { dequantize, quantize, QUANT_TYPES_READABLE, QUANT_TYPES_WRITABLE } from '../src/quant/index.js';

const LEGACY = ['Q4_0', 'Q4_1', 'Q5_0', 'Q5_1', 'Q8_0'] as const;
const KQUANTS = ['Q2_K', 'Q3_K', 'Q4_K', 'Q5_K', 'Q6_K'] as const;
const BLOCK_TYPES = [...LEGACY, ...KQUANTS];

/** Deterministic bytes/values without Math.random (an LCG). */
function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s >>> 8;
  };
}

/** Roughly normal values (sum of four uniforms), `n` of them, scaled by `scale`. */
function bell(n: number, seed: number, scale = 1): Float32Array {
  const r = lcg(seed);
  const u = () => r() / 8388608 - 1;
  return Float32Array.from({ length: n }, () => ((u() + u() + u() + u()) / 2) * scale);
}

function half(out: Uint8Array, o: number, x: number): void {
  const h = f32ToF16(x);
  expect(f16ToF32(h)).toBe(x); // the test's scales are exact in f16
  out[o] = h & 0xff;
  out[o + 1] = h >> 8;
}

function decodeAll(type: GgmlTypeName, bytes: Uint8Array): Float32Array {
  return dequantize(type, bytes, (bytes.length / GGML_TYPES[type].typeSize) * GGML_TYPES[type].blockSize);
}

describe('dequantize: hand-built blocks decode as the layouts define', () => {
  it('Q8_0: f16 d then 32 signed bytes, value q*d', () => {
    const b = new Uint8Array(34);
    half(b, 0, -0.25);
    const q = Array.from({ length: 32 }, (_, j) => ((j * 9) % 256) - 128);
    q.forEach((v, j) => (b[2 + j] = v & 0xff));
    expect(Array.from(decodeAll('Q8_0', b))).toEqual(q.map((v) => v * -0.25));
  });

  it('Q4_0: f16 d, byte j holds element j (low nibble) and j+16 (high nibble), value (q-8)*d', () => {
    const b = new Uint8Array(18);
    half(b, 0, 0.5);
    const lo = (j: number) => j;
    const hi = (j: number) => 15 - ((j * 5) % 16);
    for (let j = 0; j < 16; j++) b[2 + j] = lo(j) | (hi(j) << 4);
    const want = [...Array.from({ length: 16 }, (_, j) => (lo(j) - 8) * 0.5), ...Array.from({ length: 16 }, (_, j) => (hi(j) - 8) * 0.5)];
    expect(Array.from(decodeAll('Q4_0', b))).toEqual(want);
  });

  it('Q4_1: f16 d, f16 m, nibbles as Q4_0, value q*d + m', () => {
    const b = new Uint8Array(20);
    half(b, 0, 0.125);
    half(b, 2, -1.5);
    for (let j = 0; j < 16; j++) b[4 + j] = (15 - j) | (((j * 3) % 16) << 4);
    const want = [...Array.from({ length: 16 }, (_, j) => (15 - j) * 0.125 - 1.5), ...Array.from({ length: 16 }, (_, j) => ((j * 3) % 16) * 0.125 - 1.5)];
    expect(Array.from(decodeAll('Q4_1', b))).toEqual(want);
  });

  it('Q5_0 and Q5_1: bit j of the little-endian u32 qh is the fifth bit of element j', () => {
    const qh = 0xa5c3f00f;
    const nib = (e: number) => (e * 7 + 3) % 16;
    const q5 = (e: number) => nib(e) | (((qh >>> e) & 1) << 4);
    const fill = (b: Uint8Array, qhAt: number, qsAt: number) => {
      b[qhAt] = qh & 0xff;
      b[qhAt + 1] = (qh >>> 8) & 0xff;
      b[qhAt + 2] = (qh >>> 16) & 0xff;
      b[qhAt + 3] = qh >>> 24;
      for (let j = 0; j < 16; j++) b[qsAt + j] = nib(j) | (nib(j + 16) << 4);
    };
    const b0 = new Uint8Array(22);
    half(b0, 0, 0.0625);
    fill(b0, 2, 6);
    expect(Array.from(decodeAll('Q5_0', b0))).toEqual(Array.from({ length: 32 }, (_, e) => (q5(e) - 16) * 0.0625));
    const b1 = new Uint8Array(24);
    half(b1, 0, 0.5);
    half(b1, 2, 0.25);
    fill(b1, 4, 8);
    expect(Array.from(decodeAll('Q5_1', b1))).toEqual(Array.from({ length: 32 }, (_, e) => q5(e) * 0.5 + 0.25));
  });

  // In Q2_K/Q3_K a quant byte holds four elements 32 apart within a 128-element half: element e
  // is at byte 32*(e>>7) + (e&31), bits 2*((e&127)>>5).
  const q2At = (e: number) => ({ byte: 32 * (e >> 7) + (e & 31), shift: 2 * ((e & 127) >> 5) });

  it('Q2_K: scales byte per 16 (low nibble scale, high nibble min), 2-bit quants, then f16 d and dmin', () => {
    const b = new Uint8Array(84);
    const r = lcg(5);
    const sc = Array.from({ length: 16 }, (_, s) => s);
    const mn = Array.from({ length: 16 }, (_, s) => (s * 7) % 16);
    for (let s = 0; s < 16; s++) b[s] = sc[s] | (mn[s] << 4);
    for (let i = 0; i < 64; i++) b[16 + i] = r() & 0xff;
    half(b, 80, 0.5);
    half(b, 82, -0.25);
    const want = Array.from({ length: 256 }, (_, e) => {
      const { byte, shift } = q2At(e);
      const q = (b[16 + byte] >> shift) & 3;
      return 0.5 * sc[e >> 4] * q - -0.25 * mn[e >> 4];
    });
    expect(Array.from(decodeAll('Q2_K', b))).toEqual(want);
  });

  it('Q3_K: hmask (clear bit subtracts 4), 2-bit quants, sixteen 6-bit scales biased by 32, f16 d', () => {
    const b = new Uint8Array(110);
    const r = lcg(6);
    for (let i = 0; i < 96; i++) b[i] = r() & 0xff; // hmask and quants
    const sc6 = Array.from({ length: 16 }, (_, s) => (s * 13 + 5) % 64);
    // Scale s: low 4 bits in byte s (s < 8, low nibble) or byte s-8 (high nibble); high 2 bits
    // in byte 8 + s%4 at bit pair s/4.
    for (let s = 0; s < 16; s++) {
      if (s < 8) b[96 + s] |= sc6[s] & 15;
      else b[96 + s - 8] |= (sc6[s] & 15) << 4;
      b[96 + 8 + (s % 4)] |= (sc6[s] >> 4) << (2 * Math.floor(s / 4));
    }
    half(b, 108, 0.125);
    const want = Array.from({ length: 256 }, (_, e) => {
      const { byte, shift } = q2At(e);
      const low = (b[32 + byte] >> shift) & 3;
      // hmask: byte e%32, bit e/32.
      const high = (b[e & 31] >> (e >> 5)) & 1;
      return 0.125 * (sc6[e >> 4] - 32) * (low - (high ? 0 : 4));
    });
    expect(Array.from(decodeAll('Q3_K', b))).toEqual(want);
  });

  /** Packs eight 6-bit scales and mins the way Q4_K/Q5_K store them in 12 bytes. */
  function packScaleMin(sc: number[], mn: number[]): Uint8Array {
    const p = new Uint8Array(12);
    for (let j = 0; j < 8; j++) {
      if (j < 4) {
        p[j] = sc[j];
        p[j + 4] = mn[j];
      } else {
        p[j + 4] = (sc[j] & 15) | ((mn[j] & 15) << 4);
        p[j - 4] |= (sc[j] >> 4) << 6;
        p[j] |= (mn[j] >> 4) << 6;
      }
    }
    return p;
  }
  const sc8 = [1, 63, 17, 32, 48, 5, 60, 33];
  const mn8 = [0, 62, 40, 3, 16, 31, 47, 63];

  it('Q4_K: f16 d and dmin, 6-bit scale/min pairs, byte 32c+l holds elements 64c+l and 64c+32+l', () => {
    const b = new Uint8Array(144);
    half(b, 0, 0.25);
    half(b, 2, 0.0625);
    b.set(packScaleMin(sc8, mn8), 4);
    const r = lcg(7);
    for (let i = 0; i < 128; i++) b[16 + i] = r() & 0xff;
    const want = Array.from({ length: 256 }, (_, e) => {
      const c = e >> 6;
      const upper = (e & 63) >= 32;
      const byte = b[16 + 32 * c + (e & 31)];
      const q = upper ? byte >> 4 : byte & 15;
      const g = e >> 5;
      return 0.25 * sc8[g] * q - 0.0625 * mn8[g];
    });
    expect(Array.from(decodeAll('Q4_K', b))).toEqual(want);
  });

  it('Q5_K: as Q4_K plus qh, whose byte l holds the fifth bits of elements l+32k at bit k', () => {
    const b = new Uint8Array(176);
    half(b, 0, 0.5);
    half(b, 2, 0.125);
    b.set(packScaleMin(sc8, mn8), 4);
    const r = lcg(8);
    for (let i = 0; i < 160; i++) b[16 + i] = r() & 0xff;
    const want = Array.from({ length: 256 }, (_, e) => {
      const c = e >> 6;
      const upper = (e & 63) >= 32;
      const byte = b[48 + 32 * c + (e & 31)];
      const high = (b[16 + (e & 31)] >> (e >> 5)) & 1;
      const q = (upper ? byte >> 4 : byte & 15) + 16 * high;
      const g = e >> 5;
      return 0.5 * sc8[g] * q - 0.125 * mn8[g];
    });
    expect(Array.from(decodeAll('Q5_K', b))).toEqual(want);
  });

  it('Q6_K: low nibbles, 2-bit highs, 16 signed scales, f16 d; value d*sc*(q-32)', () => {
    const b = new Uint8Array(210);
    const r = lcg(9);
    for (let i = 0; i < 192; i++) b[i] = r() & 0xff;
    const sc = Array.from({ length: 16 }, (_, s) => ((s * 37) % 256) - 128);
    sc.forEach((v, s) => (b[192 + s] = v & 0xff));
    half(b, 208, -0.03125);
    const want = Array.from({ length: 256 }, (_, e) => {
      // Element e: half h, quarter k of that half, position l: low nibble from ql (quarters 0/1
      // low nibbles of bytes l and l+32, quarters 2/3 their high nibbles), high bits pair k of qh.
      const h = e >> 7;
      const k = (e & 127) >> 5;
      const l = e & 31;
      const qlByte = b[64 * h + l + 32 * (k & 1)];
      const low = k >= 2 ? qlByte >> 4 : qlByte & 15;
      const high = (b[128 + 32 * h + l] >> (2 * k)) & 3;
      return -0.03125 * sc[e >> 4] * ((low | (high << 4)) - 32);
    });
    expect(Array.from(decodeAll('Q6_K', b))).toEqual(want);
  });

  it('decodes every block of a multi-block buffer, from a view with a byte offset, into a given dst', () => {
    const x = bell(512, 11);
    const q = quantize('Q4_K', x);
    const padded = new Uint8Array(q.length + 7);
    padded.set(q, 5);
    const dst = new Float32Array(520).fill(7);
    const got = dequantize('Q4_K', padded.subarray(5, 5 + q.length), 512, dst);
    expect(got).toBe(dst);
    expect(Array.from(dst.subarray(0, 512))).toEqual(Array.from(dequantize('Q4_K', q, 512)));
    expect(dst[512]).toBe(7); // nothing written past the elements asked for
    expect(Array.from(dequantize('Q4_K', q.subarray(144), 256))).toEqual(Array.from(dst.subarray(256, 512)));
  });
});

describe('quantize: error bounds', () => {
  const inputs: [string, Float32Array][] = [
    ['bell-shaped', bell(4096, 1, 0.05)],
    ['wide', bell(4096, 2, 300)],
    ['positive', bell(4096, 3).map((v) => Math.abs(v) + 0.5)],
    ['with outliers', bell(4096, 4, 0.01).map((v, i) => (i % 97 === 0 ? v * 400 : v))],
  ];

  it.each(inputs)('Q8_0 (%s): every value within d/2 of its block, d = absmax/127 (plus the f16 rounding of d)', (_, x) => {
    const y = dequantize('Q8_0', quantize('Q8_0', x), x.length);
    for (let b = 0; b < x.length; b += 32) {
      let amax = 0;
      for (let j = b; j < b + 32; j++) amax = Math.max(amax, Math.abs(x[j]));
      const d = amax / 127;
      const d16 = f16ToF32(f32ToF16(d));
      const bound = d / 2 + 127 * Math.abs(d - d16) + amax * 2 ** -21;
      for (let j = b; j < b + 32; j++) expect(Math.abs(x[j] - y[j])).toBeLessThanOrEqual(bound);
    }
  });

  // Symmetric types put the extreme value at level 0 exactly, so the opposite extreme may clip by
  // up to a whole step; asymmetric ones span [min, max] and round to within half a step.
  const legacyBound: Record<string, (x: Float32Array, b: number) => number> = {
    Q4_0: (x, b) => symmetricBound(x, b, 8),
    Q5_0: (x, b) => symmetricBound(x, b, 16),
    Q4_1: (x, b) => asymmetricBound(x, b, 15),
    Q5_1: (x, b) => asymmetricBound(x, b, 31),
  };
  function symmetricBound(x: Float32Array, b: number, levels: number): number {
    let amax = 0;
    for (let j = b; j < b + 32; j++) amax = Math.max(amax, Math.abs(x[j]));
    const d = amax / levels;
    return d + levels * Math.abs(d - f16ToF32(f32ToF16(d))) + amax * 2 ** -20;
  }
  function asymmetricBound(x: Float32Array, b: number, levels: number): number {
    let min = Infinity;
    let max = -Infinity;
    for (let j = b; j < b + 32; j++) {
      min = Math.min(min, x[j]);
      max = Math.max(max, x[j]);
    }
    const d = (max - min) / levels;
    const fp16Err = levels * Math.abs(d - f16ToF32(f32ToF16(d))) + Math.abs(min - f16ToF32(f32ToF16(min)));
    return d / 2 + fp16Err + Math.max(Math.abs(min), Math.abs(max)) * 2 ** -20;
  }
  for (const type of ['Q4_0', 'Q4_1', 'Q5_0', 'Q5_1'] as const) {
    it.each(inputs)(`${type} (%s): within its block step`, (_, x) => {
      const y = dequantize(type, quantize(type, x), x.length);
      for (let b = 0; b < x.length; b += 32) {
        const bound = legacyBound[type](x, b);
        for (let j = b; j < b + 32; j++) expect(Math.abs(x[j] - y[j])).toBeLessThanOrEqual(bound);
      }
    });
  }

  /**
   * The K-quants requantize every value against the scales as stored, so each value decodes to
   * the level of its group nearest to it (clipped at the ends of the grid). The grid of each
   * group of 16/32 is rebuilt here from the decoded values' own parameters: for every value, no
   * other level of the grid lies nearer (up to a rounding slack of a millionth of a step).
   */
  const grid: Record<(typeof KQUANTS)[number], { group: number; levels: number[] }> = {
    Q2_K: { group: 16, levels: [0, 1, 2, 3] },
    Q3_K: { group: 16, levels: [-4, -3, -2, -1, 0, 1, 2, 3] },
    Q4_K: { group: 32, levels: Array.from({ length: 16 }, (_, i) => i) },
    Q5_K: { group: 32, levels: Array.from({ length: 32 }, (_, i) => i) },
    Q6_K: { group: 16, levels: Array.from({ length: 64 }, (_, i) => i - 32) },
  };
  function groupGrid(type: (typeof KQUANTS)[number], q: Uint8Array, e: number): { step: number; offset: number } {
    // The group's step and offset come from decoding two copies of its block whose quants are
    // forced to the lowest and the highest level, so the scales are never read here.
    const { typeSize } = GGML_TYPES[type];
    const block = q.slice(Math.floor(e / 256) * typeSize, Math.floor(e / 256) * typeSize + typeSize);
    const probe = (lvl: 'lo' | 'hi') => {
      const c = block.slice();
      setAllQuants(type, c, lvl);
      return dequantize(type, c, 256)[e % 256];
    };
    const lo = probe('lo');
    const hi = probe('hi');
    const [l0, l1] = [grid[type].levels[0], grid[type].levels[grid[type].levels.length - 1]];
    const step = (hi - lo) / (l1 - l0);
    return { step, offset: lo - step * l0 };
  }
  /** Forces every quant of a K block to its lowest ('lo') or highest ('hi') level. */
  function setAllQuants(type: (typeof KQUANTS)[number], c: Uint8Array, lvl: 'lo' | 'hi'): void {
    const all = (from: number, to: number, v: number) => c.fill(v, from, to);
    const hi = lvl === 'hi';
    if (type === 'Q2_K') all(16, 80, hi ? 0xff : 0);
    if (type === 'Q3_K') {
      all(0, 32, hi ? 0xff : 0); // hmask set: no -4
      all(32, 96, hi ? 0xff : 0);
    }
    if (type === 'Q4_K') all(16, 144, hi ? 0xff : 0);
    if (type === 'Q5_K') all(16, 176, hi ? 0xff : 0);
    if (type === 'Q6_K') all(0, 192, hi ? 0xff : 0);
  }

  for (const type of KQUANTS) {
    it.each(inputs)(`${type} (%s): each value decodes to the nearest level of its group`, (_, x) => {
      const q = quantize(type, x);
      const y = dequantize(type, q, x.length);
      const { group, levels } = grid[type];
      for (let g = 0; g < x.length; g += group) {
        const { step, offset } = groupGrid(type, q, g);
        if (step === 0) continue; // a zero scale: ggml keeps the search's levels, all decode alike
        for (let e = g; e < g + group; e++) {
          let best = Infinity;
          for (const l of levels) best = Math.min(best, Math.abs(x[e] - (offset + step * l)));
          expect(Math.abs(x[e] - y[e])).toBeLessThanOrEqual(best + Math.abs(step) * 1e-6 + Math.abs(x[e]) * 2 ** -21);
        }
      }
    });
  }

  // llama.cpp's tests/test-quantize-fns.cpp: data 0.1 + 2cos(i), 4096 values, error
  // sqrt(sum of squared differences) / n against its per-type limits.
  const LLAMA_LIMITS: Record<(typeof BLOCK_TYPES)[number], number> = {
    Q4_0: 0.002,
    Q4_1: 0.002,
    Q5_0: 0.002,
    Q5_1: 0.002,
    Q8_0: 0.002,
    Q2_K: 0.0075,
    Q3_K: 0.004,
    Q4_K: 0.002,
    Q5_K: 0.002,
    Q6_K: 0.002,
  };
  it.each(BLOCK_TYPES)("%s: within llama.cpp's own total-error limit on its synthetic data", (type) => {
    const x = Float32Array.from({ length: 4096 }, (_, i) => 0.1 + 2 * Math.fround(Math.cos(i)));
    const y = dequantize(type, quantize(type, x), x.length);
    let sum = 0;
    for (let i = 0; i < x.length; i++) sum += (x[i] - y[i]) ** 2;
    const err = Math.sqrt(sum) / x.length;
    expect(err).toBeGreaterThan(0); // these are lossy types: a zero would mean nothing was quantized
    expect(err).toBeLessThan(LLAMA_LIMITS[type]);
  });
});

describe('quantize: exact cases', () => {
  /** Values on a type's grid round-trip unchanged. */
  const exact: [GgmlTypeName, Float32Array][] = [
    // Q8_0: integers times 2^-4 with 127 present, so d = 2^-4 exactly.
    ['Q8_0', Float32Array.from({ length: 64 }, (_, i) => (i % 32 === 5 ? 127 : ((i * 37) % 255) - 127) / 16)],
    // Q4_0 / Q5_0: levels -8..7 (-16..15) times 0.25 with the extreme -8 (-16) in every block.
    ['Q4_0', Float32Array.from({ length: 64 }, (_, i) => (i % 32 === 0 ? -8 : ((i * 5) % 16) - 8) * 0.25)],
    ['Q5_0', Float32Array.from({ length: 64 }, (_, i) => (i % 32 === 0 ? -16 : ((i * 7) % 32) - 16) * 0.125)],
    // Q4_1 / Q5_1: min + q*d with both ends present.
    ['Q4_1', Float32Array.from({ length: 64 }, (_, i) => -1 + (i % 32 === 0 ? 0 : i % 32 === 1 ? 15 : (i * 3) % 16) * 0.125)],
    ['Q5_1', Float32Array.from({ length: 64 }, (_, i) => -2 + (i % 32 === 0 ? 0 : i % 32 === 1 ? 31 : (i * 3) % 32) * 0.25)],
    // Q6_K / Q3_K: every group of 16 holds the level -32 (-4) on a power-of-two grid.
    ['Q6_K', Float32Array.from({ length: 512 }, (_, i) => (i % 16 === 0 ? -32 : ((i * 29) % 64) - 32) / 64)],
    ['Q3_K', Float32Array.from({ length: 512 }, (_, i) => (i % 16 === 0 ? -4 : ((i * 3) % 8) - 4) / 8)],
  ];
  it.each(exact)('%s: values on the grid round-trip exactly', (type, x) => {
    expect(Array.from(dequantize(type, quantize(type, x), x.length))).toEqual(Array.from(x));
  });

  it("Q8_0: halves round away from zero (C's roundf), d = 1 from absmax 127", () => {
    const x = new Float32Array(32);
    x.set([127, -2.5, 2.5, -0.5, 0.5, -1.5, 1.5, -126.5]);
    const q = quantize('Q8_0', x);
    expect([q[0], q[1]]).toEqual([0x00, 0x3c]); // f16 1.0
    expect(Array.from(new Int8Array(q.buffer, 2, 8))).toEqual([127, -3, 3, -1, 1, -2, 2, -127]);
  });

  it.each(QUANT_TYPES_WRITABLE)('%s: all-zero (and negative-zero) blocks decode to zeros, no NaN from 0/0', (type) => {
    const n = 2 * GGML_TYPES[type].blockSize * (GGML_TYPES[type].blockSize === 1 ? 256 : 1);
    for (const z of [0, -0]) {
      const x = new Float32Array(n).fill(z);
      const y = dequantize(type, quantize(type, x), n);
      for (const v of y) expect(v === 0).toBe(true);
    }
  });

  it.each(BLOCK_TYPES)('%s: a zero block among others stays zero and the others are unaffected', (type) => {
    const bs = GGML_TYPES[type].blockSize;
    const x = bell(3 * bs, 21, 0.1);
    x.fill(0, bs, 2 * bs);
    const q = quantize(type, x);
    const y = dequantize(type, q, x.length);
    // ggml writes -0 where d is -0 (0 / -8): both zeros are zero.
    for (let i = bs; i < 2 * bs; i++) expect(Math.abs(y[i])).toBe(0);
    const alone = dequantize(type, quantize(type, x.slice(0, bs)), bs);
    expect(Array.from(y.subarray(0, bs))).toEqual(Array.from(alone)); // blocks are independent
  });

  it.each(BLOCK_TYPES)('%s: deterministic, and independent of the input view offset', (type) => {
    const x = bell(2048, 31, 0.02);
    const a = quantize(type, x);
    const b = quantize(type, x);
    expect(Buffer.from(a).equals(Buffer.from(b))).toBe(true);
    const padded = new Float32Array(2048 + 3);
    padded.set(x, 3);
    expect(Buffer.from(quantize(type, padded.subarray(3))).equals(Buffer.from(a))).toBe(true);
    expect(a.length).toBe((2048 / GGML_TYPES[type].blockSize) * GGML_TYPES[type].typeSize);
  });
});

describe('bad input', () => {
  it.each(BLOCK_TYPES)('%s: a length that is not whole blocks throws RangeError naming the type', (type) => {
    const bs = GGML_TYPES[type].blockSize;
    expect(() => quantize(type, new Float32Array(bs + 1))).toThrow(RangeError);
    expect(() => quantize(type, new Float32Array(bs + 1))).toThrow(`not a whole number of ${type} blocks of ${bs}`);
    expect(() => dequantize(type, new Uint8Array(GGML_TYPES[type].typeSize * 2), bs - 1)).toThrow(/not a whole number/);
  });

  it.each(BLOCK_TYPES)('%s: a short source buffer throws RangeError with the sizes', (type) => {
    const { blockSize, typeSize } = GGML_TYPES[type];
    const short = new Uint8Array(2 * typeSize - 1);
    expect(() => dequantize(type, short, 2 * blockSize)).toThrow(RangeError);
    expect(() => dequantize(type, short, 2 * blockSize)).toThrow(`${type}: ${2 * blockSize} elements need ${2 * typeSize} bytes, got ${2 * typeSize - 1}`);
  });

  it('a short destination throws RangeError instead of dropping values', () => {
    const q = quantize('Q8_0', bell(64, 3));
    expect(() => dequantize('Q8_0', q, 64, new Float32Array(63))).toThrow(/destination holds 63 values, 64 needed/);
  });

  it.each([NaN, Infinity, -Infinity])('a non-finite input (%s) throws RangeError naming its index', (bad) => {
    const x = bell(256, 4);
    x[77] = bad;
    for (const type of BLOCK_TYPES) {
      expect(() => quantize(type, x)).toThrow(RangeError);
      expect(() => quantize(type, x)).toThrow(`at index 77 is not finite`);
    }
  });

  it('types without a codec are refused with RangeError', () => {
    expect(() => quantize('Q8_K', new Float32Array(256))).toThrow('quantization to Q8_K is not supported');
    expect(() => dequantize('Q8_1', new Uint8Array(36), 32)).toThrow('dequantization of Q8_1 is not supported');
  });
});

describe('quantize: the non-linear 4-bit types', () => {
  const relRms = (x: Float32Array, y: Float32Array) => {
    let e = 0;
    let n = 0;
    for (let i = 0; i < x.length; i++) {
      e += (x[i] - y[i]) ** 2;
      n += x[i] ** 2;
    }
    return Math.sqrt(e / n);
  };

  // Their levels are denser near zero, where bell-shaped weights mostly are: IQ4_NL (Q4_0's 18 bytes
  // a block) and IQ4_XS (fewer bits still) both err less than Q4_0's evenly spaced levels.
  it.each([1, 2, 3])('IQ4_NL and IQ4_XS err less than Q4_0 on bell-shaped values (seed %i)', (seed) => {
    const x = bell(8192, seed, 0.02);
    const q40 = relRms(x, dequantize('Q4_0', quantize('Q4_0', x), x.length));
    const nl = relRms(x, dequantize('IQ4_NL', quantize('IQ4_NL', x), x.length));
    const xs = relRms(x, dequantize('IQ4_XS', quantize('IQ4_XS', x), x.length));
    expect(nl).toBeLessThan(q40);
    expect(xs).toBeLessThan(q40);
    expect(nl).toBeGreaterThan(0);
  });

  it('every value decodes to its block scale times one of the sixteen levels', () => {
    const levels = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];
    const x = bell(64, 9, 0.5);
    const q = quantize('IQ4_NL', x);
    const y = dequantize('IQ4_NL', q, 64);
    for (let b = 0; b < 2; b++) {
      const d = f16ToF32(q[18 * b] | (q[18 * b + 1] << 8));
      for (let j = 0; j < 32; j++) expect(levels.map((l) => Math.fround(d * l))).toContain(y[32 * b + j]);
    }
  });
});

describe('type lists', () => {
  it('the readable and writable lists hold the GGUF types the project reads and writes', () => {
    for (const t of ['F32', 'F16', 'BF16', 'Q8_0', 'Q4_0', 'Q4_1', 'Q5_0', 'Q5_1', 'Q4_K', 'Q5_K', 'Q6_K'] as const) {
      expect(QUANT_TYPES_READABLE).toContain(t);
      expect(QUANT_TYPES_WRITABLE).toContain(t);
    }
    for (const t of QUANT_TYPES_WRITABLE) expect(QUANT_TYPES_READABLE).toContain(t);
    expect(QUANT_TYPES_READABLE).not.toContain('Q8_K');
    expect(Object.isFrozen(QUANT_TYPES_READABLE) && Object.isFrozen(QUANT_TYPES_WRITABLE)).toBe(true);
  });

  it('every listed type actually round-trips a block', () => {
    for (const t of QUANT_TYPES_READABLE) {
      const n = Math.max(GGML_TYPES[t].blockSize, 32);
      const x = bell(n, 41, 0.5);
      const q = QUANT_TYPES_WRITABLE.includes(t) ? quantize(t, x) : new Uint8Array((n / GGML_TYPES[t].blockSize) * GGML_TYPES[t].typeSize);
      expect(dequantize(t, q, n)).toHaveLength(n);
    }
  });
});
