import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildNative, hasGxx } from './native-build.js';

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
  beforeAll(() => {
    const built = buildNative('q4k_mma_test', ['test/native/q4k_mma_test.cc']);
    dispose = built.dispose;
    const r = spawnSync(built.exe, [], { encoding: 'utf8', timeout: 120_000 });
    const line = r.stdout.split('\n').find((l) => l.startsWith('{'));
    if (!line) throw new Error(`no result (status ${r.status}, signal ${r.signal}): ${r.stderr}`);
    res = JSON.parse(line) as Result;
  }, 180_000);
  afterAll(() => dispose());

  it('splits every activation into digits that rebuild it, each a signed byte, within half a unit', () => {
    // 4 activation rows at each of inDim 256, 768, 1024, 4096 and 12288.
    expect(res.splitChecked).toBe(4 * (256 + 768 + 1024 + 4096 + 12288));
    expect(res.splitBad).toBe(0);
    expect(res.digitRangeBad).toBe(0);
  });

  it('never overflows int32 in the mma sums or the scale-weighted sums', () => {
    expect(res.overflow).toBe(0);
  });

  it('is as accurate as a float32 dot product of the dequantized weights', () => {
    expect(res.rows).toBe(5 * 4 * 48);
    // Both errors are relative to sum |w x|. A sequential float32 dot product reaches ~6e-6 on
    // these rows (12288 terms, an outlier of 3000 and one of 3e6); the kernel sums in another
    // order and splits x to 2^-31 of each super-block's largest value, so it is held to the same
    // order of magnitude, not to the sequential sum's bits.
    expect(res.maxErrScaledF32Sequential).toBeGreaterThan(0);
    expect(res.maxErrScaled).toBeLessThan(2e-5);
    expect(res.maxErrScaled).toBeLessThan(10 * res.maxErrScaledF32Sequential);
  });
});
