// The decode ops on the GEMV kernels: fused projections and the whole layer stack (op decoder_layers).
import { type OpArgs } from '@nerva/core';
import { FLOAT, INT, WEIGHT, MATRIX, QUANT_WEIGHT, type OpEncoders } from './encoder.js';

export const GEMV_ENCODERS: OpEncoders<'fused_matmul' | 'decoder_layers'> = {
  fused_matmul(e, x, c, B) {
    const rows = c('rows'), inDim = c('inDim', 1), outDim = c('outDim', 1);
    const glu = x.glu === true;
    const eps = x.eps === undefined ? 1e-6 : (x.eps as number);
    if (!(eps >= 0)) e.fail(`eps must be >= 0, got ${eps}`);
    if (glu && B('bias')) e.fail('bias is not allowed with glu');
    if (glu && B('weightTail')) e.fail('weightTail is not allowed with glu');
    e.buf('x', B('x'), rows * inDim, FLOAT);
    const tail = e.weight(x, B('weight'), B('weightTail'), (glu ? 2 : 1) * outDim, inDim);
    e.buf('out', B('out'), rows * outDim, FLOAT);
    e.optBuf('bias', B('bias'), outDim, WEIGHT);
    e.optBuf('normWeight', B('normWeight'), inDim, WEIGHT);
    e.num(rows); e.num(inDim); e.num(outDim); e.num(eps); e.num(glu ? 1 : 0); e.num(x.accumulate === true ? 1 : 0);
    tail();
  },
  decoder_layers(e, x, c, B) {
    const rows = c('rows'), hidden = c('hidden', 1), nq = c('numHeads', 1), nkv = c('numKvHeads', 1), hd = c('headDim', 2);
    const inter = c('intermediate', 1), bs = c('blockSize', 1), mbps = c('maxBlocksPerSeq', 1);
    if (hd % 2 !== 0) e.fail(`headDim must be even, got ${hd}`);
    if (hd > 256) e.fail(`headDim ${hd} > 256 is not supported`);
    if (nq % nkv !== 0) e.fail(`numHeads ${nq} is not a multiple of numKvHeads ${nkv}`);
    const eps = x.eps as number, scale = x.scale as number;
    if (!(eps >= 0)) e.fail(`eps must be >= 0, got ${eps}`);
    if (!Number.isFinite(scale)) e.fail(`scale must be finite, got ${scale}`);
    const layers = x.layers as OpArgs<'decoder_layers'>['layers'];
    if (!Array.isArray(layers)) e.fail('layers must be an array');
    const qkvOut = (nq + 2 * nkv) * hd, qw = nq * hd;
    e.reserve(73 + layers.length * 26);
    e.buf('x', B('x'), rows * hidden, FLOAT);
    e.buf('qkv', B('qkv'), rows * qkvOut, FLOAT);
    e.buf('attn', B('attn'), rows * qw, FLOAT);
    e.buf('mlp', B('mlp'), rows * inter, FLOAT);
    e.buf('positions', B('positions'), rows, INT);
    e.buf('slots', B('slots'), rows, INT);
    e.buf('blockTables', B('blockTables'), mbps, INT);
    e.buf('rowSeq', B('rowSeq'), rows, INT);
    e.buf('invFreq', B('invFreq'), hd / 2, FLOAT);
    e.num(rows); e.num(hidden); e.num(nq); e.num(nkv); e.num(hd); e.num(inter); e.num(bs); e.num(mbps);
    const maxKeys = x.maxKeys === undefined ? 0 : c('maxKeys');
    const minKeys = x.minKeys === undefined ? 0 : c('minKeys');
    e.num(eps); e.num(scale); e.num(maxKeys); e.num(minKeys); e.num(layers.length);
    layers.forEach((l, i) => {
      const L = (name: string) => `layers[${i}].${name}`;
      e.buf(L('attnNorm'), l.attnNorm, hidden, WEIGHT);
      // A v apart (qkvTail, block-quantized like q and k): qkv holds the q and k rows.
      if (l.qkvTail) {
        e.buf(L('qkv'), l.qkv, (nq + nkv) * hd * hidden, QUANT_WEIGHT);
        e.buf(L('qkvTail'), l.qkvTail, nkv * hd * hidden, QUANT_WEIGHT);
      } else {
        e.buf(L('qkv'), l.qkv, qkvOut * hidden, MATRIX);
        e.optBuf(L('qkvTail'), undefined, 0, MATRIX);
      }
      e.optBuf(L('qkvBias'), l.qkvBias, qkvOut, WEIGHT);
      e.optBuf(L('qNorm'), l.qNorm, hd, WEIGHT);
      e.optBuf(L('kNorm'), l.kNorm, hd, WEIGHT);
      e.buf(L('o'), l.o, hidden * qw, MATRIX);
      e.optBuf(L('oBias'), l.oBias, hidden, WEIGHT);
      e.buf(L('mlpNorm'), l.mlpNorm, hidden, WEIGHT);
      e.buf(L('gateUp'), l.gateUp, 2 * inter * hidden, MATRIX);
      e.buf(L('down'), l.down, hidden * inter, MATRIX);
      e.buf(L('kCache'), l.kCache, nkv * hd, WEIGHT);
      e.buf(L('vCache'), l.vCache, nkv * hd, WEIGHT);
    });
    // embed: a flag, then the table and the ids (rows of hidden; ids as op embedding takes them).
    const embed = x.embed as OpArgs<'decoder_layers'>['embed'];
    if (embed === undefined) {
      e.num(0);
    } else {
      if (embed === null || typeof embed !== 'object') e.fail('embed must be { table, ids }');
      e.num(1);
      e.buf('embed.table', embed.table, hidden, MATRIX);
      e.buf('embed.ids', embed.ids, rows, INT);
    }
  },
};
