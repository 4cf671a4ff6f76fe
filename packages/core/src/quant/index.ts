/**
 * Block formats of ggml's quantized types: dequantization (every type GGUF readers meet) and
 * quantization with llama.cpp's reference rounding (the types `nerva convert` writes). Both work
 * on the raw block bytes a GGUF file stores, which is also the layout the backends consume.
 *
 * Dequantization gives the values ggml's CPU `dequantize_row_*` gives, bit for bit; quantization
 * writes the bytes llama.cpp's `quantize_row_*_ref` writes (what `llama-quantize` does without an
 * importance matrix). Both follow ggml's float32 arithmetic without fused multiply-adds, as its
 * portable x86-64 build computes.
 */
import { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16, isQuantDType, type DType, type QuantDType } from '../dtype.js';
import { GGML_TYPES, ggmlByteLength, type GgmlTypeName } from './ggml-types.js';
import { decodeIQ4_NL, decodeIQ4_XS, encodeIQ4_NL, encodeIQ4_XS } from './iq4.js';
import { decodeQ2_K, decodeQ3_K, decodeQ4_K, decodeQ5_K, decodeQ6_K } from './k-dequant.js';
import { encodeQ2_K, encodeQ3_K, encodeQ4_K, encodeQ5_K, encodeQ6_K } from './k-quantize.js';
import {
  decodeQ4_0,
  decodeQ4_1,
  decodeQ5_0,
  decodeQ5_1,
  decodeQ8_0,
  encodeQ4_0,
  encodeQ4_1,
  encodeQ5_0,
  encodeQ5_1,
  encodeQ8_0,
} from './legacy.js';

type Decoder = (src: Uint8Array, blocks: number, dst: Float32Array<ArrayBufferLike>) => void;
type Encoder = (src: Float32Array, blocks: number, out: Uint8Array) => void;

const DECODERS: Partial<Record<GgmlTypeName, Decoder>> = {
  Q4_0: decodeQ4_0,
  Q4_1: decodeQ4_1,
  Q5_0: decodeQ5_0,
  Q5_1: decodeQ5_1,
  Q8_0: decodeQ8_0,
  Q2_K: decodeQ2_K,
  Q3_K: decodeQ3_K,
  Q4_K: decodeQ4_K,
  Q5_K: decodeQ5_K,
  Q6_K: decodeQ6_K,
  IQ4_NL: decodeIQ4_NL,
  IQ4_XS: decodeIQ4_XS,
};

const ENCODERS: Partial<Record<GgmlTypeName, Encoder>> = {
  Q4_0: encodeQ4_0,
  Q4_1: encodeQ4_1,
  Q5_0: encodeQ5_0,
  Q5_1: encodeQ5_1,
  Q8_0: encodeQ8_0,
  Q2_K: encodeQ2_K,
  Q3_K: encodeQ3_K,
  Q4_K: encodeQ4_K,
  Q5_K: encodeQ5_K,
  Q6_K: encodeQ6_K,
  IQ4_NL: encodeIQ4_NL,
  IQ4_XS: encodeIQ4_XS,
};

const FLOAT_TYPES = ['F32', 'F16', 'BF16'] as const satisfies readonly GgmlTypeName[];

/** Tensor types `dequantize` decodes (what a GGUF reader may accept). */
export const QUANT_TYPES_READABLE: readonly GgmlTypeName[] = Object.freeze([
  ...FLOAT_TYPES,
  ...(Object.keys(DECODERS) as GgmlTypeName[]),
]);

/** Tensor types `quantize` encodes (what a converter may write). */
export const QUANT_TYPES_WRITABLE: readonly GgmlTypeName[] = Object.freeze([
  ...FLOAT_TYPES,
  ...(Object.keys(ENCODERS) as GgmlTypeName[]),
]);

/** The ggml type a quantized buffer dtype holds. */
export function ggmlTypeOf(d: QuantDType): GgmlTypeName {
  return d.toUpperCase() as GgmlTypeName;
}

/** The buffer dtype of a ggml type: f32/f16/bf16, or the quantized dtype; undefined for others (e.g. Q8_K). */
export function dtypeOfGgml(t: GgmlTypeName): DType | undefined {
  if (t === 'F32') return 'f32';
  if (t === 'F16') return 'f16';
  if (t === 'BF16') return 'bf16';
  const q = t.toLowerCase();
  return isQuantDType(q) ? q : undefined;
}

/**
 * Decode `elements` values of `type` from `src` (whole blocks; extra bytes after them are ignored)
 * into f32. Throws RangeError when `elements` is not a whole number of blocks, when `src` or `dst`
 * is too short, or when the type has no decoder.
 */
