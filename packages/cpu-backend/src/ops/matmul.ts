import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';
import { dot } from './dot.js';
import { weightRows } from './weight-rows.js';

/**
 * out[r, o] = x[r, :] . weight[weightOffset + o*inDim, +inDim] (+ bias[o]); rows past tailFrom from
 * weightTail; with accumulate, added to out instead. The weight row is the
 * outer loop so each row of a (large) weight matrix is streamed from memory once for all rows.
 * Under matmul precision 'bf16', x is rounded to bf16 first when rows > 8 (OpContext.matmulInput).
 */
export function matmul(ctx: OpContext, a: OpArgs<'matmul'>): void {
  const rows = ctx.count('rows', a.rows);
  const inDim = ctx.count('inDim', a.inDim, 1);
  const outDim = ctx.count('outDim', a.outDim, 1);
  const off = ctx.count('weightOffset', a.weightOffset ?? 0);
  const x = ctx.floats('x', a.x, rows * inDim);
  const w = weightRows(ctx, a.weight, a, outDim, inDim, off);
  const out = ctx.f32('out', a.out, rows * outDim);
  const bias = a.bias === undefined ? undefined : ctx.floats('bias', a.bias, outDim);
  ctx.distinct('out', a.out, 'x', a.x);
  ctx.distinct('out', a.out, 'weight', a.weight);
  if (a.weightTail !== undefined) ctx.distinct('out', a.out, 'weightTail', a.weightTail);
  if (ctx.dry) return;
  const xin = ctx.matmulInput(x, rows, inDim);
  const R = ctx.round;
  const acc = a.accumulate === true;
  for (let o = 0; o < outDim; o++) {
    const [wa, wo] = w(o);
    const b = bias === undefined ? 0 : bias[o];
    for (let r = 0; r < rows; r++) {
      const y = R(dot(xin, r * inDim, wa, wo, inDim) + b);
      // accumulate: y as the float32 the op would store, then the float32 sum (core ops.ts: R(out + y)).
      out[r * outDim + o] = acc ? R(out[r * outDim + o] + Math.fround(y)) : y;
    }
  }
}
