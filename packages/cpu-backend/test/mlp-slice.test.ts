import { describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/index.js';
import { randn, rng, upload, zeros } from './helpers.js';

describe('mlp_slice', () => {
  it('equals fused_matmul (norm + glu) then matmul over the slice, and two slices add up to the whole MLP', () => {
    const be = new CpuBackend();
    const r = rng(7);
    const rows = 3;
    const H = 40;
    const I = 24;
    const c = 10; // host slice: channels [0, c)
    const x = randn(r, rows * H, 5);
    const nw = randn(r, H, 0.2).map((v) => 1 + v);
    const gate = randn(r, I * H, 0.15);
    const up = randn(r, I * H, 0.15);
    const down = randn(r, H * I, 0.2);
    // The slice's weights in the layout the op takes: gate rows, then up rows; down columns [0, c).
    const sliceGateUp = new Float32Array(2 * c * H);
    sliceGateUp.set(gate.subarray(0, c * H), 0);
    sliceGateUp.set(up.subarray(0, c * H), c * H);
    const sliceDown = new Float32Array(H * c);
    for (let h = 0; h < H; h++) sliceDown.set(down.subarray(h * I, h * I + c), h * c);
    const bx = upload(be, x);
    const bn = upload(be, nw);
    const out = zeros(be, rows * H);
    be.run('mlp_slice', { x: bx, normWeight: bn, gateUp: upload(be, sliceGateUp), down: upload(be, sliceDown), out, rows, hidden: H, inter: c, eps: 1e-6 });
    const got = be.read(out) as Float32Array;

    // The same slice through the ops the resident path uses.
    const act = zeros(be, rows * c);
    be.run('fused_matmul', { x: bx, weight: upload(be, sliceGateUp), out: act, rows, inDim: H, outDim: c, normWeight: bn, eps: 1e-6, glu: true });
    const want = zeros(be, rows * H);
    be.run('matmul', { x: act, weight: upload(be, sliceDown), out: want, rows, inDim: c, outDim: H });
    expect(Array.from(got)).toEqual(Array.from(be.read(want)));

    // The complement [c, I) plus the slice equals the whole MLP within float32 rounding.
    const restGU = new Float32Array(2 * (I - c) * H);
    restGU.set(gate.subarray(c * H), 0);
    restGU.set(up.subarray(c * H), (I - c) * H);
    const restDown = new Float32Array(H * (I - c));
    for (let h = 0; h < H; h++) restDown.set(down.subarray(h * I + c, (h + 1) * I), h * (I - c));
    const rest = zeros(be, rows * H);
    be.run('mlp_slice', { x: bx, normWeight: bn, gateUp: upload(be, restGU), down: upload(be, restDown), out: rest, rows, hidden: H, inter: I - c, eps: 1e-6 });
    const fullGU = new Float32Array(2 * I * H);
    fullGU.set(gate, 0);
    fullGU.set(up, I * H);
    const full = zeros(be, rows * H);
    be.run('mlp_slice', { x: bx, normWeight: bn, gateUp: upload(be, fullGU), down: upload(be, down), out: full, rows, hidden: H, inter: I, eps: 1e-6 });
    const f = be.read(full);
    const s = be.read(rest);
    let maxRef = 0;
    let maxErr = 0;
    for (let i = 0; i < f.length; i++) {
      maxRef = Math.max(maxRef, Math.abs(f[i]));
      maxErr = Math.max(maxErr, Math.abs(got[i] + s[i] - f[i]));
    }
    // Two float32 partial sums instead of one: a few float32 ulps of the largest output.
    expect(maxErr).toBeLessThan(4e-6 * maxRef);
    expect(maxRef).toBeGreaterThan(0);
    be.dispose();
  });

  it('an empty slice writes zeros; malformed arguments are rejected before anything is written', () => {
    const be = new CpuBackend();
    const x = upload(be, new Float32Array(8).fill(1));
    const nw = upload(be, new Float32Array(8).fill(1));
    const out = upload(be, new Float32Array(8).fill(9));
    const empty = zeros(be, 0);
    be.run('mlp_slice', { x, normWeight: nw, gateUp: empty, down: empty, out, rows: 1, hidden: 8, inter: 0, eps: 1e-6 });
    expect(Array.from(be.read(out))).toEqual(new Array(8).fill(0));
    be.write(out, new Float32Array(8).fill(9));
    expect(() => be.run('mlp_slice', { x, normWeight: nw, gateUp: empty, down: empty, out, rows: 1, hidden: 8, inter: 2, eps: 1e-6 })).toThrow(/gateUp/);
    expect(() => be.run('mlp_slice', { x, normWeight: nw, gateUp: empty, down: empty, out, rows: 1, hidden: 8, inter: 0, eps: -1 })).toThrow(/eps/);
    expect(Array.from(be.read(out))).toEqual(new Array(8).fill(9));
    be.dispose();
  });
});
