import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';

/** out[r, :] = table[ids[r], :]; an id outside the table is an error, not a wrap-around. */
export function embedding(ctx: OpContext, a: OpArgs<'embedding'>): void {
  const rows = ctx.count('rows', a.rows);
  const hidden = ctx.count('hidden', a.hidden, 1);
  const table = ctx.floats('table', a.table, hidden);
  const ids = ctx.ints('ids', a.ids, rows);
  const out = ctx.f32('out', a.out, rows * hidden);
  if (ctx.dry) return;
  const R = ctx.round;
  const vocab = Math.floor(table.length / hidden);
  for (let r = 0; r < rows; r++) {
    const id = ids[r];
    if (id < 0 || id >= vocab) ctx.fail('ids', `ids[${r}] = ${id} is outside the table (${vocab} rows)`);
  }
  for (let r = 0; r < rows; r++) {
    const src = ids[r] * hidden;
    const dst = r * hidden;
    for (let i = 0; i < hidden; i++) out[dst + i] = R(table[src + i]);
  }
}
