import type { DecoderLayerWeights, OpArgs } from '@nerva/core';
import type { OpContext } from '../op-context.js';
import { attention } from './attention.js';
import { embedding } from './embedding.js';
import { fusedMatmul } from './fused-matmul.js';
import { ropeAppend } from './rope-append.js';

/** The six per-layer ops of one layer, with their arguments, in the order the op runs them. */
interface LayerOps {
  qkv: OpArgs<'fused_matmul'>;
  ropeAppend: OpArgs<'rope_append'>;
  attention: OpArgs<'attention'>;
  o: OpArgs<'fused_matmul'>;
  gateUp: OpArgs<'fused_matmul'>;
  down: OpArgs<'fused_matmul'>;
}

/**
 * A stack of dense decoder layers: per layer, literally the ops `fused_matmul` (qkv, norm fused),
 * `rope_append`, `attention`, `fused_matmul` (o, accumulate), `fused_matmul` (gate_up, norm and
 * SiLU-GLU fused) and `fused_matmul` (down, accumulate), so the result is bitwise what the engine's
 * per-layer fused path computes. Everything that can fail (attributes, every layer's weights and
 * caches, the indices in positions/slots/blockTables/rowSeq) is checked before the first write, so
 * a bad call leaves x and every cache untouched.
 */
