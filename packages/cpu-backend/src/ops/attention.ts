import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';
import { span } from '../op-context.js';
import { dot } from './dot.js';

/**
 * Paged causal attention, exact: for each row and head, scores over positions lo..pos (float64;
 * lo = 0, or pos - window + 1 with a sliding window), a max-subtracted softmax in float64, and the
 * weighted sum of values. With `lse` it is a partial: blocks whose table entry is negative are
 * skipped and the log-sum-exp of the remaining scores is written beside the normalized output.
 * Every index read from a buffer (sequence, position, block id) is checked before any arithmetic.
 * The host staging buffers are for device backends; host memory is this backend's compute tier.
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
  const window = a.window === undefined ? 0 : ctx.count('window', a.window);
  const partial = a.lse !== undefined;
  if (partial && ctx.bf16) ctx.fail('lse', 'partial attention is defined for exact numerics only (bf16 eager attention rounds the whole row\'s probabilities)');
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
  const lse = partial ? ctx.f32('lse', a.lse, rows * numHeads) : undefined;
  if (partial) {
    ctx.distinct('lse', a.lse!, 'out', a.out);
    ctx.distinct('lse', a.lse!, 'q', a.q);
  }
  if (ctx.dry) return;
  const lowest = (pos: number) => (window > 0 ? Math.max(0, pos - window + 1) : 0);
  const numSeqs = Math.floor(tables.length / maxBlocks);
  const numBlocks = Math.floor(Math.min(kc.length, vc.length) / kvw / blockSize);
  for (let r = 0; r < rows; r++) {
    const seq = rowSeq[r];
    const pos = positions[r];
    if (seq < 0 || seq >= numSeqs) ctx.fail('rowSeq', `rowSeq[${r}] = ${seq} has no block table (${numSeqs} tables)`);
    if (pos < 0 || pos >= maxBlocks * blockSize) ctx.fail('positions', `positions[${r}] = ${pos} is outside 0..${maxBlocks * blockSize - 1}`);
    const last = Math.floor(pos / blockSize);
    for (let b = Math.floor(lowest(pos) / blockSize); b <= last; b++) {
      const blk = tables[seq * maxBlocks + b];
      if (partial && blk < 0) continue;
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
    const end = positions[r] + 1;
    const lo = lowest(positions[r]);
    const tb = seq * maxBlocks;
    for (let h = 0; h < numHeads; h++) {
      const qo = r * qRowStride + qOffset + h * headDim;
      const kvo = Math.floor(h / group) * headDim;
      let max = -Infinity;
      for (let p = lo; p < end; p++) {
        const blk = tables[tb + Math.floor(p / blockSize)];
        if (blk < 0) {
          scores[p] = -Infinity; // partial: this block lives in another cache
          continue;
        }
        const slot = blk * blockSize + (p % blockSize);
        const s = R(R(dot(q, qo, kc, slot * kvw + kvo, headDim)) * sc);
        scores[p] = s;
        if (s > max) max = s;
      }
      const oo = r * qw + h * headDim;
      if (max === -Infinity) {
        // No position of this row is in this cache (partial attention only).
        out.fill(0, oo, oo + headDim);
        lse![r * numHeads + h] = -Infinity;
        continue;
      }
      let sum = 0;
      for (let p = lo; p < end; p++) {
        const e = bf16 ? Math.fround(Math.exp(scores[p] - max)) : Math.exp(scores[p] - max);
        scores[p] = e;
        sum += e;
      }
      if (bf16) {
        // softmax in float32, then the probabilities rounded: the weighted sum needs no division.
        sum = Math.fround(sum);
        for (let p = lo; p < end; p++) scores[p] = R(scores[p] / sum);
        sum = 1;
      }
      acc.fill(0, 0, headDim);
      for (let p = lo; p < end; p++) {
        const wgt = scores[p];
        if (wgt === 0) continue;
        const slot = tables[tb + Math.floor(p / blockSize)] * blockSize + (p % blockSize);
        const vo = slot * kvw + kvo;
        for (let i = 0; i < headDim; i++) acc[i] += wgt * vc[vo + i];
      }
      for (let i = 0; i < headDim; i++) out[oo + i] = R(acc[i] / sum);
      if (lse) lse[r * numHeads + h] = max + Math.log(sum);
    }
  }
}
