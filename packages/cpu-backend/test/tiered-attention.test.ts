import { describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/index.js';

/** A tiny deterministic generator (tests only). */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 4294967296;
  };
}

describe('tiered attention: partials over any split of the pages, merged, equal the whole attention', () => {
  it('random tier assignments, windows and shapes never change the output beyond float rounding', () => {
    for (let trial = 0; trial < 40; trial++) {
      const r = rng(trial + 1);
      const be = new CpuBackend();
      const numKvHeads = 1 + Math.floor(r() * 3);
      const numHeads = numKvHeads * (1 + Math.floor(r() * 3));
      const headDim = 4 + Math.floor(r() * 20);
      const bs = 1 + Math.floor(r() * 5);
      const seqLens = Array.from({ length: 1 + Math.floor(r() * 3) }, () => 1 + Math.floor(r() * 40));
      const window = r() < 0.3 ? 1 + Math.floor(r() * 12) : undefined;
      const maxBlocks = Math.max(...seqLens.map((n) => Math.ceil(n / bs)));
      const numBlocks = seqLens.reduce((a, n) => a + Math.ceil(n / bs), 0) + 1;
      const kvw = numKvHeads * headDim;
      const qw = numHeads * headDim;
      const full = new Int32Array(seqLens.length * maxBlocks);
      const hotT = new Int32Array(full.length).fill(-1);
      const warmT = new Int32Array(full.length).fill(-1);
      let next = 1;
      for (let q = 0; q < seqLens.length; q++) {
        for (let b = 0; b < Math.ceil(seqLens[q] / bs); b++) {
          const id = next++;
          full[q * maxBlocks + b] = id;
          (r() < 0.5 ? hotT : warmT)[q * maxBlocks + b] = id;
        }
      }
      const normals = (n: number, scale = 1) => Float32Array.from({ length: n }, () => (r() + r() + r() - 1.5) * 2 * scale);
      const k = normals(numBlocks * bs * kvw, 2);
      const v = normals(numBlocks * bs * kvw);
      const rows = seqLens.length;
      const q = normals(rows * qw, 2);
      const buf = (data: Float32Array | Int32Array, tier?: 'pinned') => {
        const b = be.alloc({ dtype: data instanceof Int32Array ? 'i32' : 'f32', length: data.length, ...(tier ? { tier } : {}) });
        be.write(b, data);
        return b;
      };
      const qb = buf(q);
      const kh = buf(k);
      const vh = buf(v);
      const kw = buf(k, 'pinned');
      const vw = buf(v, 'pinned');
      const rowSeq = buf(Int32Array.from(seqLens.map((_, i) => i)));
      const positions = buf(Int32Array.from(seqLens.map((n) => n - 1)));
      const common = { q: qb, rowSeq, positions, rows, numHeads, numKvHeads, headDim, blockSize: bs, maxBlocksPerSeq: maxBlocks, qRowStride: qw, qOffset: 0, scale: 1 / Math.sqrt(headDim), ...(window ? { window } : {}) };
      const whole = buf(new Float32Array(rows * qw));
      be.run('attention', { ...common, kCache: kh, vCache: vh, out: whole, blockTables: buf(full) });
      const out = buf(new Float32Array(rows * qw));
      const lse = buf(new Float32Array(rows * numHeads));
      const wout = buf(new Float32Array(rows * qw));
      const wlse = buf(new Float32Array(rows * numHeads));
      be.run('attention', { ...common, kCache: kh, vCache: vh, out, lse, blockTables: buf(hotT) });
      be.run('attention', { ...common, kCache: kw, vCache: vw, out: wout, lse: wlse, blockTables: buf(warmT) });
      be.run('attention_merge', { out, lse, other: wout, otherLse: wlse, rows, numHeads, headDim });
      const want = be.read(whole) as Float32Array;
      const got = be.read(out) as Float32Array;
      const max = want.reduce((m, x) => Math.max(m, Math.abs(x)), 0);
      for (let i = 0; i < want.length; i++) expect(Math.abs(got[i] - want[i])).toBeLessThanOrEqual(1e-6 * max + 1e-7);
      be.dispose();
    }
  });
});