export function decoderLayers(ctx: OpContext, a: OpArgs<'decoder_layers'>): void {
  const rows = ctx.count('rows', a.rows);
  const hidden = ctx.count('hidden', a.hidden, 1);
  const nq = ctx.count('numHeads', a.numHeads, 1);
  const nkv = ctx.count('numKvHeads', a.numKvHeads, 1);
  if (nq % nkv !== 0) ctx.fail('numKvHeads', `${nkv} does not divide numHeads ${nq}`);
  const hd = ctx.count('headDim', a.headDim, 2);
  if (hd % 2 !== 0) ctx.fail('headDim', `must be even, got ${hd}`);
  const inter = ctx.count('intermediate', a.intermediate, 1);
  const blockSize = ctx.count('blockSize', a.blockSize, 1);
  const maxBlocks = ctx.count('maxBlocksPerSeq', a.maxBlocksPerSeq, 1);
  const eps = ctx.real('eps', a.eps);
  if (eps < 0) ctx.fail('eps', `must be >= 0, got ${eps}`);
  const scale = ctx.real('scale', a.scale);
  if (!Array.isArray(a.layers)) ctx.fail('layers', 'must be an array of DecoderLayerWeights');
  const layers = a.layers;
  const qkvOut = (nq + 2 * nkv) * hd;
  const qw = nq * hd;
  const kvw = nkv * hd;

  ctx.f32('x', a.x, rows * hidden);
  ctx.f32('qkv', a.qkv, rows * qkvOut);
  ctx.f32('attn', a.attn, rows * qw);
  ctx.f32('mlp', a.mlp, rows * inter);
  const positions = ctx.ints('positions', a.positions, rows);
  const slots = ctx.ints('slots', a.slots, rows);
  const rowSeq = ctx.ints('rowSeq', a.rowSeq, rows);
  const tables = ctx.ints('blockTables', a.blockTables, maxBlocks);
  ctx.floats('invFreq', a.invFreq, hd / 2);
  // The four activation buffers are each written while others are read: they must be distinct.
  const acts = { x: a.x, qkv: a.qkv, attn: a.attn, mlp: a.mlp };
  const actNames = Object.keys(acts) as Array<keyof typeof acts>;
  for (let i = 0; i < actNames.length; i++) {
    for (let j = i + 1; j < actNames.length; j++) ctx.distinct(actNames[j], acts[actNames[j]], actNames[i], acts[actNames[i]]);
  }

  // Every layer is checked under its own name first (the sub-ops would name only 'weight' or
  // 'out'), then every sub-op of every layer is dry-run for whatever else it requires.
  let cacheSlots = Infinity;
  let smallest = 0;
  const ops: LayerOps[] = [];
  for (let l = 0; l < layers.length; l++) {
    const lw: DecoderLayerWeights | undefined = layers[l];
    const n = (field: string) => `layers[${l}].${field}`;
    if (lw === undefined || lw === null || typeof lw !== 'object') ctx.fail(`layers[${l}]`, 'must be a DecoderLayerWeights object');
    ctx.floats(n('attnNorm'), lw.attnNorm, hidden);
    const qkRows = (nq + nkv) * hd;
    ctx.floats(n('qkv'), lw.qkv, (lw.qkvTail === undefined ? qkvOut : qkRows) * hidden);
    if (lw.qkvTail !== undefined) ctx.floats(n('qkvTail'), lw.qkvTail, nkv * hd * hidden);
    if (lw.qkvBias !== undefined) ctx.floats(n('qkvBias'), lw.qkvBias, qkvOut);
    if (lw.qNorm !== undefined) ctx.floats(n('qNorm'), lw.qNorm, hd);
    if (lw.kNorm !== undefined) ctx.floats(n('kNorm'), lw.kNorm, hd);
    ctx.floats(n('o'), lw.o, hidden * qw);
    if (lw.oBias !== undefined) ctx.floats(n('oBias'), lw.oBias, hidden);
    ctx.floats(n('mlpNorm'), lw.mlpNorm, hidden);
    ctx.floats(n('gateUp'), lw.gateUp, 2 * inter * hidden);
    ctx.floats(n('down'), lw.down, hidden * inter);
    const k = ctx.floats(n('kCache'), lw.kCache, kvw);
    const v = ctx.floats(n('vCache'), lw.vCache, kvw);
    ctx.distinct(n('vCache'), lw.vCache, n('kCache'), lw.kCache);
    for (const act of actNames) {
      ctx.distinct(n('kCache'), lw.kCache, act, acts[act]);
      ctx.distinct(n('vCache'), lw.vCache, act, acts[act]);
    }
    const layerSlots = Math.floor(Math.min(k.length, v.length) / kvw);
    if (layerSlots < cacheSlots) {
      cacheSlots = layerSlots;
      smallest = l;
    }
    ops.push(layerOps(a, lw, { rows, hidden, nq, nkv, hd, inter, blockSize, maxBlocks, eps, scale, qkvOut }));
  }
  // embed: op embedding into x first (its ids are checked before anything is written).
  const embed: OpArgs<'embedding'> | undefined =
    a.embed === undefined ? undefined : { table: a.embed.table, ids: a.embed.ids, out: a.x, rows, hidden };
  if (a.embed !== undefined) {
    if (a.embed === null || typeof a.embed !== 'object') ctx.fail('embed', 'must be { table, ids }');
    for (const act of actNames) {
      ctx.distinct(act, acts[act], 'embed.table', a.embed.table);
      ctx.distinct(act, acts[act], 'embed.ids', a.embed.ids);
    }
  }
  const dry = ctx.dry;
  ctx.dry = true;
  try {
    if (embed) embedding(ctx, embed);
    for (const o of ops) runLayer(ctx, o);
  } finally {
    ctx.dry = dry;
  }
  if (dry) return;

  // The checks on buffer contents that the sub-ops would make only after earlier layers wrote x.
  if (layers.length > 0) {
    const numSeqs = Math.floor(tables.length / maxBlocks);
    const numBlocks = Math.floor(cacheSlots / blockSize);
    const seen = ctx.scratch.flagBuf(numSeqs);
    seen.fill(0, 0, numSeqs);
    for (let r = 0; r < rows; r++) {
      const seq = rowSeq[r];
      const pos = positions[r];
      const slot = slots[r];
      if (seq < 0 || seq >= numSeqs) ctx.fail('rowSeq', `rowSeq[${r}] = ${seq} has no block table (${numSeqs} tables)`);
      if (pos < 0 || pos >= maxBlocks * blockSize) ctx.fail('positions', `positions[${r}] = ${pos} is outside 0..${maxBlocks * blockSize - 1}`);
      if (slot >= cacheSlots) ctx.fail('slots', `slots[${r}] = ${slot} is outside layers[${smallest}]'s cache (${cacheSlots} slots)`);
      const last = Math.floor(pos / blockSize);
      for (let b = 0; b <= last; b++) {
        const blk = tables[seq * maxBlocks + b];
        if (blk < 0 || blk >= numBlocks) {
          ctx.fail('blockTables', `block ${blk} (sequence ${seq}, entry ${b}) is outside layers[${smallest}]'s cache (${numBlocks} blocks)`);
        }
      }
      // The decode-rows precondition: two appending rows of one sequence would each miss the
      // other's key, which the per-layer ops (one attention over the whole chunk) would not.
      if (slot < 0) continue;
      if (seen[seq] !== 0) ctx.fail('rowSeq', `sequence ${seq} has more than one appending row; a prefill chunk needs the per-layer ops`);
      seen[seq] = 1;
    }
  }
  if (embed) embedding(ctx, embed);
  for (const o of ops) runLayer(ctx, o);
}

