import { describe, expect, it } from 'vitest';
import { createCudaBackend, CudaArgumentError, resolveBatchInvariant } from '../src/index.js';

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
