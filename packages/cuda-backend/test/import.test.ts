import { describe, expect, it } from 'vitest';
import { NervaError } from '@nerva/core';
import { createCudaBackend, CudaArgumentError, CudaUnavailableError, GEMM_FOR_MATMUL_PRECISION, probeCuda } from '../src/index.js';

// CI has no GPU (and usually no built addon): the package must import, report why it is
// unavailable, and refuse to create a backend with one typed error.
const missing = '/nonexistent/nerva_cuda.node';

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

describe('@nerva/cuda-backend without a GPU', () => {
  it('imports without loading the addon', async () => {
    const mod = await import('../src/index.js');
    expect(typeof mod.createCudaBackend).toBe('function');
    expect(typeof mod.probeCuda).toBe('function');
  });

  it('probeCuda reports unavailable with a reason and never throws', () => {
    const p = probeCuda({ addonPath: missing });
    // With NERVA_CUDA_ADDON unset and no build, every candidate fails; on a dev box the local
    // build may load but finds no driver. Either way: unavailable, with a reason.
    expect(p.available).toBe(false);
    expect(typeof p.reason).toBe('string');
    expect(p.reason!.length).toBeGreaterThan(10);
  });

  it('probeCuda names the addon paths it tried when none loads', () => {
    const saved = process.env.NERVA_CUDA_ADDON;
    process.env.NERVA_CUDA_ADDON = '/also/missing/nerva_cuda.node';
    try {
      const p = probeCuda({ addonPath: missing });
      if (!p.available && p.reason?.startsWith('CUDA addon not loadable')) {
        expect(p.reason).toContain(missing);
        expect(p.reason).toContain('/also/missing/nerva_cuda.node');
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

  it('createCudaBackend throws CudaUnavailableError', () => {
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
    // A valid value gets past the option check to the missing addon.
    expect(() => createCudaBackend({ addonPath: missing, numerics: 'bf16' })).toThrow(CudaUnavailableError);
  });

  it('rejects an unknown gemm precision or NERVA_MATMUL by name before looking for a GPU; maps matmul precisions to gemm paths', () => {
    expect(() => createCudaBackend({ addonPath: missing, gemm: 'tf32' as never })).toThrow(/gemm: unknown gemm precision tf32/);
    expect(() => createCudaBackend({ addonPath: missing, gemm: 'toString' as never })).toThrow(CudaArgumentError);
    withEnv('NERVA_MATMUL', 'fp8', () => {
      expect(() => createCudaBackend({ addonPath: missing })).toThrow(/NERVA_MATMUL: unknown matmul precision fp8 \(expected exact or bf16\)/);
      // An explicit gemm option wins over the environment.
      expect(() => createCudaBackend({ addonPath: missing, gemm: 'bf16' })).toThrow(CudaUnavailableError);
    });
    withEnv('NERVA_MATMUL', 'bf16', () => {
      expect(() => createCudaBackend({ addonPath: missing })).toThrow(CudaUnavailableError);
    });
    expect(GEMM_FOR_MATMUL_PRECISION).toEqual({ exact: 'split-bf16', bf16: 'bf16' });
  });
});
