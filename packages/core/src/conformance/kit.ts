/**
 * The conformance suite's case kit: result and option types, the seeded input generator, and the
 * buffer and output definitions every case family builds on.
 */
import type { Tier } from '../tiers.js';
import type { DeviceBackend, DeviceBuffer, Numerics, OpFieldSupport } from '../backend.js';
import { f32ToBf16, QUANT_BLOCKS, type DType, type QuantDType } from '../dtype.js';
import { dequantize, ggmlTypeOf, randomQuantBlocks } from '../quant/index.js';
import type { OpArgs, OpName } from '../ops.js';
import { mix32 } from '../sampling.js';

export interface ConformanceCaseResult {
  op: OpName;
  name: string;
  ok: boolean;
  /** Largest |backend - reference| over the float outputs (over the integer ones when the case has only those). */
  maxAbsErr: number;
  /** Largest |reference| over the float outputs. */
  maxRef: number;
  /** The bound maxAbsErr was held to: relTol × maxRef + absTol (0 for integer-only cases). */
  tol: number;
  /** Buffers the backend under test still had live after the case (should be 0). */
  leakedBuffers: number;
  /** Why the case failed: a thrown error, an integer mismatch, a leak on the reference. */
  error?: string;
}

export interface ConformanceOptions {
  /** Seed of the input generator (default 0x5eed). */
  seed?: number;
  /** Only these ops (default: every op of OP_NAMES). */
  ops?: OpName[];
  /** 'small' (default): CI-sized shapes. 'large' adds model-sized shapes. */
  sizes?: 'small' | 'large';
  /** Absolute tolerance floor added to relTol × max|reference| (default 1e-6). */
  absTol?: number;
  /** The numerics of the backends compared (runConformance sets it): 'bf16' leaves out exact-only cases. */
  numerics?: Numerics;
  /**
   * The activation dtypes besides f32 both backends take (capabilities.activationDtypes;
   * runConformance sets it): the cases of bf16 rmsnorm and silu_mul outs and bf16 matmul inputs
   * run only where it has 'bf16'.
   */
  activationDtypes?: readonly DType[];
  /**
   * The buffer dtypes both backends take (capabilities.dtypes; runConformance sets it): the cases
   * over quantized weights run only for the block types both list.
   */
  dtypes?: readonly DType[];
  /**
   * The optional op fields both backends take (capabilities.opFields; runConformance sets it):
   * a case that uses one runs only where its op lists it.
   */
  opFields?: OpFieldSupport;
}

export interface ConformanceCase {
  op: OpName;
  name: string;
  run(backend: DeviceBackend, reference: DeviceBackend): ConformanceCaseResult;
}

export interface ConformanceReport {
  backend: string;
  passed: number;
  failed: number;
  results: ConformanceCaseResult[];
}

// ---- inputs -------------------------------------------------------------------------------------

/** Deterministic PRNG for case inputs: a Weyl sequence through the sampler's mix32 hash. */
export class ConformanceRng {
  private state: number;
  private spare = NaN;
  constructor(seed: number) {
    this.state = mix32(seed >>> 0);
  }

  /** Uniform in [0, 1). */
  next(): number {
    this.state = (this.state + 0x9e3779b9) | 0;
    return mix32(this.state >>> 0) / 4294967296;
  }
  /** Integer in [lo, hi). */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo));
  }
  /** Standard normal (Box-Muller; the second value of each pair is kept for the next call). */
  normal(): number {
    if (!Number.isNaN(this.spare)) {
      const z = this.spare;
      this.spare = NaN;
      return z;
    }
    const r = Math.sqrt(-2 * Math.log(1 - this.next()));
    const t = 2 * Math.PI * this.next();
    this.spare = r * Math.sin(t);
    return r * Math.cos(t);
  }
  normals(n: number, scale = 1): Float32Array {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = this.normal() * scale;
    return a;
  }
  /** A random permutation of 0..n-1. */
  perm(n: number): number[] {
    const p = Array.from({ length: n }, (_, i) => i);
    for (let i = n - 1; i > 0; i--) {
      const j = this.int(0, i + 1);
      [p[i], p[j]] = [p[j], p[i]];
    }
    return p;
  }
}

/** Round every value to the nearest bfloat16 in place (so it is exact in an f32 and a bf16 buffer alike). */
export function roundToBf16(a: Float32Array): Float32Array {
  const bits = bf16Bits(a);
  const u32 = new Uint32Array(a.buffer, a.byteOffset, a.length);
  for (let i = 0; i < a.length; i++) u32[i] = bits[i] << 16;
  return a;
}

