import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { CpuBackend, OpArgumentError } from '../src/index.js';
import { upload, zeros } from './helpers.js';

let be: CpuBackend;
beforeEach(() => {
  be = new CpuBackend();
});
afterEach(() => {
  be.dispose();
});

const seq = (n: number, f: (i: number) => number) => Float32Array.from({ length: n }, (_, i) => f(i));

describe('weightTail (a matrix in two buffers)', () => {
  const rows = 3, inDim = 8, outDim = 5, from = 3;
  const w = seq(outDim * inDim, (i) => Math.sin(i * 0.7) * 0.5);
  const x = seq(rows * inDim, (i) => Math.cos(i * 0.3));
  const bias = seq(outDim, (i) => i * 0.25 - 0.5);

  it('gives matmul and fused_matmul the same values as the matrix in one buffer', () => {
    const whole = upload(be, w);
    const head = upload(be, w.subarray(0, from * inDim));
    const tail = upload(be, w.subarray(from * inDim));
    const xb = upload(be, x);
    const b = upload(be, bias);
    const norm = upload(be, seq(inDim, (i) => 1 + i / 16));
    for (const op of ['matmul', 'fused_matmul'] as const) {
      const want = zeros(be, rows * outDim);
      const got = zeros(be, rows * outDim);
      const extra = op === 'fused_matmul' ? { normWeight: norm, eps: 1e-6 } : {};
      be.run(op, { x: xb, weight: whole, out: want, rows, inDim, outDim, bias: b, ...extra });
      be.run(op, { x: xb, weight: head, weightTail: tail, tailFrom: from, out: got, rows, inDim, outDim, bias: b, ...extra });
      const a = be.read(want) as Float32Array, g = be.read(got) as Float32Array;
      expect(Array.from(g)).toEqual(Array.from(a));
      // Not all zeros: the comparison means something.
      expect(a.some((v) => v !== 0)).toBe(true);
    }
  });

  it('refuses a bad tail with a named error and leaves out untouched', () => {
    const head = upload(be, w.subarray(0, from * inDim));
    const tail = upload(be, w.subarray(from * inDim));
    const xb = upload(be, x);
    const out = upload(be, new Float32Array(rows * outDim).fill(7));
    const base = { x: xb, weight: head, out, rows, inDim, outDim };
    const cases: [string, Record<string, unknown>, RegExp][] = [
      ['tailFrom past outDim', { weightTail: tail, tailFrom: outDim + 1 }, /tailFrom/],
      ['tailFrom without a tail', { tailFrom: 2 }, /tailFrom/],
      ['a tail without tailFrom', { weightTail: tail }, /tailFrom/],
      ['a tail too short', { weightTail: tail, tailFrom: 1 }, /weightTail/],
      ['a tail with weightOffset', { weightTail: tail, tailFrom: from, weightOffset: inDim }, /weightOffset/],
    ];
    for (const [what, extra, msg] of cases) {
      let err: unknown;
      try {
        be.run('matmul', { ...base, ...extra } as never);
      } catch (e) {
        err = e;
      }
      expect(err, what).toBeInstanceOf(OpArgumentError);
      expect((err as Error).message, what).toMatch(msg);
    }
    let glu: unknown;
    try {
      be.run('fused_matmul', { ...base, outDim: 2, glu: true, weightTail: tail, tailFrom: 1 });
    } catch (e) {
      glu = e;
    }
    expect(glu).toBeInstanceOf(OpArgumentError);
    expect((glu as Error).message).toMatch(/glu/);
    expect(Array.from(be.read(out) as Float32Array).every((v) => v === 7)).toBe(true);
  });
});
