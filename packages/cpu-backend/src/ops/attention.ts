import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';
import { span } from '../op-context.js';
import { dot } from './dot.js';

/**
 * Paged causal attention, exact: for each row and head, scores over positions 0..pos (float64),
 * a max-subtracted softmax in float64, and the weighted sum of values. Every index read from a
 * buffer (sequence, position, block id) is checked before any arithmetic.
 */
export function attention(ctx: OpContext, a: OpArgs<'attention'>): void {
  const rows = ctx.count('rows', a.rows);
  const numHeads = ctx.count('numHeads', a.numHeads, 1);
  const numKvHeads = ctx.count('numKvHeads', a.numKvHeads, 1);
  if (numHeads % numKvHeads !== 0) ctx.fail('numKvHeads', `${numKvHeads} does not divide numHeads ${numHeads}`);
  const headDim = ctx.count('headDim', a.headDim, 1);
  const blockSize = ctx.count('blockSize', a.blockSize, 1);
  const maxBlocks = ctx.count('maxBlocksPerSeq', a.maxBlocksPerSeq, 1);
  const qRowStride = ctx.count('qRowStride', a.qRowStride, 1);
  const qOffset = ctx.count('qOffset', a.qOffset);
  const scale = ctx.real('scale', a.scale);
  const qw = numHeads * headDim;
  if (qOffset + qw > qRowStride) ctx.fail('qOffset', `q heads [${qOffset}, ${qOffset + qw}) overrun the row stride ${qRowStride}`);
  const kvw = numKvHeads * headDim;
  const q = ctx.floats('q', a.q, span(rows, qRowStride, qOffset, qw));
  const kc = ctx.floats('kCache', a.kCache, kvw);
  const vc = ctx.floats('vCache', a.vCache, kvw);
  const out = ctx.f32('out', a.out, rows * qw);
  const tables = ctx.ints('blockTables', a.blockTables, maxBlocks);
  const rowSeq = ctx.ints('rowSeq', a.rowSeq, rows);
  const positions = ctx.ints('positions', a.positions, rows);
  ctx.distinct('out', a.out, 'q', a.q);
  ctx.distinct('out', a.out, 'kCache', a.kCache);
  ctx.distinct('out', a.out, 'vCache', a.vCache);
  if (ctx.dry) return;
  const numSeqs = Math.floor(tables.length / maxBlocks);
  const numBlocks = Math.floor(Math.min(kc.length, vc.length) / kvw / blockSize);
  for (let r = 0; r < rows; r++) {
    const seq = rowSeq[r];
    const pos = positions[r];
    if (seq < 0 || seq >= numSeqs) ctx.fail('rowSeq', `rowSeq[${r}] = ${seq} has no block table (${numSeqs} tables)`);
    if (pos < 0 || pos >= maxBlocks * blockSize) ctx.fail('positions', `positions[${r}] = ${pos} is outside 0..${maxBlocks * blockSize - 1}`);
    const last = Math.floor(pos / blockSize);
    for (let b = 0; b <= last; b++) {
      const blk = tables[seq * maxBlocks + b];
      if (blk < 0 || blk >= numBlocks) ctx.fail('blockTables', `block ${blk} (sequence ${seq}, entry ${b}) is outside the cache (${numBlocks} blocks)`);
    }
  }
  const group = numHeads / numKvHeads;
  const R = ctx.round;
  // bf16 numerics (eager attention): the score matmul, the scaled score and the probabilities are
  // each rounded, and the scale is the float32 transformers multiplies by.
  const bf16 = ctx.bf16;
  const sc = bf16 ? Math.fround(scale) : scale;
  const scores = ctx.scratch.scoreBuf(maxBlocks * blockSize);
  const acc = ctx.scratch.a(headDim);
  for (let r = 0; r < rows; r++) {
    const seq = rowSeq[r];
    const n = positions[r] + 1;
    const tb = seq * maxBlocks;
    for (let h = 0; h < numHeads; h++) {
      const qo = r * qRowStride + qOffset + h * headDim;
      const kvo = Math.floor(h / group) * headDim;
      let max = -Infinity;
      for (let p = 0; p < n; p++) {
        const slot = tables[tb + Math.floor(p / blockSize)] * blockSize + (p % blockSize);
        const s = R(R(dot(q, qo, kc, slot * kvw + kvo, headDim)) * sc);
        scores[p] = s;
        if (s > max) max = s;
      }
      let sum = 0;
      for (let p = 0; p < n; p++) {
        const e = bf16 ? Math.fround(Math.exp(scores[p] - max)) : Math.exp(scores[p] - max);
        scores[p] = e;
        sum += e;
      }
      if (bf16) {
        // softmax in float32, then the probabilities rounded: the weighted sum needs no division.
        sum = Math.fround(sum);
        for (let p = 0; p < n; p++) scores[p] = R(scores[p] / sum);
        sum = 1;
      }
      acc.fill(0, 0, headDim);
      for (let p = 0; p < n; p++) {
        const slot = tables[tb + Math.floor(p / blockSize)] * blockSize + (p % blockSize);
        const vo = slot * kvw + kvo;
        const wgt = scores[p];
        for (let i = 0; i < headDim; i++) acc[i] += wgt * vc[vo + i];
      }
      const oo = r * qw + h * headDim;
      for (let i = 0; i < headDim; i++) out[oo + i] = R(acc[i] / sum);
    }
  }
}
