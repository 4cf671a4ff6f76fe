import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';
import { dot, silu } from './dot.js';

/**
 * A slice of a dense MLP from the residual stream (see op `mlp_slice`): the normalized input as
 * `fused_matmul` with normWeight computes it, the glu activation as `fused_matmul` with glu, then
 * the down projection of the slice, written to out. The CPU backend computes in host memory
 * already, so the staging buffers are not used.
 */
export function mlpSlice(ctx: OpContext, a: OpArgs<'mlp_slice'>): void {
  const rows = ctx.count('rows', a.rows);
  const H = ctx.count('hidden', a.hidden, 1);
  const I = ctx.count('inter', a.inter);
  const eps = ctx.real('eps', a.eps);
  if (eps < 0) ctx.fail('eps', `must be >= 0, got ${eps}`);
  const x = ctx.floats('x', a.x, rows * H);
  const nw = ctx.floats('normWeight', a.normWeight, H);
  const gu = ctx.floats('gateUp', a.gateUp, 2 * I * H);
  const down = ctx.floats('down', a.down, H * I);
  const out = ctx.f32('out', a.out, rows * H);
  ctx.distinct('out', a.out, 'x', a.x);
  if (ctx.dry) return;
  const R = ctx.round;
  // One scratch: the normalized rows, then the activations.
  const n = ctx.scratch.f32(rows * H + rows * I);
  const A = rows * H;
  for (let r = 0; r < rows; r++) {
    const o = r * H;
    let ss = 0;
    for (let i = 0; i < H; i++) ss += x[o + i] * x[o + i];
    const inv = 1 / Math.sqrt(ss / H + eps);
    for (let i = 0; i < H; i++) n[o + i] = R(R(x[o + i] * inv) * nw[i]);
    for (let j = 0; j < I; j++) {
      const g = R(dot(n, o, gu, j * H, H));
      const u = R(Math.fround(dot(n, o, gu, (I + j) * H, H)));
      n[A + r * I + j] = R(R(silu(Math.fround(g))) * u);
    }
    for (let h = 0; h < H; h++) out[o + h] = I === 0 ? 0 : R(dot(n, A + r * I, down, h * I, I));
  }
}
