import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';

/** out = a + b elementwise; out may alias a or b. */
export function add(ctx: OpContext, a: OpArgs<'add'>): void {
  const n = ctx.count('length', a.length);
  const x = ctx.floats('a', a.a, n);
  const y = ctx.floats('b', a.b, n);
  const out = ctx.f32('out', a.out, n);
  if (ctx.dry) return;
  const R = ctx.round;
  for (let i = 0; i < n; i++) out[i] = R(x[i] + y[i]);
}
