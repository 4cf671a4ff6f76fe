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
