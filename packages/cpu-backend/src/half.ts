/**
 * Rounding of values stored into half-precision buffers. bf16/f16 buffers are held decoded in
 * Float32Array, so every store must round to the buffer's type to keep the values exactly
 * representable (what a device holding raw 16-bit patterns would have).
 */
import { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16, type DType } from '@nerva/core';


export function roundBf16(x: number): number {
  return bf16ToF32(f32ToBf16(x));
}

export function roundF16(x: number): number {
  return f16ToF32(f32ToF16(x));
}

/** The rounding a store into a buffer of `dtype` applies (undefined: none beyond float32). */
export function storeRounding(dtype: DType): ((x: number) => number) | undefined {
  if (dtype === 'bf16') return roundBf16;
  if (dtype === 'f16') return roundF16;
  return undefined;
}

/** Round `dst[start, start+len)` in place to `dtype` (no-op for f32/i32). */
export function roundRange(dtype: DType, dst: Float32Array, start: number, len: number): void {
  const r = storeRounding(dtype);
  if (r === undefined) return;
  for (let i = start; i < start + len; i++) dst[i] = r(dst[i]);
}

/** Decode raw 16-bit patterns into `dst` at `offset` (bf16 by a shift, f16 through core's decoder). */
export function decodeHalfInto(dtype: 'bf16' | 'f16', src: Uint16Array, dst: Float32Array, offset: number): void {
  if (dtype === 'bf16') {
    const d32 = new Uint32Array(dst.buffer, dst.byteOffset + offset * 4, src.length);
    for (let i = 0; i < src.length; i++) d32[i] = src[i] << 16;
  } else {
    for (let i = 0; i < src.length; i++) dst[offset + i] = f16ToF32(src[i]);
  }
}

/**
 * Store float32 values rounded to the half type. bf16 rounds on the bit pattern (nearest even,
 * the same rule as core's f32ToBf16, which handles the NaN case here) in one pass.
 */
export function roundHalfInto(dtype: 'bf16' | 'f16', src: Float32Array, dst: Float32Array, offset: number): void {
  if (dtype === 'bf16') {
    const s32 = new Uint32Array(src.buffer, src.byteOffset, src.length);
    const d32 = new Uint32Array(dst.buffer, dst.byteOffset + offset * 4, src.length);
    for (let i = 0; i < src.length; i++) {
      const b = s32[i];
      d32[i] = (b & 0x7fffffff) > 0x7f800000 ? f32ToBf16(src[i]) << 16 : ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) << 16;
    }
  } else {
    for (let i = 0; i < src.length; i++) dst[offset + i] = f16ToF32(f32ToF16(src[i]));
  }
}
