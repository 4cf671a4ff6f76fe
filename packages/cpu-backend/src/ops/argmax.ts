import { argmaxRow, type OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';

/** out[r] = argmax of row r (core's argmaxRow: lowest index on ties, NaN never wins). */
export function argmax(ctx: OpContext, a: OpArgs<'argmax'>): void {
  const rows = ctx.count('rows', a.rows);
  const vocab = ctx.count('vocab', a.vocab, 1);
  const logits = ctx.floats('logits', a.logits, rows * vocab);
  const out = ctx.ints('out', a.out, rows);
  if (ctx.dry) return;
  for (let r = 0; r < rows; r++) out[r] = argmaxRow(logits, r * vocab, vocab);
}
