// Element-wise and row ops: embedding, norms, RoPE and the KV append, SwiGLU, residual adds, row gathers.
import { FLOAT_OR_BF16, FLOAT, INT, WEIGHT, MATRIX, ANY, type OpEncoders } from './encoder.js';

export const ELEMENTWISE_ENCODERS: OpEncoders<'embedding' | 'rmsnorm' | 'rope' | 'kv_append' | 'rope_append' | 'silu_mul' | 'add' | 'gather_rows'> = {
  embedding(e, x, c, B) {
    const rows = c('rows'), hidden = c('hidden', 1);
    e.buf('table', B('table'), hidden, MATRIX);
    e.buf('ids', B('ids'), rows, INT);
    e.buf('out', B('out'), rows * hidden, FLOAT);
    e.num(rows); e.num(hidden);
  },
  rmsnorm(e, x, c, B) {
    const rows = c('rows'), dim = c('dim', 1);
    const eps = x.eps as number;
    if (!(eps >= 0)) e.fail(`eps must be >= 0, got ${eps}`);
    e.buf('x', B('x'), rows * dim, FLOAT);
    e.buf('weight', B('weight'), dim, WEIGHT);
    e.buf('out', B('out'), rows * dim, FLOAT_OR_BF16);
    e.optBuf('residual', B('residual'), rows * dim, FLOAT);
    e.num(rows); e.num(dim); e.num(eps);
  },
  rope(e, x, c, B) {
    const rows = c('rows'), heads = c('numHeads'), hd = c('headDim', 2), stride = c('rowStride', 1), off = c('headOffset');
    if (hd % 2 !== 0) e.fail(`headDim must be even, got ${hd}`);
    if (off + heads * hd > stride) e.fail(`heads [${off}, ${off + heads * hd}) exceed rowStride ${stride}`);
    const eps = x.eps === undefined ? 1e-6 : (x.eps as number);
    e.buf('x', B('x'), rows > 0 ? (rows - 1) * stride + off + heads * hd : 0, FLOAT);
    e.buf('positions', B('positions'), rows, INT);
    e.buf('invFreq', B('invFreq'), hd / 2, FLOAT);
    e.optBuf('normWeight', B('normWeight'), hd, WEIGHT);
    e.num(rows); e.num(heads); e.num(hd); e.num(stride); e.num(off); e.num(eps);
  },
  kv_append(e, x, c, B) {
    const rows = c('rows'), kvh = c('numKvHeads', 1), hd = c('headDim', 1), stride = c('rowStride', 1);
    const kOff = c('kOffset'), vOff = c('vOffset'), w = kvh * hd;
    if (kOff + w > stride || vOff + w > stride) e.fail(`key/value ranges exceed rowStride ${stride}`);
    e.buf('src', B('src'), rows > 0 ? (rows - 1) * stride + Math.max(kOff, vOff) + w : 0, FLOAT);
    e.buf('kCache', B('kCache'), w, WEIGHT);
    e.buf('vCache', B('vCache'), w, WEIGHT);
    e.buf('slots', B('slots'), rows, INT);
    e.num(rows); e.num(kvh); e.num(hd); e.num(stride); e.num(kOff); e.num(vOff);
  },
  rope_append(e, x, c, B) {
    const rows = c('rows'), nq = c('numHeads', 1), nkv = c('numKvHeads', 1), hd = c('headDim', 2), stride = c('rowStride', 1);
    if (hd % 2 !== 0) e.fail(`headDim must be even, got ${hd}`);
    if ((nq + 2 * nkv) * hd > stride) e.fail(`q, k and v heads need ${(nq + 2 * nkv) * hd} elements, rowStride is ${stride}`);
    const eps = x.eps === undefined ? 1e-6 : (x.eps as number);
    if (!(eps >= 0)) e.fail(`eps must be >= 0, got ${eps}`);
    e.buf('qkv', B('qkv'), rows > 0 ? (rows - 1) * stride + (nq + 2 * nkv) * hd : 0, FLOAT);
    e.buf('positions', B('positions'), rows, INT);
    e.buf('invFreq', B('invFreq'), hd / 2, FLOAT);
    e.buf('slots', B('slots'), rows, INT);
    e.buf('kCache', B('kCache'), nkv * hd, WEIGHT);
    e.buf('vCache', B('vCache'), nkv * hd, WEIGHT);
    e.optBuf('qNorm', B('qNorm'), hd, WEIGHT);
    e.optBuf('kNorm', B('kNorm'), hd, WEIGHT);
    e.num(rows); e.num(nq); e.num(nkv); e.num(hd); e.num(stride); e.num(eps);
  },
  silu_mul(e, x, c, B) {
    const rows = c('rows'), dim = c('dim');
    e.buf('x', B('x'), rows * 2 * dim, FLOAT);
    e.buf('out', B('out'), rows * dim, FLOAT_OR_BF16);
    e.num(rows); e.num(dim);
  },
  add(e, x, c, B) {
    const len = c('length');
    e.buf('a', B('a'), len, FLOAT);
    e.buf('b', B('b'), len, FLOAT);
    e.buf('out', B('out'), len, FLOAT);
    e.num(len);
  },
  gather_rows(e, x, c, B) {
    const n = c('n'), dim = c('dim');
    const xb = B('x');
    const dt = xb ? e.resolve(xb, `op ${e.op}: x`).dtype : 'f32';
    e.buf('x', xb, dim, ANY);
    e.buf('rowIdx', B('rowIdx'), n, INT);
    e.buf('out', B('out'), n * dim, [dt]);
    e.num(n); e.num(dim);
  },
};
