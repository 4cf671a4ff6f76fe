import { describe, expect, it } from 'vitest';
import { checkTuningEnv, createCudaBackend, CudaArgumentError, TUNING_KNOBS } from '../src/index.js';

// The addon's NERVA_* switches fall back to their defaults on values they do not parse; the
// backend checks them before the addon loads, so these tests need no GPU.
describe('checkTuningEnv (the addon environment switches)', () => {
  it('passes unset, empty and every accepted value', () => {
    expect(() => checkTuningEnv({})).not.toThrow();
    for (const [name, k] of Object.entries(TUNING_KNOBS)) {
      expect(() => checkTuningEnv({ [name]: '' })).not.toThrow();
      const good = k.kind === 'oneOf' ? k.values : [String(k.min), String(k.max ?? k.min + 7)];
      for (const v of good) expect(() => checkTuningEnv({ [name]: v }), `${name}=${v}`).not.toThrow();
    }
    // Variables it does not know are not its business.
    expect(() => checkTuningEnv({ NERVA_SOMETHING_ELSE: 'x', PATH: '/bin' })).not.toThrow();
  });

  it('names the variable, the value and what it accepts', () => {
    const bad: Array<[string, string, RegExp]> = [
      ['NERVA_ATTN_WAVES', 'two', /NERVA_ATTN_WAVES: must be an integer in \[1, 64\].*"two"/],
      ['NERVA_ATTN_WAVES', '0', /\[1, 64\].*"0"/],
      ['NERVA_ATTN_BLOCKS_PER_SM', '8', /NERVA_ATTN_BLOCKS_PER_SM: is no longer read, got "8"; use NERVA_ATTN_WAVES/],
      ['NERVA_ATTN_MIN_CHUNK', '4', /NERVA_ATTN_MIN_CHUNK.*\[8, /],
      ['NERVA_DECODE_EARLY', '4', /NERVA_DECODE_EARLY.*\[0, 3\]/],
      ['NERVA_DECODE_EARLY', '-1', /NERVA_DECODE_EARLY.*"-1"/],
      ['NERVA_HOST_THREADS', '1.5', /NERVA_HOST_THREADS.*"1.5"/],
      ['NERVA_HOST_THREADS', ' 4', /NERVA_HOST_THREADS.*" 4"/],
      ['NERVA_BI_GEMM_WARPS', '99999999999', /NERVA_BI_GEMM_WARPS/],
      ['NERVA_GEMV_MAX_ROWS', '12', /NERVA_GEMV_MAX_ROWS: must be 8, 16 or unset, got "12"/],
      ['NERVA_GEMV_WIDE', '2', /NERVA_GEMV_WIDE: must be 0, 4, 8 or unset, got "2"/],
      ['NERVA_ATTN_SHORT', '3', /NERVA_ATTN_SHORT: must be 0, 2, 4, 8, 16 or unset, got "3"/],
      ['NERVA_GEMV_LEAN', '2', /NERVA_GEMV_LEAN: must be 0, 1 or unset, got "2"/],
      ['NERVA_BI_GEMM', 'Kernel', /NERVA_BI_GEMM: must be 0, 1, kernel or unset/],
      ['NERVA_PDL', 'off', /NERVA_PDL.*"off"/],
      ['NERVA_HOST_ISA', 'avx', /NERVA_HOST_ISA: must be scalar, avx2, avx512 or unset, got "avx"/],
    ];
    for (const [name, v, re] of bad) {
      let err: unknown;
      try {
        checkTuningEnv({ [name]: v });
      } catch (e) {
        err = e;
      }
      expect(err, `${name}=${v}`).toBeInstanceOf(CudaArgumentError);
      expect((err as Error).message).toMatch(re);
    }
  });

  it('runs in createCudaBackend before the addon loads, and leaves the environment as it was', () => {
    const saved = process.env.NERVA_DECODE_EARLY;
    process.env.NERVA_DECODE_EARLY = 'three';
    try {
      expect(() => createCudaBackend({ addonPath: '/nonexistent/nerva_cuda.node' })).toThrow(/NERVA_DECODE_EARLY.*"three"/);
      expect(process.env.NERVA_DECODE_EARLY).toBe('three');
    } finally {
      if (saved === undefined) delete process.env.NERVA_DECODE_EARLY;
      else process.env.NERVA_DECODE_EARLY = saved;
    }
  });
});
