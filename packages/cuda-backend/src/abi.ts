import { OP_NAMES, type DType, type DeviceBuffer, type OpArgs, type OpName } from '@nerva/core';
import { CudaArgumentError } from './errors.js';

/** Element type codes of native/nerva.h. */
export const DTYPE_CODES: Readonly<Record<DType, number>> = { f32: 0, bf16: 1, f16: 2, i32: 3 };

/** Op codes of native/nerva.h: the position in OP_NAMES. */
export const OP_CODES: Readonly<Record<OpName, number>> = Object.fromEntries(OP_NAMES.map((n, i) => [n, i])) as Record<OpName, number>;

/** What the encoder needs to know about a buffer. */
export interface ResolvedBuffer {
  readonly addr: number;
  readonly dtype: DType;
  readonly length: number;
}

type Resolve = (b: DeviceBuffer, what: string) => ResolvedBuffer;

const FLOAT: readonly DType[] = ['f32'];
/** Activations capabilities.bf16Activations lets be bf16 (rmsnorm and silu_mul outs, matmul x). */
const FLOAT_OR_BF16: readonly DType[] = ['f32', 'bf16'];
const INT: readonly DType[] = ['i32'];
const WEIGHT: readonly DType[] = ['f32', 'bf16', 'f16'];
const ANY: readonly DType[] = ['f32', 'bf16', 'f16', 'i32'];

/**
 * Packs an op's arguments into one Float64Array (the native ABI: every buffer as address and
 * dtype code, then the attributes, in the order the launchers of native/ops decode them). Validates what
 * can be checked on the host: dtypes, element counts against buffer lengths, attribute ranges,
 * so a bad call is a typed error rather than an illegal memory access on the GPU.
 */
export class OpEncoder {
  /** Grows (outside the hot path: the first call of a shape) for ops with per-layer buffers. */
  args = new Float64Array(64);
  n = 0;
  private op = '';

  constructor(private readonly resolve: Resolve) {}

  private fail(detail: string): never {
    throw new CudaArgumentError(`op ${this.op}`, detail);
  }

  private count(name: string, v: number, min = 0): number {
    if (!Number.isInteger(v) || v < min) this.fail(`${name} must be an integer >= ${min}, got ${v}`);
    return v;
  }

  private buf(name: string, b: DeviceBuffer | undefined, need: number, dtypes: readonly DType[]): void {
    if (!b) this.fail(`missing buffer ${name}`);
    const r = this.resolve(b, `op ${this.op}: ${name}`);
    if (!dtypes.includes(r.dtype)) this.fail(`${name} must be ${dtypes.join(' or ')}, got ${r.dtype}`);
    if (need > r.length) this.fail(`${name} needs ${need} elements, has ${r.length}`);
    this.args[this.n++] = r.addr;
    this.args[this.n++] = DTYPE_CODES[r.dtype];
  }

  private optBuf(name: string, b: DeviceBuffer | undefined, need: number, dtypes: readonly DType[]): void {
    if (b) this.buf(name, b, need, dtypes);
    else {
      this.args[this.n++] = 0;
      this.args[this.n++] = 0;
    }
  }

  private num(v: number): void {
    this.args[this.n++] = v;
  }

  private reserve(n: number): void {
    if (this.args.length < n) this.args = new Float64Array(n);
  }

