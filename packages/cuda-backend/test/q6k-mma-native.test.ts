import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hasGxx, runNativeJson } from './native-build.js';

// k_q6k_mma (native/ops/q6k_mma.cu: the Q6_K decode GEMV on the integer tensor cores) emulated on
// the CPU by test/native/q6k_mma_test.cc: the activations' digits, the ring's granule copy and the
// lanes' funnel-shifted reads of 2-byte-aligned blocks, the mma fragments with B's columns as four
// terms x two 16-element halves, the int8 scale sums, the -32 offset and the reductions, against a
// double reference. An int mma is exact, so this is the kernel's arithmetic. Skipped without g++.

interface Result {
  rows: number;
  splitChecked: number;
  splitBad: number;
  digitRangeBad: number;
  overflow: number;
  bytesBad: number;
  halfBad: number;
  maxErrScaled: number;
  maxErrScaledF32Sequential: number;
}

describe.skipIf(!hasGxx)('k_q6k_mma emulation (test/native/q6k_mma_test.cc, g++, no CUDA)', () => {
  let dispose = () => {};
  let res: Result;
  beforeAll(async () => {
    ({ result: res, dispose } = await runNativeJson<Result>('q6k_mma_test', ['test/native/q6k_mma_test.cc']));
  }, 180_000);
  afterAll(() => dispose());

  it('splits every activation into signed byte digits that rebuild it', () => {
    expect(res.splitChecked).toBe(8 * (256 + 768 + 1024 + 4096 + 12288));
    expect(res.splitBad).toBe(0);
    expect(res.digitRangeBad).toBe(0);
  });

  it("reads each block's bytes at every 2-byte offset and keeps B's halves apart", () => {
    expect(res.bytesBad).toBe(0);
    expect(res.halfBad).toBe(0);
  });

  it('never overflows int32', () => {
    expect(res.overflow).toBe(0);
  });

  it('is accurate to float32 grade, with and without the fused norm', () => {
    expect(res.rows).toBe(5 * 8 * 48);
    // Relative to sum_i |d sc_i| (|q_i| + 32) |x_i| (q x and the -32 offset are summed apart); a
    // wrong digit, scale, half or fragment lands orders above 1e-5 (checked by mutating the test).
    expect(res.maxErrScaledF32Sequential).toBeGreaterThan(0);
    expect(res.maxErrScaled).toBeLessThan(1e-5);
  });
});
