/**
 * ggml's block-quantized weight types. A buffer of one holds the raw GGUF blocks of a row-major
 * matrix, each row a whole number of blocks; its length counts elements, not blocks.
 */
export type QuantDType = 'q8_0' | 'q4_0' | 'q4_1' | 'q5_0' | 'q5_1' | 'q4_k' | 'q5_k' | 'q6_k';

/** Element types a buffer may hold. bf16/f16 are stored as raw 16-bit patterns. */
export type DType = 'f32' | 'bf16' | 'f16' | 'i32' | QuantDType;

/** The ggml block of each quantized dtype: elements a block and bytes a block. */
export const QUANT_BLOCKS: Readonly<Record<QuantDType, { readonly elements: number; readonly bytes: number }>> = {
  q8_0: { elements: 32, bytes: 34 },
  q4_0: { elements: 32, bytes: 18 },
  q4_1: { elements: 32, bytes: 20 },
  q5_0: { elements: 32, bytes: 22 },
  q5_1: { elements: 32, bytes: 24 },
  q4_k: { elements: 256, bytes: 144 },
  q5_k: { elements: 256, bytes: 176 },
  q6_k: { elements: 256, bytes: 210 },
};

export const QUANT_DTYPES = Object.keys(QUANT_BLOCKS) as readonly QuantDType[];

export function isQuantDType(d: unknown): d is QuantDType {
  return typeof d === 'string' && Object.hasOwn(QUANT_BLOCKS, d);
}

/**
 * Bytes an element of each dtype. Quantized dtypes have fractional sizes (a block's bytes over
 * its elements, exact binary fractions), so `length * DTYPE_BYTES[d]` is exact for whole blocks.
 */
export const DTYPE_BYTES: Readonly<Record<DType, number>> = {
  f32: 4,
  bf16: 2,
  f16: 2,
  i32: 4,
  ...(Object.fromEntries(QUANT_DTYPES.map((d) => [d, QUANT_BLOCKS[d].bytes / QUANT_BLOCKS[d].elements])) as Record<QuantDType, number>),
};

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

export function bf16ToF32(bits: number): number {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0];
}

/** Round to nearest even, as torch does when casting float32 to bfloat16. */
export function f32ToBf16(x: number): number {
  f32[0] = x;
  const b = u32[0];
  if ((b & 0x7f800000) === 0x7f800000 && (b & 0x7fffff) !== 0) return ((b >>> 16) | 0x40) & 0xffff; // NaN stays NaN
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
}

export function f16ToF32(h: number): number {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >>> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

export function f32ToF16(x: number): number {
  f32[0] = x;
  const b = u32[0];
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  let mant = b & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    let half = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    if (rem > mid || (rem === mid && half & 1)) half++;
    return sign | half;
  }
  let half = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && half & 1)) half++;
  e = half >>> 10;
  return sign | half;
}

/** Decode a run of raw 16-bit values into float32. */
export function decodeHalf(dtype: 'bf16' | 'f16', src: Uint16Array, dst = new Float32Array(src.length)): Float32Array {
  if (dtype === 'bf16') {
    const out32 = new Uint32Array(dst.buffer, dst.byteOffset, dst.length);
    for (let i = 0; i < src.length; i++) out32[i] = src[i] << 16;
  } else {
    for (let i = 0; i < src.length; i++) dst[i] = f16ToF32(src[i]);
  }
  return dst;
}

export function encodeHalf(dtype: 'bf16' | 'f16', src: ArrayLike<number>, dst = new Uint16Array(src.length)): Uint16Array {
  const enc = dtype === 'bf16' ? f32ToBf16 : f32ToF16;
  for (let i = 0; i < src.length; i++) dst[i] = enc(src[i]);
  return dst;
}
