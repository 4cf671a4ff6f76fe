import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';
import { silu } from './dot.js';

/** out[r, i] = silu(gate) * up with x[r] = [gate (dim) | up (dim)]. */
export function siluMul(ctx: OpContext, a: OpArgs<'silu_mul'>): void {
  const rows = ctx.count('rows', a.rows);
  const dim = ctx.count('dim', a.dim, 1);
  const x = ctx.floats('x', a.x, rows * 2 * dim);
  // out may be bf16 (capabilities.activationDtypes): each value rounded as it is stored.
  const { data: out, store } = ctx.f32OrBf16('out', a.out, rows * dim);
  ctx.distinct('out', a.out, 'x', a.x);
  if (ctx.dry) return;
  const R = ctx.round;
  for (let r = 0; r < rows; r++) {
    const xo = r * 2 * dim;
    const oo = r * dim;
    if (store === undefined) for (let i = 0; i < dim; i++) out[oo + i] = R(R(silu(x[xo + i])) * x[xo + dim + i]);
    else for (let i = 0; i < dim; i++) out[oo + i] = store(R(R(silu(x[xo + i])) * x[xo + dim + i]));
  }
}
