import { describe, expect, it } from 'vitest';
import { checkSyncMode, createCudaBackend, CudaArgumentError, resolveBatchInvariant } from '../src/index.js';

// CudaBackendOptions.batchInvariant and NERVA_BATCH_INVARIANT: parsed and checked without a GPU.
describe('batchInvariant option', () => {
  it('defaults to off, and the environment turns it on or off', () => {
    expect(resolveBatchInvariant(undefined, {})).toBe(false);
    expect(resolveBatchInvariant(undefined, { NERVA_BATCH_INVARIANT: '' })).toBe(false);
    expect(resolveBatchInvariant(undefined, { NERVA_BATCH_INVARIANT: '0' })).toBe(false);
    expect(resolveBatchInvariant(undefined, { NERVA_BATCH_INVARIANT: 'false' })).toBe(false);
    expect(resolveBatchInvariant(undefined, { NERVA_BATCH_INVARIANT: '1' })).toBe(true);
    expect(resolveBatchInvariant(undefined, { NERVA_BATCH_INVARIANT: 'true' })).toBe(true);
  });

  it('an explicit option wins over the environment', () => {
    expect(resolveBatchInvariant(false, { NERVA_BATCH_INVARIANT: '1' })).toBe(false);
    expect(resolveBatchInvariant(true, { NERVA_BATCH_INVARIANT: '0' })).toBe(true);
  });

  it('rejects anything else with an error naming where it came from', () => {
    expect(() => resolveBatchInvariant(undefined, { NERVA_BATCH_INVARIANT: 'yes' })).toThrow(CudaArgumentError);
    expect(() => resolveBatchInvariant(undefined, { NERVA_BATCH_INVARIANT: 'yes' })).toThrow(/NERVA_BATCH_INVARIANT.*"yes"/);
    expect(() => resolveBatchInvariant('on', {})).toThrow(/batchInvariant.*boolean.*"on"/);
    expect(() => resolveBatchInvariant(1, {})).toThrow(CudaArgumentError);
  });

  it('createCudaBackend checks it before looking for a GPU', () => {
    expect(() => createCudaBackend({ batchInvariant: 'on' as unknown as boolean, addonPath: '/nonexistent/nerva_cuda.node' })).toThrow(CudaArgumentError);
    const saved = process.env.NERVA_BATCH_INVARIANT;
    process.env.NERVA_BATCH_INVARIANT = 'maybe';
    try {
      expect(() => createCudaBackend({ addonPath: '/nonexistent/nerva_cuda.node' })).toThrow(/NERVA_BATCH_INVARIANT/);
    } finally {
      if (saved === undefined) delete process.env.NERVA_BATCH_INVARIANT;
      else process.env.NERVA_BATCH_INVARIANT = saved;
    }
  });
});

// NERVA_CUDA_SYNC (how synchronize waits; read by the addon): checked without a GPU.
describe('NERVA_CUDA_SYNC', () => {
  it('accepts spin, block, auto and unset', () => {
    expect(checkSyncMode({})).toBe('auto');
    expect(checkSyncMode({ NERVA_CUDA_SYNC: '' })).toBe('auto');
    expect(checkSyncMode({ NERVA_CUDA_SYNC: 'auto' })).toBe('auto');
    expect(checkSyncMode({ NERVA_CUDA_SYNC: 'spin' })).toBe('spin');
    expect(checkSyncMode({ NERVA_CUDA_SYNC: 'block' })).toBe('block');
  });

  it('rejects anything else, in createCudaBackend before the addon loads', () => {
    expect(() => checkSyncMode({ NERVA_CUDA_SYNC: 'sleep' })).toThrow(/NERVA_CUDA_SYNC.*"sleep"/);
    const saved = process.env.NERVA_CUDA_SYNC;
    process.env.NERVA_CUDA_SYNC = 'Block';
    try {
      expect(() => createCudaBackend({ addonPath: '/nonexistent/nerva_cuda.node' })).toThrow(/NERVA_CUDA_SYNC.*"Block"/);
    } finally {
      if (saved === undefined) delete process.env.NERVA_CUDA_SYNC;
      else process.env.NERVA_CUDA_SYNC = saved;
    }
  });
});
