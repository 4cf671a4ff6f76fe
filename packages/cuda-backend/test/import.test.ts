import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { NervaError } from '@nerva/core';
import { createCudaBackend, CudaArgumentError, CudaDisposedError, CudaUnavailableError, GEMM_FOR_MATMUL_PRECISION, probeCuda, type CudaBackendOptions } from '../src/index.js';
import { addon, gpuTestsRequired, gpuUnavailableReason, hasGpu } from './gpu-world.js';

// CI has no GPU (and usually no built addon): the package must import, report why it is
// unavailable, and refuse to create a backend with one typed error. On the GPU machine (the addon
// built, a GPU) the same calls load it and create a backend. A path that does not exist falls
// through to NERVA_CUDA_ADDON and the package's own build, so which world this is decides what
// each call must do (test/gpu-world.ts).
const missing = '/nonexistent/nerva_cuda.node';
const packageBuild = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'build', 'Release', 'nerva_cuda.node');

/**
 * createCudaBackend(opts) once the options are accepted: CudaUnavailableError without a GPU, a
 * working backend (then disposed) with one.
 */
function expectPastOptionCheck(opts: CudaBackendOptions): void {
  if (!hasGpu) {
    expect(() => createCudaBackend(opts)).toThrow(CudaUnavailableError);
    return;
  }
  const b = createCudaBackend({ deviceArenaBytes: 2 ** 24, pinnedArenaBytes: 2 ** 20, ...opts });
  try {
    expect(b.name).toMatch(/cuda/i);
  } finally {
    b.dispose();
  }
}

/** Runs fn with environment variable `name` set to `value`, then restores it. */
function withEnv(name: string, value: string, fn: () => void): void {
  const saved = process.env[name];
  process.env[name] = value;
  try {
    fn();
  } finally {
    if (saved === undefined) delete process.env[name];
    else process.env[name] = saved;
  }
}

describe('@nerva/cuda-backend with and without a GPU', () => {
  it('imports without loading the addon', async () => {
    const mod = await import('../src/index.js');
    expect(typeof mod.createCudaBackend).toBe('function');
    expect(typeof mod.probeCuda).toBe('function');
  });

  it.runIf(gpuTestsRequired)('finds the addon and a GPU (the GPU test phase)', () => {
    expect(gpuUnavailableReason(), 'NERVA_GPU_TESTS=1 but the CUDA addon or a GPU is missing').toBeNull();
  });

  it('probeCuda reports what is there and never throws', () => {
    const p = probeCuda({ addonPath: missing });
    if (hasGpu) {
      // NERVA_CUDA_ADDON or the package's build loaded and sees the GPU.
      expect(p).toMatchObject({ available: true, device: expect.stringMatching(/\(sm_\d+\)$/) });
      expect(p.deviceCount).toBeGreaterThan(0);
      return;
    }
    // With no build every candidate fails; on a dev box the local build may load but finds no
    // driver. Either way: unavailable, with a reason.
    expect(p.available).toBe(false);
    expect(typeof p.reason).toBe('string');
    expect(p.reason!.length).toBeGreaterThan(10);
    if (!addon) expect(p.reason).toMatch(/^CUDA addon not loadable: /);
  });

  it('probeCuda names the addon paths it tried when none loads', () => {
    const saved = process.env.NERVA_CUDA_ADDON;
    process.env.NERVA_CUDA_ADDON = '/also/missing/nerva_cuda.node';
    try {
      const p = probeCuda({ addonPath: missing });
      if (!existsSync(packageBuild)) {
        expect(p.available).toBe(false);
        expect(p.reason).toMatch(/^CUDA addon not loadable: /);
        expect(p.reason).toContain(missing);
        expect(p.reason).toContain('/also/missing/nerva_cuda.node');
        expect(p.reason).toContain(packageBuild);
      } else if (hasGpu) {
        // The package's own build loaded and sees the GPU.
        expect(p.available).toBe(true);
      } else {
        // The package's own build loaded: then the reason is the CUDA runtime's.
        expect(p.available).toBe(false);
        expect(p.reason).toMatch(/cuda|device|driver/i);
      }
    } finally {
      if (saved === undefined) delete process.env.NERVA_CUDA_ADDON;
      else process.env.NERVA_CUDA_ADDON = saved;
    }
  });

  it('createCudaBackend throws CudaUnavailableError without a GPU, and creates a backend with one', () => {
    if (hasGpu) {
      expectPastOptionCheck({ addonPath: missing });
      return;
    }
    let err: unknown;
    try {
      createCudaBackend({ addonPath: missing });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(CudaUnavailableError);
    expect(err).toBeInstanceOf(NervaError);
    expect((err as CudaUnavailableError).code).toBe('CUDA_UNAVAILABLE');
    expect((err as Error).message).toMatch(/CUDA backend unavailable: .*pnpm build:cuda/);
  });

  it('rejects an unknown numerics by name before looking for a GPU', () => {
    expect(() => createCudaBackend({ addonPath: missing, numerics: 'fp8' as never })).toThrow(CudaArgumentError);
    expect(() => createCudaBackend({ addonPath: missing, numerics: 'fp8' as never })).toThrow(/unknown numerics fp8/);
    // A valid value gets past the option check (to the missing addon, or to a backend).
    expectPastOptionCheck({ addonPath: missing, numerics: 'bf16' });
  });

  it('rejects an unknown gemm precision or NERVA_MATMUL by name before looking for a GPU; maps matmul precisions to gemm paths', () => {
    expect(() => createCudaBackend({ addonPath: missing, gemm: 'tf32' as never })).toThrow(/gemm: unknown gemm precision tf32/);
    expect(() => createCudaBackend({ addonPath: missing, gemm: 'toString' as never })).toThrow(CudaArgumentError);
    withEnv('NERVA_MATMUL', 'fp8', () => {
      expect(() => createCudaBackend({ addonPath: missing })).toThrow(/NERVA_MATMUL: unknown matmul precision fp8 \(expected exact or bf16\)/);
      // An explicit gemm option wins over the environment.
      expectPastOptionCheck({ addonPath: missing, gemm: 'bf16' });
    });
    withEnv('NERVA_MATMUL', 'bf16', () => {
      expectPastOptionCheck({ addonPath: missing });
    });
    expect(GEMM_FOR_MATMUL_PRECISION).toEqual({ exact: 'split-bf16', bf16: 'bf16' });
  });

  // Pins are made at a shape's first batch-invariant matmul (the invariance probe, tools/gpu,
  // prints them after its matmuls); a fresh context has none, a default one never any.
  it.runIf(hasGpu)('pinnedGemms: none before a matmul, and a disposed backend refuses the call', () => {
    for (const batchInvariant of [true, false]) {
      const b = createCudaBackend({ deviceArenaBytes: 2 ** 24, pinnedArenaBytes: 2 ** 20, batchInvariant });
      expect(b.pinnedGemms()).toBe('');
      b.dispose();
      expect(() => b.pinnedGemms()).toThrow(CudaDisposedError);
    }
  });
});
