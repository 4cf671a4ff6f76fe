import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';
import { dot, dot64, silu } from './dot.js';

/**
 * Sparse MLP over the routed experts. The number of experts is implied by gateUp's length; the
 * expert intermediate and the weighted sum over experts stay in float64 until the final store.
 */
export function moeMlp(ctx: OpContext, a: OpArgs<'moe_mlp'>): void {
  const rows = ctx.count('rows', a.rows);
  const hidden = ctx.count('hidden', a.hidden, 1);
  const inter = ctx.count('inter', a.inter, 1);
  const topK = ctx.count('topK', a.topK, 1);
  const x = ctx.floats('x', a.x, rows * hidden);
  const ids = ctx.ints('topIds', a.topIds, rows * topK);
  const wts = ctx.floats('topWeights', a.topWeights, rows * topK);
  const perExpertGU = 2 * inter * hidden;
  const gateUp = ctx.floats('gateUp', a.gateUp, perExpertGU);
  if (gateUp.length % perExpertGU !== 0) ctx.fail('gateUp', `length ${gateUp.length} is not a whole number of experts of ${perExpertGU} elements`);
  const numExperts = gateUp.length / perExpertGU;
  const perExpertDown = hidden * inter;
  const down = ctx.floats('down', a.down, numExperts * perExpertDown);
  const out = ctx.f32('out', a.out, rows * hidden);
  ctx.distinct('out', a.out, 'x', a.x);
  if (ctx.dry) return;
  for (let i = 0; i < rows * topK; i++) {
    if (ids[i] < 0 || ids[i] >= numExperts) ctx.fail('topIds', `topIds[${i}] = ${ids[i]} is outside 0..${numExperts - 1}`);
  }
  const h = ctx.scratch.a(inter);
  const acc = ctx.scratch.b(hidden);
  const R = ctx.round;
  const order = ctx.bf16 ? ctx.scratch.sampler(topK).idx : undefined;
  for (let r = 0; r < rows; r++) {
    const xo = r * hidden;
    acc.fill(0, 0, hidden);
    if (order !== undefined) {
      // bf16 numerics: transformers adds the experts' outputs into a bf16 sum in ascending expert id.
      // Insertion sort of the row's k slots by expert id (topK is small; no allocation).
      for (let k = 0; k < topK; k++) {
        let j = k;
        for (; j > 0 && ids[r * topK + order[j - 1]] > ids[r * topK + k]; j--) order[j] = order[j - 1];
        order[j] = k;
      }
    }
    for (let kk = 0; kk < topK; kk++) {
      const k = order === undefined ? kk : order[kk];
      const e = ids[r * topK + k];
      const wk = wts[r * topK + k];
      const gu = e * perExpertGU;
      for (let j = 0; j < inter; j++) {
        const g = R(dot(x, xo, gateUp, gu + j * hidden, hidden));
        const u = R(dot(x, xo, gateUp, gu + (inter + j) * hidden, hidden));
        h[j] = R(R(silu(g)) * u);
      }
      const dn = e * perExpertDown;
      if (order === undefined) for (let d = 0; d < hidden; d++) acc[d] += wk * dot64(h, down, dn + d * inter, inter);
      else for (let d = 0; d < hidden; d++) acc[d] = R(acc[d] + R(R(dot64(h, down, dn + d * inter, inter)) * wk));
    }
    for (let d = 0; d < hidden; d++) out[xo + d] = acc[d];
  }
}