interface Dims {
  rows: number;
  hidden: number;
  nq: number;
  nkv: number;
  hd: number;
  inter: number;
  blockSize: number;
  maxBlocks: number;
  eps: number;
  scale: number;
  qkvOut: number;
}

function layerOps(a: OpArgs<'decoder_layers'>, lw: DecoderLayerWeights, d: Dims): LayerOps {
  const { rows, hidden, nq, nkv, hd, inter, eps } = d;
  return {
    qkv: {
      x: a.x,
      weight: lw.qkv,
      ...(lw.qkvTail !== undefined ? { weightTail: lw.qkvTail, tailFrom: (nq + nkv) * hd } : {}),
      bias: lw.qkvBias,
      out: a.qkv,
      rows,
      inDim: hidden,
      outDim: d.qkvOut,
      normWeight: lw.attnNorm,
      eps,
    },
    ropeAppend: {
      qkv: a.qkv,
      positions: a.positions,
      invFreq: a.invFreq,
      slots: a.slots,
      kCache: lw.kCache,
      vCache: lw.vCache,
      rows,
      numHeads: nq,
      numKvHeads: nkv,
      headDim: hd,
      rowStride: d.qkvOut,
      qNorm: lw.qNorm,
      kNorm: lw.kNorm,
      eps,
    },
    attention: {
      q: a.qkv,
      kCache: lw.kCache,
      vCache: lw.vCache,
      out: a.attn,
      blockTables: a.blockTables,
      rowSeq: a.rowSeq,
      positions: a.positions,
      rows,
      numHeads: nq,
      numKvHeads: nkv,
      headDim: hd,
      blockSize: d.blockSize,
      maxBlocksPerSeq: d.maxBlocks,
      qRowStride: d.qkvOut,
      qOffset: 0,
      scale: d.scale,
    },
    o: { x: a.attn, weight: lw.o, bias: lw.oBias, out: a.x, rows, inDim: nq * hd, outDim: hidden, accumulate: true },
    gateUp: { x: a.x, weight: lw.gateUp, out: a.mlp, rows, inDim: hidden, outDim: inter, normWeight: lw.mlpNorm, eps, glu: true },
    down: { x: a.mlp, weight: lw.down, out: a.x, rows, inDim: inter, outDim: hidden, accumulate: true },
  };
}

function runLayer(ctx: OpContext, o: LayerOps): void {
  fusedMatmul(ctx, o.qkv);
  ropeAppend(ctx, o.ropeAppend);
  attention(ctx, o.attention);
  fusedMatmul(ctx, o.o);
  fusedMatmul(ctx, o.gateUp);
  fusedMatmul(ctx, o.down);
}
