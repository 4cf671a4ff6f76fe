import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';

/**
 * Router: softmax over experts in float64, the topK largest probabilities (ties: lower expert
 * index, by a strict comparison over ascending indices), optionally renormalized to sum 1.
 */
export function moeRoute(ctx: OpContext, a: OpArgs<'moe_route'>): void {
  const rows = ctx.count('rows', a.rows);
  const numExperts = ctx.count('numExperts', a.numExperts, 1);
  const topK = ctx.count('topK', a.topK, 1);
  if (topK > numExperts) ctx.fail('topK', `${topK} exceeds numExperts ${numExperts}`);
  const logits = ctx.floats('logits', a.logits, rows * numExperts);
  const ids = ctx.ints('topIds', a.topIds, rows * topK);
  const wts = ctx.f32('topWeights', a.topWeights, rows * topK);
  if (ctx.dry) return;
  const R = ctx.round;
  const prob = ctx.scratch.a(numExperts);
  const taken = ctx.scratch.flagBuf(numExperts);
  for (let r = 0; r < rows; r++) {
    const lo = r * numExperts;
    let max = -Infinity;
    for (let e = 0; e < numExperts; e++) if (logits[lo + e] > max) max = logits[lo + e];
    let sum = 0;
    for (let e = 0; e < numExperts; e++) {
      prob[e] = Math.exp(logits[lo + e] - max);
      sum += prob[e];
    }
    taken.fill(0, 0, numExperts);
    let kept = 0;
    for (let k = 0; k < topK; k++) {
      let best = -1;
      for (let e = 0; e < numExperts; e++) if (taken[e] === 0 && (best < 0 || prob[e] > prob[best])) best = e;
      taken[best] = 1;
      ids[r * topK + k] = best;
      kept += prob[best];
    }
    // Renormalizing divides by the kept mass; otherwise by the full softmax sum.
    const denom = a.normalize ? kept : sum;
    for (let k = 0; k < topK; k++) wts[r * topK + k] = R(prob[ids[r * topK + k]] / denom);
  }
}
