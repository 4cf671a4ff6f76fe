import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';

/** out[i, :] = x[rowIdx[i], :]; a negative index skips row i, one past x is an error. */
export function gatherRows(ctx: OpContext, a: OpArgs<'gather_rows'>): void {
  const n = ctx.count('n', a.n);
  const dim = ctx.count('dim', a.dim, 1);
  const x = ctx.floats('x', a.x, 0);
  const idx = ctx.ints('rowIdx', a.rowIdx, n);
  // Values of x are already what its dtype holds: an out of the same dtype takes them exactly.
  const out = a.out?.dtype === a.x?.dtype ? ctx.floats('out', a.out, n * dim) : ctx.f32('out', a.out, n * dim);
  ctx.distinct('out', a.out, 'x', a.x);
  if (ctx.dry) return;
  const xRows = Math.floor(x.length / dim);
  for (let i = 0; i < n; i++) {
    if (idx[i] >= xRows) ctx.fail('rowIdx', `rowIdx[${i}] = ${idx[i]} is outside x (${xRows} rows)`);
  }
  for (let i = 0; i < n; i++) {
    if (idx[i] < 0) continue;
    const src = idx[i] * dim;
    const dst = i * dim;
    for (let j = 0; j < dim; j++) out[dst + j] = x[src + j];
  }
}
