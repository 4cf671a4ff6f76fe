/** Test helpers: seeded inputs, upload/download, and the tolerance check the backend claims. */
import type { DType, DeviceBuffer } from '@nerva/core';
import { ConformanceRng } from '@nerva/core/conformance';
import { expect } from 'vitest';
import type { CpuBackend } from '../src/index.js';

export function rng(seed: number): ConformanceRng {
  return new ConformanceRng(seed);
}

export function randn(r: ConformanceRng, n: number, scale = 1): Float32Array {
  return r.normals(n, scale);
}

/** Allocate a buffer holding `data` (f32 unless told). */
export function upload(be: CpuBackend, data: Float32Array | Int32Array, dtype?: DType): DeviceBuffer {
  const dt: DType = dtype ?? (data instanceof Int32Array ? 'i32' : 'f32');
  const b = be.alloc({ dtype: dt, length: data.length });
  be.write(b, data);
  return b;
}

export function zeros(be: CpuBackend, n: number, dtype: DType = 'f32'): DeviceBuffer {
  return be.alloc({ dtype, length: n });
}

/** max |got - want| <= relTol * max |want|. */
export function expectClose(got: ArrayLike<number>, want: ArrayLike<number>, relTol: number): void {
  expect(got.length).toBe(want.length);
  let maxRef = 0;
  let maxErr = 0;
  let worst = -1;
  for (let i = 0; i < want.length; i++) {
    maxRef = Math.max(maxRef, Math.abs(want[i]));
    const e = Math.abs(got[i] - want[i]);
    if (!(e <= maxErr)) {
      maxErr = e;
      worst = i;
    }
  }
  const tol = relTol * maxRef;
  if (!(maxErr <= tol)) throw new Error(`max error ${maxErr} at ${worst} (got ${got[worst]}, want ${want[worst]}) exceeds ${tol}`);
}