  encode<K extends OpName>(op: K, a: OpArgs<K>): void {
    this.n = 0;
    this.op = op;
    const x = a as unknown as Record<string, unknown>;
    const c = (name: string, min = 0) => this.count(name, x[name] as number, min);
    const B = (name: string) => x[name] as DeviceBuffer | undefined;
    switch (op) {
      case 'embedding': {
        const rows = c('rows'), hidden = c('hidden', 1);
        this.buf('table', B('table'), hidden, WEIGHT);
        this.buf('ids', B('ids'), rows, INT);
        this.buf('out', B('out'), rows * hidden, FLOAT);
        this.num(rows); this.num(hidden);
        return;
      }
      case 'rmsnorm': {
        const rows = c('rows'), dim = c('dim', 1);
        const eps = x.eps as number;
        if (!(eps >= 0)) this.fail(`eps must be >= 0, got ${eps}`);
        this.buf('x', B('x'), rows * dim, FLOAT);
        this.buf('weight', B('weight'), dim, WEIGHT);
        this.buf('out', B('out'), rows * dim, FLOAT_OR_BF16);
        this.optBuf('residual', B('residual'), rows * dim, FLOAT);
        this.num(rows); this.num(dim); this.num(eps);
        return;
      }
      case 'matmul': {
        const rows = c('rows'), inDim = c('inDim', 1), outDim = c('outDim', 1);
        const wOff = x.weightOffset === undefined ? 0 : this.count('weightOffset', x.weightOffset as number);
        // A bf16 x (capabilities.bf16Activations) goes straight to the GEMM: more than 8 rows.
        if (B('x')?.dtype === 'bf16' && rows <= 8) this.fail(`a bf16 x needs more than 8 rows (the GEMM), got ${rows}`);
        this.buf('x', B('x'), rows * inDim, FLOAT_OR_BF16);
        this.buf('weight', B('weight'), wOff + outDim * inDim, WEIGHT);
        this.buf('out', B('out'), rows * outDim, FLOAT);
        this.optBuf('bias', B('bias'), outDim, WEIGHT);
        this.num(rows); this.num(inDim); this.num(outDim); this.num(wOff);
        return;
      }
      case 'rope': {
        const rows = c('rows'), heads = c('numHeads'), hd = c('headDim', 2), stride = c('rowStride', 1), off = c('headOffset');
        if (hd % 2 !== 0) this.fail(`headDim must be even, got ${hd}`);
        if (off + heads * hd > stride) this.fail(`heads [${off}, ${off + heads * hd}) exceed rowStride ${stride}`);
        const eps = x.eps === undefined ? 1e-6 : (x.eps as number);
        this.buf('x', B('x'), rows > 0 ? (rows - 1) * stride + off + heads * hd : 0, FLOAT);
        this.buf('positions', B('positions'), rows, INT);
        this.buf('invFreq', B('invFreq'), hd / 2, FLOAT);
        this.optBuf('normWeight', B('normWeight'), hd, WEIGHT);
        this.num(rows); this.num(heads); this.num(hd); this.num(stride); this.num(off); this.num(eps);
        return;
      }
      case 'kv_append': {
        const rows = c('rows'), kvh = c('numKvHeads', 1), hd = c('headDim', 1), stride = c('rowStride', 1);
        const kOff = c('kOffset'), vOff = c('vOffset'), w = kvh * hd;
        if (kOff + w > stride || vOff + w > stride) this.fail(`key/value ranges exceed rowStride ${stride}`);
        this.buf('src', B('src'), rows > 0 ? (rows - 1) * stride + Math.max(kOff, vOff) + w : 0, FLOAT);
        this.buf('kCache', B('kCache'), w, WEIGHT);
        this.buf('vCache', B('vCache'), w, WEIGHT);
        this.buf('slots', B('slots'), rows, INT);
        this.num(rows); this.num(kvh); this.num(hd); this.num(stride); this.num(kOff); this.num(vOff);
        return;
      }
      case 'attention': {
        const rows = c('rows'), H = c('numHeads', 1), KVH = c('numKvHeads', 1), hd = c('headDim', 1), bs = c('blockSize', 1);
        const mbps = c('maxBlocksPerSeq', 1), qStride = c('qRowStride', 1), qOff = c('qOffset');
        if (H % KVH !== 0) this.fail(`numHeads ${H} is not a multiple of numKvHeads ${KVH}`);
        if (hd > 256) this.fail(`headDim ${hd} > 256 is not supported`);
        if (qOff + H * hd > qStride) this.fail(`q heads exceed qRowStride ${qStride}`);
        const window = x.window === undefined ? 0 : c('window');
        this.buf('q', B('q'), rows > 0 ? (rows - 1) * qStride + qOff + H * hd : 0, FLOAT);
        this.buf('kCache', B('kCache'), KVH * hd, WEIGHT);
        this.buf('vCache', B('vCache'), KVH * hd, WEIGHT);
        this.buf('out', B('out'), rows * H * hd, FLOAT);
        this.buf('blockTables', B('blockTables'), mbps, INT);
        this.buf('rowSeq', B('rowSeq'), rows, INT);
        this.buf('positions', B('positions'), rows, INT);
        this.num(rows); this.num(H); this.num(KVH); this.num(hd); this.num(bs); this.num(mbps); this.num(qStride); this.num(qOff);
        this.num(x.scale as number);
        this.num(window);
        // Partial attention (tiered KV): skips negative block-table entries, writes the log-sum-exp.
        this.optBuf('lse', B('lse'), rows * H, FLOAT);
        // Every row of one sequence (the caller's promise): prefill tiles need no seam pass.
        this.num(x.oneSequence === true ? 1 : 0);
        return;
      }
      case 'attention_merge': {
        const rows = c('rows'), H = c('numHeads', 1), hd = c('headDim', 1);
        this.buf('out', B('out'), rows * H * hd, FLOAT);
        this.buf('lse', B('lse'), rows * H, FLOAT);
        this.buf('other', B('other'), rows * H * hd, FLOAT);
        this.buf('otherLse', B('otherLse'), rows * H, FLOAT);
        this.num(rows); this.num(H); this.num(hd);
        return;
      }
      case 'silu_mul': {
        const rows = c('rows'), dim = c('dim');
        this.buf('x', B('x'), rows * 2 * dim, FLOAT);
        this.buf('out', B('out'), rows * dim, FLOAT_OR_BF16);
        this.num(rows); this.num(dim);
        return;
      }
      case 'add': {
        const len = c('length');
        this.buf('a', B('a'), len, FLOAT);
        this.buf('b', B('b'), len, FLOAT);
        this.buf('out', B('out'), len, FLOAT);
        this.num(len);
        return;
      }
      case 'gather_rows': {
        const n = c('n'), dim = c('dim');
        const xb = B('x');
        const dt = xb ? this.resolve(xb, `op ${op}: x`).dtype : 'f32';
        this.buf('x', xb, dim, ANY);
        this.buf('rowIdx', B('rowIdx'), n, INT);
        this.buf('out', B('out'), n * dim, [dt]);
        this.num(n); this.num(dim);
        return;
      }
      case 'moe_route': {
        const rows = c('rows'), E = c('numExperts', 1), K = c('topK', 1);
        if (K > E || K > 32) this.fail(`topK ${K} must be <= numExperts (${E}) and <= 32`);
        this.buf('logits', B('logits'), rows * E, FLOAT);
        this.buf('topIds', B('topIds'), rows * K, INT);
        this.buf('topWeights', B('topWeights'), rows * K, FLOAT);
        this.num(rows); this.num(E); this.num(K); this.num(x.normalize ? 1 : 0);
        return;
      }
      case 'moe_mlp': {
        const rows = c('rows'), hidden = c('hidden', 1), inter = c('inter', 1), K = c('topK', 1);
        this.buf('x', B('x'), rows * hidden, FLOAT);
        this.buf('topIds', B('topIds'), rows * K, INT);
        this.buf('topWeights', B('topWeights'), rows * K, FLOAT);
        this.buf('gateUp', B('gateUp'), 2 * inter * hidden, WEIGHT);
        this.buf('down', B('down'), hidden * inter, WEIGHT);
        this.buf('out', B('out'), rows * hidden, FLOAT);
        this.num(rows); this.num(hidden); this.num(inter); this.num(K);
        return;
      }
      case 'argmax': {
        const rows = c('rows'), vocab = c('vocab', 1);
        this.buf('logits', B('logits'), rows * vocab, FLOAT);
        this.buf('out', B('out'), rows, INT);
        this.num(rows); this.num(vocab);
        return;
      }
      case 'sample': {
        const rows = c('rows'), vocab = c('vocab', 1);
        this.reserve(32);
        this.buf('logits', B('logits'), rows * vocab, FLOAT);
        this.buf('params', B('params'), rows * 4, FLOAT);
        this.buf('rng', B('rng'), rows * 2, INT);
        this.buf('out', B('out'), rows, INT);
        this.num(rows); this.num(vocab);
        // push, then advance: a flag each, then their buffers and numbers (as ops ring_push and
        // advance_positions take them; src and rows are the sampling's).
        const push = x.push as OpArgs<'sample'>['push'];
        if (push === undefined) this.num(0);
        else {
          if (push === null || typeof push !== 'object') this.fail('push must be { ring, cursor, capacity }');
          const cap = this.count('push.capacity', push.capacity, 1);
          if (rows > cap) this.fail(`${rows} rows exceed the ring capacity ${cap}`);
          this.num(1);
          this.buf('push.ring', push.ring, cap, INT);
          this.buf('push.cursor', push.cursor, 1, INT);
          this.num(cap);
        }
        const adv = x.advance as OpArgs<'sample'>['advance'];
        if (adv === undefined) this.num(0);
        else {
          if (adv === null || typeof adv !== 'object') this.fail('advance must be { positions, slots, blockTables, rowSeq, blockSize, maxBlocksPerSeq }');
          const bs = this.count('advance.blockSize', adv.blockSize, 1), mbps = this.count('advance.maxBlocksPerSeq', adv.maxBlocksPerSeq, 1);
          this.num(1);
          this.buf('advance.positions', adv.positions, rows, INT);
          this.buf('advance.slots', adv.slots, rows, INT);
          this.buf('advance.blockTables', adv.blockTables, mbps, INT);
          this.buf('advance.rowSeq', adv.rowSeq, rows, INT);
          this.num(bs); this.num(mbps);
        }
        return;
      }
      case 'ring_push': {
        const rows = c('rows'), cap = c('capacity', 1);
        this.buf('src', B('src'), rows, INT);
        this.buf('ring', B('ring'), cap, INT);
        this.buf('cursor', B('cursor'), 1, INT);
        this.num(rows); this.num(cap);
        return;
      }
      case 'advance_positions': {
        const rows = c('rows'), bs = c('blockSize', 1), mbps = c('maxBlocksPerSeq', 1);
        this.buf('positions', B('positions'), rows, INT);
        this.buf('slots', B('slots'), rows, INT);
        this.buf('blockTables', B('blockTables'), mbps, INT);
        this.buf('rowSeq', B('rowSeq'), rows, INT);
        this.num(rows); this.num(bs); this.num(mbps);
        return;
      }
      case 'fused_matmul': {
        const rows = c('rows'), inDim = c('inDim', 1), outDim = c('outDim', 1);
        const glu = x.glu === true;
        const eps = x.eps === undefined ? 1e-6 : (x.eps as number);
        if (!(eps >= 0)) this.fail(`eps must be >= 0, got ${eps}`);
        if (glu && B('bias')) this.fail('bias is not allowed with glu');
        this.buf('x', B('x'), rows * inDim, FLOAT);
        this.buf('weight', B('weight'), (glu ? 2 : 1) * outDim * inDim, WEIGHT);
        this.buf('out', B('out'), rows * outDim, FLOAT);
        this.optBuf('bias', B('bias'), outDim, WEIGHT);
        this.optBuf('normWeight', B('normWeight'), inDim, WEIGHT);
        this.num(rows); this.num(inDim); this.num(outDim); this.num(eps); this.num(glu ? 1 : 0); this.num(x.accumulate === true ? 1 : 0);
        return;
      }
      case 'rope_append': {
        const rows = c('rows'), nq = c('numHeads', 1), nkv = c('numKvHeads', 1), hd = c('headDim', 2), stride = c('rowStride', 1);
        if (hd % 2 !== 0) this.fail(`headDim must be even, got ${hd}`);
        if ((nq + 2 * nkv) * hd > stride) this.fail(`q, k and v heads need ${(nq + 2 * nkv) * hd} elements, rowStride is ${stride}`);
        const eps = x.eps === undefined ? 1e-6 : (x.eps as number);
        if (!(eps >= 0)) this.fail(`eps must be >= 0, got ${eps}`);
        this.buf('qkv', B('qkv'), rows > 0 ? (rows - 1) * stride + (nq + 2 * nkv) * hd : 0, FLOAT);
        this.buf('positions', B('positions'), rows, INT);
        this.buf('invFreq', B('invFreq'), hd / 2, FLOAT);
        this.buf('slots', B('slots'), rows, INT);
        this.buf('kCache', B('kCache'), nkv * hd, WEIGHT);
        this.buf('vCache', B('vCache'), nkv * hd, WEIGHT);
        this.optBuf('qNorm', B('qNorm'), hd, WEIGHT);
        this.optBuf('kNorm', B('kNorm'), hd, WEIGHT);
        this.num(rows); this.num(nq); this.num(nkv); this.num(hd); this.num(stride); this.num(eps);
        return;
      }
      case 'decoder_layers': {
        const rows = c('rows'), hidden = c('hidden', 1), nq = c('numHeads', 1), nkv = c('numKvHeads', 1), hd = c('headDim', 2);
        const inter = c('intermediate', 1), bs = c('blockSize', 1), mbps = c('maxBlocksPerSeq', 1);
        if (hd % 2 !== 0) this.fail(`headDim must be even, got ${hd}`);
        if (hd > 256) this.fail(`headDim ${hd} > 256 is not supported`);
        if (nq % nkv !== 0) this.fail(`numHeads ${nq} is not a multiple of numKvHeads ${nkv}`);
        const eps = x.eps as number, scale = x.scale as number;
        if (!(eps >= 0)) this.fail(`eps must be >= 0, got ${eps}`);
        if (!Number.isFinite(scale)) this.fail(`scale must be finite, got ${scale}`);
        const layers = x.layers as OpArgs<'decoder_layers'>['layers'];
        if (!Array.isArray(layers)) this.fail('layers must be an array');
        const qkvOut = (nq + 2 * nkv) * hd, qw = nq * hd;
        this.reserve(72 + layers.length * 24);
        this.buf('x', B('x'), rows * hidden, FLOAT);
        this.buf('qkv', B('qkv'), rows * qkvOut, FLOAT);
        this.buf('attn', B('attn'), rows * qw, FLOAT);
        this.buf('mlp', B('mlp'), rows * inter, FLOAT);
        this.buf('positions', B('positions'), rows, INT);
        this.buf('slots', B('slots'), rows, INT);
        this.buf('blockTables', B('blockTables'), mbps, INT);
        this.buf('rowSeq', B('rowSeq'), rows, INT);
        this.buf('invFreq', B('invFreq'), hd / 2, FLOAT);
        this.num(rows); this.num(hidden); this.num(nq); this.num(nkv); this.num(hd); this.num(inter); this.num(bs); this.num(mbps);
        const maxKeys = x.maxKeys === undefined ? 0 : c('maxKeys');
        this.num(eps); this.num(scale); this.num(maxKeys); this.num(layers.length);
        layers.forEach((l, i) => {
          const L = (name: string) => `layers[${i}].${name}`;
          this.buf(L('attnNorm'), l.attnNorm, hidden, WEIGHT);
          this.buf(L('qkv'), l.qkv, qkvOut * hidden, WEIGHT);
          this.optBuf(L('qkvBias'), l.qkvBias, qkvOut, WEIGHT);
          this.optBuf(L('qNorm'), l.qNorm, hd, WEIGHT);
          this.optBuf(L('kNorm'), l.kNorm, hd, WEIGHT);
          this.buf(L('o'), l.o, hidden * qw, WEIGHT);
          this.optBuf(L('oBias'), l.oBias, hidden, WEIGHT);
          this.buf(L('mlpNorm'), l.mlpNorm, hidden, WEIGHT);
          this.buf(L('gateUp'), l.gateUp, 2 * inter * hidden, WEIGHT);
          this.buf(L('down'), l.down, hidden * inter, WEIGHT);
          this.buf(L('kCache'), l.kCache, nkv * hd, WEIGHT);
          this.buf(L('vCache'), l.vCache, nkv * hd, WEIGHT);
        });
        // embed: a flag, then the table and the ids (rows of hidden; ids as op embedding takes them).
        const embed = x.embed as OpArgs<'decoder_layers'>['embed'];
        if (embed === undefined) {
          this.num(0);
        } else {
          if (embed === null || typeof embed !== 'object') this.fail('embed must be { table, ids }');
          this.num(1);
          this.buf('embed.table', embed.table, hidden, WEIGHT);
          this.buf('embed.ids', embed.ids, rows, INT);
        }
        return;
      }
      default:
        this.fail('unknown op');
    }
  }
}
