import type { DeviceBuffer, WeightTail } from '@nerva/core';
import type { OpContext } from '../op-context.js';

/** Row o of a weight matrix: the array holding it and the row's first element there. */
export type WeightRow = (o: number) => readonly [Float32Array, number];

/**
 * The rows of a matmul's weight, `wRows` rows of `inDim` from element `offset` of `weight`, or,
 * with a tail (op matmul / fused_matmul's `weightTail`), rows [0, tailFrom) there and the rest
 * in the tail. Validates the tail's arguments.
 */
export function weightRows(ctx: OpContext, weight: DeviceBuffer, t: WeightTail, wRows: number, inDim: number, offset = 0, glu = false): WeightRow {
  if (t.weightTail === undefined) {
    if (t.tailFrom !== undefined) ctx.fail('tailFrom', 'needs weightTail');
    const w = ctx.floats('weight', weight, offset + wRows * inDim);
    return (o) => [w, offset + o * inDim];
  }
  if (glu) ctx.fail('weightTail', 'is not allowed with glu');
  if (offset !== 0) ctx.fail('weightTail', 'is not allowed with weightOffset');
  const from = ctx.count('tailFrom', t.tailFrom ?? -1);
  if (from > wRows) ctx.fail('tailFrom', `must be <= outDim (${wRows}), got ${from}`);
  const head = ctx.floats('weight', weight, from * inDim);
  const tail = ctx.floats('weightTail', t.weightTail, (wRows - from) * inDim);
  return (o) => (o < from ? [head, o * inDim] : [tail, (o - from) * inDim]);
}
