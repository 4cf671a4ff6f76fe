import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';

/**
 * out = x / sqrt(mean(x^2) + eps) * weight, per row. With `residual`, the residual stream is
 * updated first (residual += x, stored as float32 as the stream is) and normalized instead.
 * out may be x itself (each row is reduced before it is written).
 */
export function rmsnorm(ctx: OpContext, a: OpArgs<'rmsnorm'>): void {
  const rows = ctx.count('rows', a.rows);
  const dim = ctx.count('dim', a.dim, 1);
  const eps = ctx.real('eps', a.eps);
  if (eps < 0) ctx.fail('eps', `must be >= 0, got ${eps}`);
  const n = rows * dim;
  const x = ctx.floats('x', a.x, n);
  const w = ctx.floats('weight', a.weight, dim);
  // out may be bf16 (capabilities.activationDtypes): each value rounded as it is stored.
  const { data: out, store } = ctx.f32OrBf16('out', a.out, n);
  const res = a.residual === undefined ? undefined : ctx.f32('residual', a.residual, n);
  if (a.residual !== undefined) ctx.distinct('residual', a.residual, 'x', a.x);
  if (ctx.dry) return;
  const R = ctx.round;
  let src = x;
  if (res !== undefined) {
    for (let i = 0; i < n; i++) res[i] = R(res[i] + x[i]);
    src = res;
  }
  for (let r = 0; r < rows; r++) {
    const o = r * dim;
    let ss = 0;
    for (let i = 0; i < dim; i++) ss += src[o + i] * src[o + i];
    const inv = 1 / Math.sqrt(ss / dim + eps);
    if (store === undefined) for (let i = 0; i < dim; i++) out[o + i] = R(R(src[o + i] * inv) * w[i]);
    else for (let i = 0; i < dim; i++) out[o + i] = store(R(R(src[o + i] * inv) * w[i]));
  }
}
