import { sampleRow, sampleRowMasked, uniformFromSeed, type OpArgs, type SampleParams } from '@nerva/core';
import type { OpContext } from '../op-context.js';
import { advanceStep } from './advance-positions.js';
import { ringPush } from './ring-push.js';

/** Reused across calls: the decode path builds no objects per token. */
const params: SampleParams = { temperature: 0, topK: 0, topP: 1, minP: 0 };
/** A masked row's scratch: the sampler's, plus its allowed logits and their ids (grown to the largest limit seen). */
const masked: { idx: Int32Array; prob: Float64Array; vals: Float32Array; ids: Int32Array } = { idx: new Int32Array(0), prob: new Float64Array(0), vals: new Float32Array(0), ids: new Int32Array(0) };

/**
 * Exactly core's sampleRow with u = uniformFromSeed(seed, counter); the counter then advances by
 * one on every call (also for greedy rows, so a row's stream position never depends on its params).
 */
export function sample(ctx: OpContext, a: OpArgs<'sample'>): void {
  // push and advance: ops ring_push (src = out) and advance_positions after the sampling, their
  // arguments checked before anything is written.
  const push: OpArgs<'ring_push'> | undefined = a.push === undefined ? undefined : { ...tailArg(ctx, 'push', a.push), src: a.out, rows: a.rows };
  const advance: OpArgs<'advance_positions'> | undefined = a.advance === undefined ? undefined : { ...tailArg(ctx, 'advance', a.advance), rows: a.rows };
  if (push || advance) {
    const dry = ctx.dry;
    ctx.dry = true;
    try {
      sampleRows(ctx, a);
      if (push) ringPush(ctx, push);
      if (advance) advanceStep(ctx, advance);
    } finally {
      ctx.dry = dry;
    }
  }
  // The advance's rows (their tables' entries) are checked before the sampling writes.
  const applyAdvance = advance ? advanceStep(ctx, advance) : undefined;
  sampleRows(ctx, a);
  if (push) ringPush(ctx, push);
  applyAdvance?.();
}

function tailArg<T>(ctx: OpContext, name: string, v: T): T {
  if (v === null || typeof v !== 'object') ctx.fail(name, 'must be an object of buffers and numbers');
  return v;
}

function sampleRows(ctx: OpContext, a: OpArgs<'sample'>): void {
  const rows = ctx.count('rows', a.rows);
  const vocab = ctx.count('vocab', a.vocab, 1);
  const limit = a.limit === undefined ? vocab : ctx.count('limit', a.limit, 1);
  if (limit > vocab) ctx.fail('limit', `must be at most vocab (${vocab}), got ${limit}`);
  const logits = ctx.floats('logits', a.logits, rows * vocab);
  const p = ctx.floats('params', a.params, rows * 4);
  const rng = ctx.ints('rng', a.rng, rows * 2);
  const out = ctx.ints('out', a.out, rows);
  const mask = a.mask === undefined ? undefined : maskArgs(ctx, a.mask, rows, limit);
  if (ctx.dry) return;
  for (let r = 0; r < rows; r++) {
    const topK = p[r * 4 + 1];
    if (!Number.isInteger(topK) || topK < 0) ctx.fail('params', `row ${r}: topK must be a non-negative integer, got ${topK}`);
    if (Number.isNaN(p[r * 4]) || Number.isNaN(p[r * 4 + 2]) || Number.isNaN(p[r * 4 + 3])) ctx.fail('params', `row ${r}: NaN parameter`);
  }
  const scratch = ctx.scratch.sampler(vocab);
  masked.idx = scratch.idx;
  masked.prob = scratch.prob;
  for (let r = 0; r < rows; r++) {
    params.temperature = p[r * 4];
    params.topK = p[r * 4 + 1];
    params.topP = p[r * 4 + 2];
    params.minP = p[r * 4 + 3];
    const counter = rng[r * 2 + 1];
    const u = uniformFromSeed(rng[r * 2], counter);
    const m = mask ? mask.index[r] : -1;
    // A masked row: the rule over its allowed ids alone (maskArgs checked it allows one).
    if (m >= 0) out[r] = sampleRowMasked(logits, r * vocab, limit, mask!.bits, m * mask!.words, params, u, masked);
    else out[r] = sampleRow(logits, r * vocab, limit, params, u, scratch);
    rng[r * 2 + 1] = (counter + 1) | 0;
  }
}

/** Op sample's mask argument, checked: every masked row's index in range and allowing some id below `limit`. */
function maskArgs(ctx: OpContext, m: NonNullable<OpArgs<'sample'>['mask']>, rows: number, limit: number): { bits: Int32Array; index: Int32Array; words: number } {
  if (m === null || typeof m !== 'object') ctx.fail('mask', 'must be { bits, index, words }');
  const words = ctx.count('mask.words', m.words, 1);
  if (words * 32 < limit) ctx.fail('mask.words', `must cover the ${limit} sampled ids (at least ${Math.ceil(limit / 32)}), got ${words}`);
  const index = ctx.ints('mask.index', m.index, rows);
  let masks = 0;
  for (let r = 0; r < rows; r++) masks = Math.max(masks, index[r] + 1);
  const bits = ctx.ints('mask.bits', m.bits, masks * words);
  if (ctx.dry) return { bits, index, words };
  for (let r = 0; r < rows; r++) {
    const k = index[r];
    if (k < 0) continue;
    let any = false;
    for (let w = 0; w < words && !any; w++) {
      const lim = Math.min(32, limit - w * 32);
      if (lim <= 0) break;
      const word = bits[k * words + w];
      any = (lim === 32 ? word : word & ((1 << lim) - 1)) !== 0;
    }
    if (!any) ctx.fail('mask', `row ${r}: its mask allows no id below ${limit}`);
  }
  if (masked.vals.length < limit) {
    masked.vals = new Float32Array(limit);
    masked.ids = new Int32Array(limit);
  }
  return { bits, index, words };
}
