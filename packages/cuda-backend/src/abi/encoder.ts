import { OP_NAMES, type DType, type DeviceBuffer, type OpName } from '@nerva/core';
import { CudaArgumentError } from '../errors.js';

/** Element type codes of the native ABI (nerva.h's NervaDType). */
export const DTYPE_CODES: Readonly<Partial<Record<DType, number>>> = { f32: 0, bf16: 1, f16: 2, i32: 3, q8_0: 4, q4_0: 5, q4_k: 6, q6_k: 7 };

/** The ggml block-quantized dtypes the kernels read (matmul weights and embedding tables). */
export const QUANT_WEIGHT: readonly DType[] = ['q8_0', 'q4_0', 'q4_k', 'q6_k'];

/** Op codes of the native ABI (nerva.h's NervaOp): the position in OP_NAMES. */
export const OP_CODES: Readonly<Record<OpName, number>> = Object.fromEntries(OP_NAMES.map((n, i) => [n, i])) as Record<OpName, number>;

/** What the encoder needs to know about a buffer. */
export interface ResolvedBuffer {
  readonly addr: number;
  readonly dtype: DType;
  readonly length: number;
}

export type Resolve = (b: DeviceBuffer, what: string) => ResolvedBuffer;

export const FLOAT: readonly DType[] = ['f32'];
/** Activations capabilities.activationDtypes (bf16) lets be bf16 (rmsnorm and silu_mul outs, matmul x). */
export const FLOAT_OR_BF16: readonly DType[] = ['f32', 'bf16'];
export const INT: readonly DType[] = ['i32'];
export const WEIGHT: readonly DType[] = ['f32', 'bf16', 'f16'];
/** A matrix a matmul streams or an embedding table: any weight dtype, quantized ones included. */
export const MATRIX: readonly DType[] = [...WEIGHT, ...QUANT_WEIGHT];
export const ANY: readonly DType[] = ['f32', 'bf16', 'f16', 'i32'];

/**
 * The argument array being written for one op: every buffer as address and dtype code, then the
 * attributes, in the order the op's native launcher decodes them. Each check names the op.
 */
export class ArgWriter {
  /** Grows (outside the hot path: the first call of a shape) for ops with per-layer buffers. */
  args = new Float64Array(64);
  n = 0;
  op = '';

  constructor(readonly resolve: Resolve) {}

  fail(detail: string): never {
    throw new CudaArgumentError(`op ${this.op}`, detail);
  }

  count(name: string, v: number, min = 0): number {
    if (!Number.isInteger(v) || v < min) this.fail(`${name} must be an integer >= ${min}, got ${v}`);
    return v;
  }

  buf(name: string, b: DeviceBuffer | undefined, need: number, dtypes: readonly DType[]): void {
    if (!b) this.fail(`missing buffer ${name}`);
    const r = this.resolve(b, `op ${this.op}: ${name}`);
    if (!dtypes.includes(r.dtype)) this.fail(`${name} must be ${dtypes.join(' or ')}, got ${r.dtype}`);
    if (need > r.length) this.fail(`${name} needs ${need} elements, has ${r.length}`);
    this.args[this.n++] = r.addr;
    this.args[this.n++] = DTYPE_CODES[r.dtype]!;
  }

  optBuf(name: string, b: DeviceBuffer | undefined, need: number, dtypes: readonly DType[]): void {
    if (b) this.buf(name, b, need, dtypes);
    else {
      this.args[this.n++] = 0;
      this.args[this.n++] = 0;
    }
  }

  num(v: number): void {
    this.args[this.n++] = v;
  }

  /**
   * A matmul's weight (op matmul / fused_matmul): `weight` with `wRows` rows of `inDim` (from
   * `offset`), or with a tail (see WeightTail) its rows [0, tailFrom) and the tail's the rest.
   * Writes the weight now; returns what writes the tail and tailFrom after the attributes.
   */
  weight(x: Record<string, unknown>, weight: DeviceBuffer | undefined, tail: DeviceBuffer | undefined, wRows: number, inDim: number, offset = 0): () => void {
    if (tail === undefined) {
      if (x.tailFrom !== undefined) this.fail('tailFrom needs weightTail');
      this.buf('weight', weight, offset + wRows * inDim, MATRIX);
      return () => {
        this.optBuf('weightTail', undefined, 0, MATRIX);
        this.num(0);
      };
    }
    if (offset !== 0) this.fail('weightTail is not allowed with weightOffset');
    const from = this.count('tailFrom', x.tailFrom as number);
    if (from > wRows) this.fail(`tailFrom must be <= outDim (${wRows}), got ${from}`);
    this.buf('weight', weight, from * inDim, QUANT_WEIGHT);
    return () => {
      this.buf('weightTail', tail, (wRows - from) * inDim, QUANT_WEIGHT);
      this.num(from);
    };
  }

  reserve(n: number): void {
    if (this.args.length < n) this.args = new Float64Array(n);
  }
}

/**
 * One op's encoder: `x` its arguments, `c(name, min)` an integer attribute checked against min,
 * `B(name)` a buffer argument.
 */
export type OpEncode = (
  e: ArgWriter,
  x: Record<string, unknown>,
  c: (name: string, min?: number) => number,
  B: (name: string) => DeviceBuffer | undefined,
) => void;

/** The encoders of a family of ops. */
export type OpEncoders<K extends OpName> = Readonly<Record<K, OpEncode>>;
