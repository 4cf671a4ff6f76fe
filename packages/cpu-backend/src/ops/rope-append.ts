import type { OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';
import { kvAppend } from './kv-append.js';
import { rope } from './rope.js';

/** Ops `rope` (q heads, then k heads) and `kv_append` over one packed qkv buffer, in that order. */
export function ropeAppend(ctx: OpContext, a: OpArgs<'rope_append'>): void {
  const nq = ctx.count('numHeads', a.numHeads, 1);
  const nkv = ctx.count('numKvHeads', a.numKvHeads, 1);
  const hd = ctx.count('headDim', a.headDim, 2);
  const stride = ctx.count('rowStride', a.rowStride, 1);
  if ((nq + 2 * nkv) * hd > stride) ctx.fail('rowStride', `q, k and v heads need ${(nq + 2 * nkv) * hd}, stride is ${stride}`);
  const common = { x: a.qkv, positions: a.positions, invFreq: a.invFreq, rows: a.rows, headDim: hd, rowStride: stride, ...(a.eps === undefined ? {} : { eps: a.eps }) };
  const q = { ...common, numHeads: nq, headOffset: 0, ...(a.qNorm === undefined ? {} : { normWeight: a.qNorm }) };
  const k = { ...common, numHeads: nkv, headOffset: nq * hd, ...(a.kNorm === undefined ? {} : { normWeight: a.kNorm }) };
  const kv = {
    src: a.qkv,
    kCache: a.kCache,
    vCache: a.vCache,
    slots: a.slots,
    rows: a.rows,
    numKvHeads: nkv,
    headDim: hd,
    rowStride: stride,
    kOffset: nq * hd,
    vOffset: (nq + nkv) * hd,
  };
  // Every check first, so a bad call leaves qkv untouched.
  const dry = ctx.dry;
  ctx.dry = true;
  try {
    rope(ctx, q);
    rope(ctx, k);
    kvAppend(ctx, kv);
  } finally {
    ctx.dry = dry;
  }
  if (dry) return;
  rope(ctx, q);
  rope(ctx, k);
  kvAppend(ctx, kv);
}
