import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';
import { span } from '../op-context.js';

/** Default epsilon of the QK-norm when the caller gives a normWeight but no eps (Qwen3's value). */
export const DEFAULT_QK_NORM_EPS = 1e-6;

/**
 * In place on numHeads heads per row: optional per-head RMSNorm (QK-norm), then rotate-half RoPE.
 * The angle positions[r] * invFreq[i] is rounded to float32, as the Hugging Face reference computes
 * it (a float32 product), so long contexts rotate by the same angle; cos/sin are then float64
 * (bf16 numerics: cos/sin and each product rounded as transformers does; see core ops.ts).
 */
export function rope(ctx: OpContext, a: OpArgs<'rope'>): void {
  const rows = ctx.count('rows', a.rows);
  const numHeads = ctx.count('numHeads', a.numHeads, 1);
  const headDim = ctx.count('headDim', a.headDim, 2);
  if (headDim % 2 !== 0) ctx.fail('headDim', `must be even, got ${headDim}`);
  const half = headDim / 2;
  const rowStride = ctx.count('rowStride', a.rowStride, 1);
  const headOffset = ctx.count('headOffset', a.headOffset);
  const width = numHeads * headDim;
  if (headOffset + width > rowStride) ctx.fail('headOffset', `heads [${headOffset}, ${headOffset + width}) overrun the row stride ${rowStride}`);
  const x = ctx.f32('x', a.x, span(rows, rowStride, headOffset, width));
  const pos = ctx.ints('positions', a.positions, rows);
  const invFreq = ctx.floats('invFreq', a.invFreq, half);
  const norm = a.normWeight === undefined ? undefined : ctx.floats('normWeight', a.normWeight, headDim);
  const eps = a.eps === undefined ? DEFAULT_QK_NORM_EPS : ctx.real('eps', a.eps);
  if (eps < 0) ctx.fail('eps', `must be >= 0, got ${eps}`);
  if (ctx.dry) return;
  const R = ctx.round;
  for (let r = 0; r < rows; r++) {
    const p = pos[r];
    for (let h = 0; h < numHeads; h++) {
      const o = r * rowStride + headOffset + h * headDim;
      if (norm !== undefined) {
        let ss = 0;
        for (let i = 0; i < headDim; i++) ss += x[o + i] * x[o + i];
        const inv = 1 / Math.sqrt(ss / headDim + eps);
        for (let i = 0; i < headDim; i++) x[o + i] = R(R(x[o + i] * inv) * norm[i]);
      }
      for (let i = 0; i < half; i++) {
        const ang = Math.fround(p * invFreq[i]);
        const c = R(Math.cos(ang));
        const s = R(Math.sin(ang));
        const x1 = x[o + i];
        const x2 = x[o + i + half];
        x[o + i] = R(R(x1 * c) - R(x2 * s));
        x[o + i + half] = R(R(x2 * c) + R(x1 * s));
      }
    }
  }
}
