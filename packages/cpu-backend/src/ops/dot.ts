/**
 * The inner product every projection reduces to. Four independent float64 accumulators break the
 * add dependency chain (the loop is latency bound otherwise); a product of two float32 values is
 * exact in float64, so the only rounding is in the sums.
 */
export function dot(a: Float32Array, ao: number, b: Float32Array, bo: number, n: number): number {
  let s0 = 0;
  let s1 = 0;
  let s2 = 0;
  let s3 = 0;
  const n4 = n - (n & 3);
  let i = 0;
  for (; i < n4; i += 4) {
    s0 += a[ao + i] * b[bo + i];
    s1 += a[ao + i + 1] * b[bo + i + 1];
    s2 += a[ao + i + 2] * b[bo + i + 2];
    s3 += a[ao + i + 3] * b[bo + i + 3];
  }
  for (; i < n; i++) s0 += a[ao + i] * b[bo + i];
  return s0 + s1 + (s2 + s3);
}

/** Same as `dot` with a float64 left operand (an intermediate kept at full precision). */
export function dot64(a: Float64Array, b: Float32Array, bo: number, n: number): number {
  let s0 = 0;
  let s1 = 0;
  let s2 = 0;
  let s3 = 0;
  const n4 = n - (n & 3);
  let i = 0;
  for (; i < n4; i += 4) {
    s0 += a[i] * b[bo + i];
    s1 += a[i + 1] * b[bo + i + 1];
    s2 += a[i + 2] * b[bo + i + 2];
    s3 += a[i + 3] * b[bo + i + 3];
  }
  for (; i < n; i++) s0 += a[i] * b[bo + i];
  return s0 + s1 + (s2 + s3);
}

/** silu(g) = g * sigmoid(g), in float64. */
export function silu(g: number): number {
  return g / (1 + Math.exp(-g));
}
