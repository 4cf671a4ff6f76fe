import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hasGxx, runNativeJson } from './native-build.js';

// k_gemm_bi (native/ops/gemm_bi.cu: batch-invariant decode's tensor-core matmul) emulated on the CPU
// by test/native/bi_gemm_test.cc: its fragment construction, three-term bf16 split (one term under
// matmul precision bf16), step and term order and split-K reduction, with the mma's internal sum modelled (round to nearest, and toward
// zero as tensor cores truncate). Accuracy against a double reference, the split's exactness, and
// each row's bits alone against its place among 9..64 rows. Skipped where there is no g++.


interface Result {
  shapes: number;
  maxErrScaledRn: number;
  maxErrScaledRz: number;
  maxErrScaledF32Sequential: number;
  splitChecked: number;
  splitBad: number;
  invChecked: number;
  invDiff: number;
  maxErrScaledOneTerm: number;
  maxErrScaledOneTermVsX: number;
  invDiffOneTerm: number;
}

describe.skipIf(!hasGxx)('k_gemm_bi emulation (test/native/bi_gemm_test.cc, g++, no CUDA)', () => {
  let dispose = () => {};
  let res: Result;
  beforeAll(async () => {
    ({ result: res, dispose } = await runNativeJson<Result>('bi_gemm_test', ['test/native/bi_gemm_test.cc']));
  }, 180_000);
  afterAll(() => dispose());

  it('splits every activation exactly into bf16 hi + mid + lo', () => {
    expect(res.splitChecked).toBeGreaterThan(10_000);
    expect(res.splitBad).toBe(0);
  });

  it('is f32-grade at inDim 1024..12288: error <= 1e-6 of sum |x_i w_i| under either mma model', () => {
    expect(res.shapes).toBe(14);
    expect(res.maxErrScaledRn).toBeLessThanOrEqual(1e-6);
    expect(res.maxErrScaledRz).toBeLessThanOrEqual(1e-6);
    // No worse than a sequential f32 dot product (the GEMV's grade).
    expect(res.maxErrScaledRz).toBeLessThanOrEqual(res.maxErrScaledF32Sequential);
  });

  it("gives each row the bits it gets alone, at any place among 9, 17, 33 or 64 rows", () => {
    expect(res.invChecked).toBeGreaterThan(1000);
    expect(res.invDiff).toBe(0);
  });

  it('one term (matmul precision bf16): the bf16-rounded activations\' product at f32 grade, invariant too', () => {
    // What it computes: sum bf16(x_i) w_i, to f32 grade.
    expect(res.maxErrScaledOneTerm).toBeLessThanOrEqual(1e-6);
    // Against x itself the activations' bf16 rounding shows: each product off by at most 2^-9.
    expect(res.maxErrScaledOneTermVsX).toBeLessThanOrEqual(2 ** -9);
    expect(res.maxErrScaledOneTermVsX).toBeGreaterThan(1e-6);
    expect(res.invDiffOneTerm).toBe(0);
  });
});
