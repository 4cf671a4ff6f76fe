import { argmaxRow, sampleRow, uniformFromSeed } from '@nerva/core';
import { roundToBf16 } from '@nerva/core/conformance';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/index.js';
import { causalAttentionF64, matmulF64, moeMlpF64, moeRouteF64, rmsnormF64, ropeHeadF64, siluMulF64 } from './formulas.js';
import { expectClose, randn, rng, upload, zeros } from './helpers.js';

// The tolerance comes from the arithmetic, not from the backend under test: the formulas below
// run in float64 on the same float32 inputs, and the backend accumulates in float64 and rounds
// its result to float32 once, which moves a value v by at most F32_U·|v| (float32's unit
// roundoff; the float64 sums' own error, ~n·2^-53, is far below it). The ops that store an
// intermediate in float32 (the QK-normed head before rotation, the MoE expert's activation)
// round once more, carried through the op's remaining steps. 4·F32_U of max |reference| covers
// two roundings with 2x room; the worst measured here is 0.8·F32_U.
const F32_U = 2 ** -24;
const tol = 4 * F32_U;

let be: CpuBackend;
beforeEach(() => {
  be = new CpuBackend();
});
afterEach(() => {
  be.dispose();
});

describe('CpuBackend against float64 formulas', () => {
  it('matmul: one row and many, bias, weightOffset, bf16 weights', () => {
    const r = rng(1);
    for (const [rows, inDim, outDim, off, withBias, wdt] of [
      [1, 256, 4096, 0, false, 'f32'],
      [7, 67, 33, 11, true, 'f32'],
      [3, 130, 9, 0, true, 'bf16'],
    ] as const) {
      const x = randn(r, rows * inDim);
      const wHost = randn(r, off + inDim * outDim, 0.1);
      if (wdt === 'bf16') roundToBf16(wHost);
      const bias = withBias ? randn(r, outDim) : undefined;
      const out = zeros(be, rows * outDim);
      be.run('matmul', {
        x: upload(be, x),
        weight: upload(be, wHost, wdt),
        out,
        rows,
        inDim,
        outDim,
        weightOffset: off,
        ...(bias ? { bias: upload(be, bias) } : {}),
      });
      expectClose(be.read(out), matmulF64(x, wHost, rows, inDim, outDim, bias, off), tol);
    }
  });

  it('matmul with accumulate adds the float32 product into out (the residual update of rmsnorm)', () => {
    const r = rng(11);
    const [rows, inDim, outDim] = [5, 96, 24];
    const x = randn(r, rows * inDim);
    const wHost = randn(r, inDim * outDim, 0.1);
    const bias = randn(r, outDim);
    const start = randn(r, rows * outDim, 4);
    const out = upload(be, start);
    be.run('matmul', { x: upload(be, x), weight: upload(be, wHost), bias: upload(be, bias), out, rows, inDim, outDim, accumulate: true });
    // R(out + R(y)): the product rounded to float32 as the op stores it, then one float32 sum.
    const y = matmulF64(x, wHost, rows, inDim, outDim, bias, 0);
    const want = Float64Array.from(start, (v, i) => Math.fround(v + Math.fround(y[i])));
    expect(Array.from(be.read(out) as Float32Array)).toEqual(Array.from(want));
  });

  it('rmsnorm without and with the fused residual', () => {
    const r = rng(2);
    const rows = 3;
    const dim = 70;
    const x = randn(r, rows * dim, 3);
    const w = randn(r, dim);
    const res0 = randn(r, rows * dim);
    const out = zeros(be, rows * dim);
    const xb = upload(be, x);
    const wb = upload(be, w);
    be.run('rmsnorm', { x: xb, weight: wb, out, rows, dim, eps: 1e-6 });
    expectClose(be.read(out), rmsnormF64(x, w, rows, dim, 1e-6), tol);

    const residual = upload(be, res0);
    be.run('rmsnorm', { x: xb, weight: wb, out, rows, dim, eps: 1e-5, residual });
    const sum = Float32Array.from(res0, (v, i) => v + x[i]);
    expectClose(be.read(residual), sum, tol);
    expectClose(be.read(out), rmsnormF64(sum, w, rows, dim, 1e-5), tol);
  });

  it('rope with and without QK-norm, leaving other heads of the row untouched', () => {
    const r = rng(3);
    const rows = 4;
    const headDim = 32;
    const numHeads = 2;
    const rowStride = 5 * headDim + 3;
    const headOffset = 2 * headDim + 1;
    const inv = Float32Array.from({ length: headDim / 2 }, (_, i) => 1e6 ** ((-2 * i) / headDim));
    const pos = Int32Array.from([0, 1, 517, 30000]);
    for (const withNorm of [false, true]) {
      const x = randn(r, rows * rowStride);
      const norm = withNorm ? randn(r, headDim) : undefined;
      const xb = upload(be, x);
      be.run('rope', {
        x: xb,
        positions: upload(be, pos),
        invFreq: upload(be, inv),
        rows,
        numHeads,
        headDim,
        rowStride,
        headOffset,
        ...(norm ? { normWeight: upload(be, norm), eps: 1e-6 } : {}),
      });
      const want = Float64Array.from(x);
      for (let row = 0; row < rows; row++) {
        for (let h = 0; h < numHeads; h++) {
          const o = row * rowStride + headOffset + h * headDim;
          const head = Array.from(x.subarray(o, o + headDim));
          ropeHeadF64(head, pos[row], inv, norm, 1e-6).forEach((v, i) => (want[o + i] = v));
        }
      }
      expectClose(be.read(xb), want, tol);
    }
  });

  it('paged attention equals dense causal attention (GQA 1, 2, 4 and MQA, shuffled blocks)', () => {
    const r = rng(4);
    const T = 13;
    const D = 16;
    const blockSize = 4;
    for (const [H, KV] of [
      [4, 4],
      [4, 2],
      [8, 2],
      [6, 1],
    ]) {
      const q = randn(r, T * H * D);
      const k = randn(r, T * KV * D);
      const v = randn(r, T * KV * D);
      const nb = Math.ceil(T / blockSize);
      // Physical blocks in reverse order plus an unused one: the table, not the layout, decides.
      const table = Int32Array.from({ length: nb }, (_, b) => nb - b);
      const kCache = new Float32Array((nb + 1) * blockSize * KV * D).fill(1e3);
      const vCache = new Float32Array(kCache.length).fill(-1e3);
      for (let p = 0; p < T; p++) {
        const slot = table[Math.floor(p / blockSize)] * blockSize + (p % blockSize);
        kCache.set(k.subarray(p * KV * D, (p + 1) * KV * D), slot * KV * D);
        vCache.set(v.subarray(p * KV * D, (p + 1) * KV * D), slot * KV * D);
      }
      const out = zeros(be, T * H * D);
      const scale = 1 / Math.sqrt(D);
      be.run('attention', {
        q: upload(be, q),
        kCache: upload(be, kCache),
        vCache: upload(be, vCache),
        out,
        blockTables: upload(be, table),
        rowSeq: upload(be, new Int32Array(T)),
        positions: upload(be, Int32Array.from({ length: T }, (_, p) => p)),
        rows: T,
        numHeads: H,
        numKvHeads: KV,
        headDim: D,
        blockSize,
        maxBlocksPerSeq: nb,
        qRowStride: H * D,
        qOffset: 0,
        scale,
      });
      expectClose(be.read(out), causalAttentionF64(q, k, v, T, H, KV, D, scale), tol);
    }
  });

  it('silu_mul, including saturated gates', () => {
    const r = rng(5);
    const x = randn(r, 3 * 2 * 45, 10);
    const out = zeros(be, 3 * 45);
    be.run('silu_mul', { x: upload(be, x), out, rows: 3, dim: 45 });
    expectClose(be.read(out), siluMulF64(x, 3, 45), tol);
  });

  it('moe_route then moe_mlp equal the dense per-expert formulas', () => {
    const r = rng(6);
    const rows = 3;
    const E = 6;
    const topK = 2;
    const hidden = 10;
    const inter = 7;
    for (const normalize of [true, false]) {
      const logits = randn(r, rows * E, 2);
      const ids = zeros(be, rows * topK, 'i32');
      const wts = zeros(be, rows * topK);
      be.run('moe_route', { logits: upload(be, logits), topIds: ids, topWeights: wts, rows, numExperts: E, topK, normalize });
      const want = moeRouteF64(logits, rows, E, topK, normalize);
      expect(Array.from(be.read(ids))).toEqual(want.ids);
      expectClose(be.read(wts), want.weights, tol);

      const x = randn(r, rows * hidden);
      const gateUp = randn(r, E * 2 * inter * hidden, 0.3);
      const down = randn(r, E * hidden * inter, 0.3);
      const out = zeros(be, rows * hidden);
      be.run('moe_mlp', { x: upload(be, x), topIds: ids, topWeights: wts, gateUp: upload(be, gateUp), down: upload(be, down), out, rows, hidden, inter, topK });
      expectClose(be.read(out), moeMlpF64(x, want.ids, be.read(wts), gateUp, down, rows, hidden, inter, topK), tol);
    }
  });

  it('moe_route breaks exact ties toward the lower expert index', () => {
    const ids = zeros(be, 2, 'i32');
    const wts = zeros(be, 2);
    be.run('moe_route', { logits: upload(be, Float32Array.from([0.5, 2, 1, 2, 2])), topIds: ids, topWeights: wts, rows: 1, numExperts: 5, topK: 2, normalize: true });
    expect(Array.from(be.read(ids))).toEqual([1, 3]);
    expectClose(be.read(wts), [0.5, 0.5], tol);
  });

  it('embedding, gather_rows, add, kv_append, ring_push and advance_positions move exactly the right elements', () => {
    const r = rng(7);
    const table = randn(r, 10 * 4);
    const emb = zeros(be, 3 * 4);
    be.run('embedding', { table: upload(be, table), ids: upload(be, Int32Array.from([9, 0, 9])), out: emb, rows: 3, hidden: 4 });
    expect(Array.from(be.read(emb))).toEqual([...table.subarray(36, 40), ...table.subarray(0, 4), ...table.subarray(36, 40)]);

    const g = zeros(be, 2 * 4);
    be.run('gather_rows', { x: upload(be, table), rowIdx: upload(be, Int32Array.from([2, 2])), out: g, n: 2, dim: 4 });
    expect(Array.from(be.read(g))).toEqual([...table.subarray(8, 12), ...table.subarray(8, 12)]);

    const a = randn(r, 5);
    const b = randn(r, 5);
    const s = zeros(be, 5);
    be.run('add', { a: upload(be, a), b: upload(be, b), out: s, length: 5 });
    expect(Array.from(be.read(s))).toEqual(Array.from(a, (v, i) => Math.fround(v + b[i])));

    // Two rows of [k0 k1 | v0 v1] with stride 5; row 1 is padding.
    const src = Float32Array.from([1, 2, 3, 4, 99, 5, 6, 7, 8, 99]);
    const kc = upload(be, new Float32Array(6).fill(-1));
    const vc = upload(be, new Float32Array(6).fill(-1));
    be.run('kv_append', { src: upload(be, src), kCache: kc, vCache: vc, slots: upload(be, Int32Array.from([2, -1])), rows: 2, numKvHeads: 1, headDim: 2, rowStride: 5, kOffset: 0, vOffset: 2 });
    expect(Array.from(be.read(kc))).toEqual([-1, -1, -1, -1, 1, 2]);
    expect(Array.from(be.read(vc))).toEqual([-1, -1, -1, -1, 3, 4]);

    const ring = upload(be, new Int32Array(4).fill(-1));
    const cursor = upload(be, Int32Array.from([3]));
    be.run('ring_push', { src: upload(be, Int32Array.from([10, 11, 12])), ring, cursor, rows: 3, capacity: 4 });
    expect(Array.from(be.read(ring))).toEqual([11, 12, -1, 10]);
    expect(Array.from(be.read(cursor))).toEqual([6]);

    // Sequence 1's table is [5, 2]; row 0 at position 3 moves to 4: block 2, slot 2*4+0.
    const positions = upload(be, Int32Array.from([3, 0]));
    const slots = upload(be, Int32Array.from([-1, -1]));
    be.run('advance_positions', {
      positions,
      slots,
      blockTables: upload(be, Int32Array.from([0, 1, 5, 2])),
      rowSeq: upload(be, Int32Array.from([1, 0])),
      rows: 2,
      blockSize: 4,
      maxBlocksPerSeq: 2,
    });
    expect(Array.from(be.read(positions))).toEqual([4, 1]);
    expect(Array.from(be.read(slots))).toEqual([8, 1]);
  });

  it('argmax takes the lowest index on ties', () => {
    const logits = Float32Array.from([1, 5, 2, 5, /* row 1 */ -3, -1, -2, -1]);
    const out = zeros(be, 2, 'i32');
    be.run('argmax', { logits: upload(be, logits), out, rows: 2, vocab: 4 });
    expect(Array.from(be.read(out))).toEqual([1, 1]);
  });

  it('sample is sampleRow with the counter-based draw, and advances the counter', () => {
    const r = rng(8);
    const vocab = 300;
    const rows = 3;
    const logits = randn(r, rows * vocab, 2);
    const params = Float32Array.from([0.9, 0, 0.95, 0, 1, 20, 1, 0.1, 0, 0, 1, 0]);
    const state = Int32Array.from([-123456, 7, 42, 2147483647, 9, 0]);
    const rngBuf = upload(be, state);
    const lb = upload(be, logits);
    const pb = upload(be, params);
    const out = zeros(be, rows, 'i32');
    for (let draw = 0; draw < 3; draw++) {
      be.run('sample', { logits: lb, params: pb, rng: rngBuf, out, rows, vocab });
      const got = be.read(out);
      for (let row = 0; row < rows; row++) {
        const p = { temperature: params[row * 4], topK: params[row * 4 + 1], topP: params[row * 4 + 2], minP: params[row * 4 + 3] };
        const u = uniformFromSeed(state[row * 2], (state[row * 2 + 1] + draw) | 0);
        expect(got[row]).toBe(sampleRow(logits, row * vocab, vocab, p, u));
      }
      // Row 2 is greedy (temperature 0).
      expect(got[2]).toBe(argmaxRow(logits, 2 * vocab, vocab));
    }
    // Counters advanced by 3, the int32 one wrapping as a device int would.
    expect(Array.from(be.read(rngBuf))).toEqual([-123456, 10, 42, -2147483646, 9, 3]);
  });

  it('sample draws tokens with the softmax frequencies (temperature 1, no truncation)', () => {
    const logits = Float32Array.from([0, Math.log(2), Math.log(3), Math.log(4)]);
    const n = 4000;
    const lb = upload(be, logits);
    const pb = upload(be, Float32Array.from([1, 0, 1, 0]));
    const rngBuf = upload(be, Int32Array.from([2024, 0]));
    const out = zeros(be, 1, 'i32');
    const counts = [0, 0, 0, 0];
    for (let i = 0; i < n; i++) {
      be.run('sample', { logits: lb, params: pb, rng: rngBuf, out, rows: 1, vocab: 4 });
      counts[be.read(out)[0]]++;
    }
    // Expected 0.1, 0.2, 0.3, 0.4; a binomial standard deviation at n=4000 is under 0.008.
    counts.forEach((c, i) => expect(Math.abs(c / n - (i + 1) / 10)).toBeLessThan(0.03));
  });

  it('bf16 and f16 buffers hold values rounded to their type', () => {
    const bb = zeros(be, 3, 'bf16');
    be.write(bb, Float32Array.from([1 + 2 ** -9, 1 + 3 * 2 ** -9, -0.1]));
    // bf16 keeps 7 mantissa bits: 1 + 2^-9 rounds down to 1, 1 + 3*2^-9 up to 1 + 2^-7.
    expect(Array.from(be.read(bb))).toEqual([1, 1 + 2 ** -7, roundToBf16(Float32Array.from([-0.1]))[0]]);
    const hb = zeros(be, 2, 'f16');
    be.write(hb, Uint16Array.from([0x3c00, 0xc000]));
    expect(Array.from(be.read(hb))).toEqual([1, -2]);
    // kv_append into a bf16 cache rounds what it stores.
    const kc = zeros(be, 2, 'bf16');
    const vc = zeros(be, 2, 'bf16');
    be.run('kv_append', { src: upload(be, Float32Array.from([1 + 3 * 2 ** -9, 0.1])), kCache: kc, vCache: vc, slots: upload(be, Int32Array.from([1])), rows: 1, numKvHeads: 1, headDim: 1, rowStride: 2, kOffset: 0, vOffset: 1 });
    expect(Array.from(be.read(kc))).toEqual([0, 1 + 2 ** -7]);
    expect(be.read(vc)[1]).toBe(roundToBf16(Float32Array.from([0.1]))[0]);
  });
});
