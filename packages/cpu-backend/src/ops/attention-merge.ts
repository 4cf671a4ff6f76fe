import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';

/**
 * The online-softmax merge of two partial attentions over disjoint key sets (op
 * `attention_merge`), in place on out and lse, in float64 before the float32 stores.
 */
export function attentionMerge(ctx: OpContext, a: OpArgs<'attention_merge'>): void {
  const rows = ctx.count('rows', a.rows);
  const numHeads = ctx.count('numHeads', a.numHeads, 1);
  const headDim = ctx.count('headDim', a.headDim, 1);
  const n = rows * numHeads;
  const out = ctx.f32('out', a.out, n * headDim);
  const other = ctx.floats('other', a.other, n * headDim);
  const lse = ctx.f32('lse', a.lse, n);
  const otherLse = ctx.floats('otherLse', a.otherLse, n);
  ctx.distinct('out', a.out, 'other', a.other);
  ctx.distinct('lse', a.lse, 'otherLse', a.otherLse);
  ctx.distinct('lse', a.lse, 'out', a.out);
  if (ctx.dry) return;
  for (let i = 0; i < n; i++) {
    const la = lse[i];
    const lb = otherLse[i];
    if (Number.isNaN(la) || Number.isNaN(lb) || la === Infinity || lb === Infinity) ctx.fail('lse', `entry ${i} is ${Number.isNaN(la) ? la : lb}: a log-sum-exp is finite or -Infinity`);
    const o = i * headDim;
    if (la === -Infinity && lb === -Infinity) {
      out.fill(0, o, o + headDim);
      continue;
    }
    const m = Math.max(la, lb);
    const wa = Math.exp(la - m);
    const wb = Math.exp(lb - m);
    const inv = 1 / (wa + wb);
    for (let d = 0; d < headDim; d++) out[o + d] = (wa * out[o + d] + wb * other[o + d]) * inv;
    lse[i] = m + Math.log(wa + wb);
  }
}
