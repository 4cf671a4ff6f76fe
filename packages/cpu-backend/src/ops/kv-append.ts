import type { OpArgs } from '@nerva/core';
import { storeRounding } from '../half.js';
import type { OpContext } from '../op-context.js';
import { span } from '../op-context.js';

/**
 * Scatter each row's key and value into the paged caches at slots[r] (negative: padding, skipped).
 * The caches may be f32, bf16 or f16; stores into a half cache round to it.
 */
export function kvAppend(ctx: OpContext, a: OpArgs<'kv_append'>): void {
  const rows = ctx.count('rows', a.rows);
  const numKvHeads = ctx.count('numKvHeads', a.numKvHeads, 1);
  const headDim = ctx.count('headDim', a.headDim, 1);
  const rowStride = ctx.count('rowStride', a.rowStride, 1);
  const kOffset = ctx.count('kOffset', a.kOffset);
  const vOffset = ctx.count('vOffset', a.vOffset);
  const w = numKvHeads * headDim;
  if (kOffset + w > rowStride) ctx.fail('kOffset', `keys [${kOffset}, ${kOffset + w}) overrun the row stride ${rowStride}`);
  if (vOffset + w > rowStride) ctx.fail('vOffset', `values [${vOffset}, ${vOffset + w}) overrun the row stride ${rowStride}`);
  const src = ctx.floats('src', a.src, span(rows, rowStride, Math.max(kOffset, vOffset), w));
  const k = ctx.floats('kCache', a.kCache, w);
  const v = ctx.floats('vCache', a.vCache, w);
  const slots = ctx.ints('slots', a.slots, rows);
  ctx.distinct('kCache', a.kCache, 'src', a.src);
  ctx.distinct('vCache', a.vCache, 'src', a.src);
  ctx.distinct('vCache', a.vCache, 'kCache', a.kCache);
  if (ctx.dry) return;
  const kSlots = Math.floor(k.length / w);
  const vSlots = Math.floor(v.length / w);
  for (let r = 0; r < rows; r++) {
    const s = slots[r];
    if (s >= kSlots || s >= vSlots) ctx.fail('slots', `slots[${r}] = ${s} is outside the cache (${Math.min(kSlots, vSlots)} slots)`);
  }
  const rk = storeRounding(a.kCache.dtype);
  const rv = storeRounding(a.vCache.dtype);
  for (let r = 0; r < rows; r++) {
    const s = slots[r];
    if (s < 0) continue;
    const ko = r * rowStride + kOffset;
    const vo = r * rowStride + vOffset;
    const d = s * w;
    for (let i = 0; i < w; i++) {
      k[d + i] = rk === undefined ? src[ko + i] : rk(src[ko + i]);
      v[d + i] = rv === undefined ? src[vo + i] : rv(src[vo + i]);
    }
  }
}