/** Raw bfloat16 bits of float32 values (round to nearest even, as f32ToBf16), in one pass. */
export function bf16Bits(a: Float32Array): Uint16Array {
  const u32 = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const out = new Uint16Array(a.length);
  for (let i = 0; i < a.length; i++) {
    const b = u32[i];
    out[i] = (b & 0x7fffffff) > 0x7f800000 ? f32ToBf16(a[i]) : ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
  }
  return out;
}

export type HostData = Float32Array | Int32Array;

/**
 * A buffer of a case. 'bf16' holds bf16-rounded values: uploaded as bf16 where the backend
 * supports it, as f32 otherwise, so both backends see identical values.
 */
export interface BufDef {
  dtype: 'f32' | 'i32' | 'bf16' | QuantDType;
  /** The values (for a quantized dtype: its elements dequantized, for the length). */
  data: HostData;
  /** A quantized dtype's raw blocks, written as they are. */
  blocks?: Uint8Array;
  /** Where to allocate it (default: the backend's compute tier). */
  tier?: Tier;
}

export type Bufs = Record<string, DeviceBuffer>;

export interface Step {
  op: OpName;
  run(backend: DeviceBackend, bufs: Bufs): void;
}

export function step<K extends OpName>(op: K, args: (b: Bufs) => OpArgs<K>): Step {
  return { op, run: (be, b) => be.run(op, args(b)) };
}

/** Decides whether an integer mismatch at `index` is excused by a near-tie in the inputs. */
export type Excuse = (index: number, got: number, ref: number, relTol: number, absTol: number) => boolean;

export interface OutputDef {
  name: string;
  kind: 'float' | 'int';
  excuse?: Excuse;
  /**
   * A bf16 output: each value is an f32 result rounded to bf16 as it is stored, so where the two
   * backends' f32 results straddle a rounding boundary they differ by one bf16 unit in the last
   * place; such an element is no mismatch (it still counts in maxAbsErr).
   */
  bf16?: boolean;
}

export interface CaseSpec {
  buffers: Record<string, BufDef>;
  steps: Step[];
  outputs: OutputDef[];
}

export interface CaseDef {
  name: string;
  large?: boolean;
  /** Defined for exact numerics only (partial attention): left out for a bf16 backend. */
  exactOnly?: boolean;
  /** Needs this activation dtype in capabilities.activationDtypes of both backends (bf16 outs or matmul inputs). */
  activationDtype?: DType;
  /** Needs this buffer dtype in capabilities.dtypes of both backends (quantized weights). */
  dtype?: DType;
  /** And this one (a second block type in the same case). */
  dtype2?: DType;
  /** The optional fields of its op the case uses (capabilities.opFields of both backends must list them). */
  fields?: readonly string[];
  build(rng: ConformanceRng): CaseSpec;
}

export const f32 = (data: Float32Array): BufDef => ({ dtype: 'f32', data });
export const i32 = (data: ArrayLike<number>): BufDef => ({ dtype: 'i32', data: Int32Array.from(data) });
export const bf16 = (data: Float32Array): BufDef => ({ dtype: 'bf16', data: roundToBf16(data) });
/** Random blocks of a quantized dtype (see {@link randomQuantBlocks}), from the case's generator. */
export function randomBlocks(rng: ConformanceRng, dtype: QuantDType, elements: number, scale: number): Uint8Array {
  return randomQuantBlocks(ggmlTypeOf(dtype), elements, scale, () => rng.next());
}

/** A quantized buffer from its raw blocks (the CPU reference holds their dequantized values). */
export const quantBuf = (dtype: QuantDType, blocks: Uint8Array): BufDef => {
  const n = (blocks.length / QUANT_BLOCKS[dtype].bytes) * QUANT_BLOCKS[dtype].elements;
  return { dtype, data: dequantize(ggmlTypeOf(dtype), blocks, n) as Float32Array, blocks };
};
export const floatOut = (name: string): OutputDef => ({ name, kind: 'float' });
export const bf16Out = (name: string): OutputDef => ({ name, kind: 'float', bf16: true });
/** One bf16 unit in the last place at the magnitude of x (2^(exponent - 7)). */
export const bf16Ulp = (x: number): number => (x === 0 || !Number.isFinite(x) ? 0 : 2 ** (Math.floor(Math.log2(Math.abs(x))) - 7));
export const intOut = (name: string, excuse?: Excuse): OutputDef => ({ name, kind: 'int', excuse });

export function invFreq(headDim: number, base: number): Float32Array {
  const a = new Float32Array(headDim / 2);
  for (let i = 0; i < a.length; i++) a[i] = base ** ((-2 * i) / headDim);
  return a;
}

/** Every op's cases; the mapped type makes an op added to the catalogue without cases a type error. */
export type CaseTable = { [K in OpName]: CaseDef[] };
