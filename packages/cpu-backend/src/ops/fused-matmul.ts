import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';
import { dot, silu } from './dot.js';
import { weightRows } from './weight-rows.js';

/**
 * matmul over an rmsnorm-ed input (with normWeight: normalized and rounded to float32 exactly as
 * op `rmsnorm` stores it), with an optional silu(gate)*up epilogue (glu: the two products rounded
 * to float32 first, as op `silu_mul` sees them) and an optional add into out. The accumulate path
 * rounds the result to float32 first, so it equals the unfused ops followed by `add`. Under matmul
 * precision 'bf16' the (normalized) input is rounded to bf16 before the products when rows > 8.
 */
export function fusedMatmul(ctx: OpContext, a: OpArgs<'fused_matmul'>): void {
  const rows = ctx.count('rows', a.rows);
  const inDim = ctx.count('inDim', a.inDim, 1);
  const outDim = ctx.count('outDim', a.outDim, 1);
  const glu = a.glu === true;
  if (glu && a.bias !== undefined) ctx.fail('bias', 'bias is not allowed with glu');
  const eps = a.eps === undefined ? 1e-6 : ctx.real('eps', a.eps);
  if (eps < 0) ctx.fail('eps', `must be >= 0, got ${eps}`);
  const wRows = glu ? 2 * outDim : outDim;
  const x = ctx.floats('x', a.x, rows * inDim);
  const w = weightRows(ctx, a.weight, a, wRows, inDim, 0, glu);
  const out = ctx.f32('out', a.out, rows * outDim);
  const bias = a.bias === undefined ? undefined : ctx.floats('bias', a.bias, outDim);
  const norm = a.normWeight === undefined ? undefined : ctx.floats('normWeight', a.normWeight, inDim);
  ctx.distinct('out', a.out, 'x', a.x);
  ctx.distinct('out', a.out, 'weight', a.weight);
  if (a.weightTail !== undefined) ctx.distinct('out', a.out, 'weightTail', a.weightTail);
  if (ctx.dry) return;
  const R = ctx.round;
  let input = x;
  if (norm !== undefined) {
    input = ctx.scratch.f32(rows * inDim);
    for (let r = 0; r < rows; r++) {
      const o = r * inDim;
      let ss = 0;
      for (let i = 0; i < inDim; i++) ss += x[o + i] * x[o + i];
      const inv = 1 / Math.sqrt(ss / inDim + eps);
      for (let i = 0; i < inDim; i++) input[o + i] = R(R(x[o + i] * inv) * norm[i]);
    }
  }
  input = ctx.matmulInput(input, rows, inDim, input !== x);
  for (let o = 0; o < outDim; o++) {
    const b = bias === undefined ? 0 : bias[o];
    for (let r = 0; r < rows; r++) {
      const [wa, wo] = w(o);
      let v = R(dot(input, r * inDim, wa, wo, inDim) + b);
      if (glu) {
        const [ua, uo] = w(outDim + o);
        v = R(R(silu(Math.fround(v))) * R(Math.fround(dot(input, r * inDim, ua, uo, inDim))));
      }
      const i = r * outDim + o;
      out[i] = a.accumulate === true ? R(out[i] + Math.fround(v)) : v;
    }
  }
}
