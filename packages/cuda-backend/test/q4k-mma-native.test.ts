import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hasGxx, runNativeJson } from './native-build.js';

// k_q4k_mma (native/ops/q4k_mma.cu: the Q4_K decode GEMV on the integer tensor cores) emulated on
// the CPU by test/native/q4k_mma_test.cc: the activations' split into a power-of-two scale and four
// signed byte digits, the mma fragments, the integer scale sums, the per-super-block float
// combination and the reductions, against a double reference. An int mma is exact, so this is
// the kernel's arithmetic, not a model of it. Skipped where there is no g++.

interface Result {
  rows: number;
  splitChecked: number;
  splitBad: number;
  digitRangeBad: number;
  overflow: number;
  maxErrScaled: number;
  maxErrScaledF32Sequential: number;
}

describe.skipIf(!hasGxx)('k_q4k_mma emulation (test/native/q4k_mma_test.cc, g++, no CUDA)', () => {
  let dispose = () => {};
  let res: Result;
  beforeAll(async () => {
    ({ result: res, dispose } = await runNativeJson<Result>('q4k_mma_test', ['test/native/q4k_mma_test.cc']));
  }, 180_000);
  afterAll(() => dispose());

  it('splits every activation into digits that rebuild it, each a signed byte, within half a unit', () => {
    // 8 activation rows (4 of them through the fused norm) at each of inDim 256 .. 12288.
    expect(res.splitChecked).toBe(8 * (256 + 768 + 1024 + 4096 + 12288));
    expect(res.splitBad).toBe(0);
    expect(res.digitRangeBad).toBe(0);
  });

  it('never overflows int32 in the mma sums or the scale-weighted sums', () => {
    expect(res.overflow).toBe(0);
  });

  it('is accurate to float32 grade, with and without the fused norm', () => {
    expect(res.rows).toBe(5 * 8 * 48);
    // The error is taken relative to sum_i (|d sc q| + |dmin m|)_i |x_i|: the kernel sums a
    // weight's two parts apart (as the float GEMV did), so where they nearly cancel float32 loses
    // what it loses in either form. 1e-5 is float32 grade for rows of up to 12288 terms (a
    // sequential float32 dot product of the dequantized weights reaches ~7e-6 of sum |w x| on
    // these rows, printed beside it); a wrong digit, scale or fragment lands orders above it.
    expect(res.maxErrScaledF32Sequential).toBeGreaterThan(0);
    expect(res.maxErrScaled).toBeLessThan(1e-5);
  });
});
