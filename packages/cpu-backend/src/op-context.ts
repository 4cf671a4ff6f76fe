/**
 * Argument checking shared by every op kernel. A kernel asks the context for each buffer with
 * the number of elements it will touch; the context resolves the handle, checks its dtype and
 * size, and throws an OpArgumentError naming the op and the argument otherwise. Nothing an op
 * does can index outside a buffer without one of these checks having passed first.
 */
import { BF16_MATMUL_MAX_EXACT_ROWS, type DeviceBuffer, type MatmulPrecision, type Numerics, type OpName } from '@nerva/core';
import type { BufferTable } from './buffers.js';
import { roundBf16, roundHalfInto, storeRounding } from './half.js';
import { OpArgumentError, UnknownHandleError } from './errors.js';
import type { Scratch } from './scratch.js';

export class OpContext {
  /** The op being validated or run; named in every error. */
  op: OpName | '' = '';
  /**
   * Set while validating an op for graph capture: a kernel returns right after its static checks,
   * before reading buffer contents (which are only meaningful at replay) or writing anything.
   */
  dry = false;
  readonly scratch: Scratch;
  /** bf16 numerics: activations are rounded with `round` at transformers' points (core ops.ts). */
  readonly bf16: boolean;
  /** R(v) of the op catalogue's "bf16 numerics": bf16 rounding, or the identity when exact. */
  readonly round: (v: number) => number;
  /** Matmul precision 'bf16': matmuls over more than 8 rows see their activations rounded to bf16. */
  readonly bf16Matmul: boolean;

  constructor(
    private readonly table: BufferTable,
    scratch: Scratch,
    numerics: Numerics = 'exact',
    matmulPrecision: MatmulPrecision = 'exact',
  ) {
    this.scratch = scratch;
    this.bf16 = numerics === 'bf16';
    this.round = this.bf16 ? roundBf16 : identity;
    this.bf16Matmul = matmulPrecision === 'bf16';
  }

  /**
   * The left operand of a matmul over `rows` rows of `width`: `x` itself, or under matmul
   * precision 'bf16' with more than 8 rows, its first rows * width values rounded to bf16 (nearest
   * even), as the CUDA backend's one-GEMM path rounds them. `inPlace`: `x` is scratch of the op's
   * own (a normalized input) and is rounded where it lies; otherwise the rounded copy goes to the
   * f32 scratch.
   */
  matmulInput(x: Float32Array, rows: number, width: number, inPlace = false): Float32Array {
    if (!this.bf16Matmul || rows <= BF16_MATMUL_MAX_EXACT_ROWS) return x;
    const n = rows * width;
    const dst = inPlace ? x : this.scratch.f32(n);
    roundHalfInto('bf16', x.subarray(0, n), dst, 0);
    return dst;
  }

  fail(arg: string, detail: string): never {
    throw new OpArgumentError(this.op, arg, detail);
  }

  /** An integer attribute >= min. */
  count(arg: string, v: number, min = 0): number {
    if (!Number.isSafeInteger(v) || v < min) this.fail(arg, `must be an integer >= ${min}, got ${String(v)}`);
    return v;
  }

  /** A finite real attribute. */
  real(arg: string, v: number): number {
    if (typeof v !== 'number' || !Number.isFinite(v)) this.fail(arg, `must be a finite number, got ${String(v)}`);
    return v;
  }

  private record(arg: string, buf: DeviceBuffer | undefined, need: number) {
    if (buf === undefined || buf === null) this.fail(arg, 'buffer is missing');
    let rec;
    try {
      rec = this.table.resolve(buf, `op ${this.op} argument ${arg}`);
    } catch (e) {
      if (e instanceof UnknownHandleError) this.fail(arg, e.message);
      throw e;
    }
    if (rec.handle.length < need) this.fail(arg, `buffer #${buf.id} has ${rec.handle.length} elements, the op needs ${need}`);
    return rec;
  }

  /** A float buffer of any float dtype (f32, bf16, f16), read as float32. */
  floats(arg: string, buf: DeviceBuffer | undefined, need: number): Float32Array {
    const rec = this.record(arg, buf, need);
    if (!(rec.data instanceof Float32Array)) this.fail(arg, `expected a float buffer, got ${rec.handle.dtype}`);
    return rec.data;
  }

  /** A float buffer written by the op: must be f32 so no rounding to a narrower type is due. */
  f32(arg: string, buf: DeviceBuffer | undefined, need: number): Float32Array {
    const rec = this.record(arg, buf, need);
    if (rec.handle.dtype !== 'f32') this.fail(arg, `expected an f32 buffer, got ${rec.handle.dtype}`);
    return rec.data as Float32Array;
  }

  /**
   * A float buffer written by the op that may also be bf16 (capabilities.activationDtypes): its
   * values and the rounding every store into it applies (undefined for f32).
   */
  f32OrBf16(arg: string, buf: DeviceBuffer | undefined, need: number): { data: Float32Array; store: ((x: number) => number) | undefined } {
    const rec = this.record(arg, buf, need);
    if (rec.handle.dtype !== 'f32' && rec.handle.dtype !== 'bf16') this.fail(arg, `expected an f32 or bf16 buffer, got ${rec.handle.dtype}`);
    return { data: rec.data as Float32Array, store: storeRounding(rec.handle.dtype) };
  }

  /** An i32 buffer. */
  ints(arg: string, buf: DeviceBuffer | undefined, need: number): Int32Array {
    const rec = this.record(arg, buf, need);
    if (rec.handle.dtype !== 'i32') this.fail(arg, `expected an i32 buffer, got ${rec.handle.dtype}`);
    return rec.data as Int32Array;
  }

  /** Reject an output that is the same buffer as an input the op still reads while writing. */
  distinct(outArg: string, out: DeviceBuffer, inArg: string, input: DeviceBuffer): void {
    if (out === input) this.fail(outArg, `must not be the same buffer as ${inArg}`);
  }
}

/** Elements spanned by `rows` rows of `width` at `offset` with row stride `stride`. */
export function span(rows: number, stride: number, offset: number, width: number): number {
  return rows === 0 ? 0 : (rows - 1) * stride + offset + width;
}

function identity(v: number): number {
  return v;
}
