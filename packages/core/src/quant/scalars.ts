/**
 * Scalar helpers shared by the block codecs: ggml's half-precision scale fields, its
 * `nearest_int` rounding trick and C's `roundf`, all with float32 semantics so the codecs produce
 * the bytes and values ggml's C code does.
 */
import { f16ToF32, f32ToF16 } from '../dtype.js';

/** Rounds a double to float32, as every C `float` operation does once per operation. */
export const fr = Math.fround;

let halfTable: Float32Array | undefined;

/** All 65536 half-precision patterns as f32, built once: scale fields are read once per block. */
function table(): Float32Array {
  if (!halfTable) {
    halfTable = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) halfTable[h] = f16ToF32(h);
  }
  return halfTable;
}

/** The little-endian f16 at `src[o]`, widened to f32 exactly. */
export function halfAt(src: Uint8Array, o: number): number {
  return table()[src[o] | (src[o + 1] << 8)];
}

/**
 * Stores `x` (already a float32 value) as f16 at `out[o]`, rounded to nearest even as ggml's
 * FP32_TO_FP16 does, and returns the stored value widened back to f32 (the K-quants requantize
 * against the rounded scale).
 */
export function putHalf(out: Uint8Array, o: number, x: number): number {
  const h = f32ToF16(x);
  out[o] = h & 0xff;
  out[o + 1] = h >>> 8;
  return table()[h];
}

const f32 = new Float32Array(1);
const i32 = new Int32Array(f32.buffer);

/**
 * ggml's `nearest_int`: adds 1.5·2^23 in float32 and reads the integer out of the mantissa bits,
 * which rounds half to even. Out of its intended range (|v| > 2^22) the C code returns whatever
 * the bits say, and so does this, so even degenerate scales give the same bytes.
 */
export function nearestInt(v: number): number {
  const t = fr(v + 12582912);
  if (t >= 8388608 && t < 16777216) return (t - 12582912) | 0;
  f32[0] = t;
  return (i32[0] & 0x7fffff) - 0x400000;
}

/** C's `roundf`: halves round away from zero (Math.round rounds them up). */
export function roundAway(v: number): number {
  return v < 0 ? -Math.floor(0.5 - v) : Math.floor(v + 0.5);
}

/**
 * The value of largest magnitude in x[o..o+n) (the first of equal magnitudes), as ggml picks a
 * block's or a group's extreme value: its sign sets the sign of the scale.
 */
export function signedAbsMax(x: Float32Array, o: number, n: number): number {
  let amax = 0;
  let max = 0;
  for (let j = o; j < o + n; j++) {
    const a = Math.abs(x[j]);
    if (amax < a) {
      amax = a;
      max = x[j];
    }
  }
  return max;
}