export function dequantize(type: GgmlTypeName, src: Uint8Array, elements: number, dst: Float32Array<ArrayBufferLike> = new Float32Array(elements)): Float32Array<ArrayBufferLike> {
  const bytes = ggmlByteLength(type, elements);
  if (src.byteLength < bytes) throw new RangeError(`${type}: ${elements} elements need ${bytes} bytes, got ${src.byteLength}`);
  if (dst.length < elements) throw new RangeError(`${type}: destination holds ${dst.length} values, ${elements} needed`);
  const decode = DECODERS[type];
  if (decode) {
    decode(src, elements / GGML_TYPES[type].blockSize, dst);
    return dst;
  }
  const view = new DataView(src.buffer, src.byteOffset, bytes);
  switch (type) {
    case 'F32':
      for (let i = 0; i < elements; i++) dst[i] = view.getFloat32(i * 4, true);
      return dst;
    case 'F16':
      for (let i = 0; i < elements; i++) dst[i] = f16ToF32(view.getUint16(i * 2, true));
      return dst;
    case 'BF16':
      for (let i = 0; i < elements; i++) dst[i] = bf16ToF32(view.getUint16(i * 2, true));
      return dst;
    default:
      throw new RangeError(`dequantization of ${type} is not supported`);
  }
}

/**
 * Encode f32 values as `type` (length a whole number of blocks). Block types reject NaN and
 * infinities with a RangeError naming the first such index: ggml would write meaningless scales.
 */
export function quantize(type: GgmlTypeName, src: Float32Array): Uint8Array {
  const out = new Uint8Array(ggmlByteLength(type, src.length));
  const encode = ENCODERS[type];
  if (encode) {
    for (let i = 0; i < src.length; i++) {
      if (!Number.isFinite(src[i])) throw new RangeError(`quantize ${type}: value ${src[i]} at index ${i} is not finite`);
    }
    encode(src, src.length / GGML_TYPES[type].blockSize, out);
    return out;
  }
  const view = new DataView(out.buffer);
  switch (type) {
    case 'F32':
      for (let i = 0; i < src.length; i++) view.setFloat32(i * 4, src[i], true);
      return out;
    case 'F16':
      for (let i = 0; i < src.length; i++) view.setUint16(i * 2, f32ToF16(src[i]), true);
      return out;
    case 'BF16':
      for (let i = 0; i < src.length; i++) view.setUint16(i * 2, f32ToBf16(src[i]), true);
      return out;
    default:
      throw new RangeError(`quantization to ${type} is not supported`);
  }
}

/**
 * Random blocks of a block type for `elements` values of magnitude about `scale`: random quant
 * bytes with the scale fields set to finite f16 values of the right size (a random f16 could be
 * NaN). For benchmarks and conformance cases, where values need not come from a quantizer.
 * `next` draws uniformly from [0, 1).
 */
export function randomQuantBlocks(type: GgmlTypeName, elements: number, scale: number, next: () => number): Uint8Array {
  const { blockSize, typeSize } = GGML_TYPES[type];
  const out = new Uint8Array(ggmlByteLength(type, elements));
  for (let i = 0; i < out.length; i += 4) {
    const v = (next() * 4294967296) >>> 0;
    out[i] = v & 0xff;
    if (i + 1 < out.length) out[i + 1] = (v >>> 8) & 0xff;
    if (i + 2 < out.length) out[i + 2] = (v >>> 16) & 0xff;
    if (i + 3 < out.length) out[i + 3] = v >>> 24;
  }
  const half = (at: number, v: number) => {
    const h = f32ToF16(v * (0.5 + next()));
    out[at] = h & 0xff;
    out[at + 1] = h >>> 8;
  };
  // Where each type keeps its f16 scales, and what they are for |value| ~ scale.
  const fields: Partial<Record<GgmlTypeName, readonly (readonly [number, number])[]>> = {
    Q8_0: [[0, 1 / 64]],
    Q4_0: [[0, 1 / 4]],
    Q4_1: [[0, 1 / 8], [2, 1]],
    Q5_0: [[0, 1 / 8]],
    Q5_1: [[0, 1 / 16], [2, 1]],
    Q2_K: [[80, 1 / 23], [82, 1 / 15]],
    Q3_K: [[108, 1 / 64]],
    Q4_K: [[0, 1 / 470], [2, 1 / 63]],
    Q5_K: [[0, 1 / 940], [2, 1 / 63]],
    Q6_K: [[208, 1 / 4096]],
    IQ4_NL: [[0, 1 / 64]],
    IQ4_XS: [[0, 1 / 1024]],
  };
  const f = fields[type];
  if (!f || blockSize === 1) throw new RangeError(`randomQuantBlocks: ${type} is not a generated block type`);
  for (let b = 0; b < out.length; b += typeSize) for (const [at, k] of f) half(b + at, scale * k);
  return out;
}
