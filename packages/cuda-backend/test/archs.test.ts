import { describe, expect, it } from 'vitest';
import { DEFAULT_ARCHS, gencodeFlags, normalizeArch, parseArchList, selectArchitectures } from '../scripts/archs.mjs';

describe('CUDA architecture selection', () => {
  it('takes the list variables first, in priority order', () => {
    expect(selectArchitectures({ NERVA_CUDA_ARCHITECTURES: '80;90', CUDAARCHS: '75' }, '9.0')).toEqual({ archs: ['80', '90'], source: 'NERVA_CUDA_ARCHITECTURES' });
    expect(selectArchitectures({ CUDAARCHS: '86,89', CMAKE_CUDA_ARCHITECTURES: '70' }, null)).toEqual({ archs: ['86', '89'], source: 'CUDAARCHS' });
    expect(selectArchitectures({ CMAKE_CUDA_ARCHITECTURES: '90a 100' }, null)).toEqual({ archs: ['90a', '100'], source: 'CMAKE_CUDA_ARCHITECTURES' });
  });

  it('then the single-arch variables', () => {
    expect(selectArchitectures({ CUDA_ARCH: 'sm_89' }, '9.0')).toEqual({ archs: ['89'], source: 'CUDA_ARCH' });
    expect(selectArchitectures({ CUDA_ARCH: '8.6' }, '9.0')).toEqual({ archs: ['86'], source: 'CUDA_ARCH' });
  });

  it('then the local GPU, then the default list with sm_90', () => {
    expect(selectArchitectures({}, '9.0')).toEqual({ archs: ['90'], source: 'nvidia-smi' });
    expect(selectArchitectures({}, '8.0\n9.0\n9.0')).toEqual({ archs: ['80', '90'], source: 'nvidia-smi' });
    const d = selectArchitectures({}, null);
    expect(d.source).toBe('default');
    expect(d.archs).toEqual(DEFAULT_ARCHS);
    expect(d.archs).toContain('90');
  });

  it('ignores CMake keywords and empty values', () => {
    expect(selectArchitectures({ CMAKE_CUDA_ARCHITECTURES: 'native', CUDAARCHS: '  ' }, null).source).toBe('default');
  });

  it('normalizes spellings and rejects junk', () => {
    expect(normalizeArch('compute_90')).toBe('90');
    expect(normalizeArch('90-real')).toBe('90');
    expect(parseArchList('80;80,90')).toEqual(['80', '90']);
    expect(() => normalizeArch('hopper')).toThrow(/invalid CUDA architecture "hopper"/);
    expect(() => selectArchitectures({ CUDAARCHS: '80;x' }, null)).toThrow(/invalid/);
  });

  it('emits SASS per arch (Hopper as sm_90a, for wgmma) and plain PTX for the newest', () => {
    expect(gencodeFlags(['90', '80'])).toEqual([
      '-gencode=arch=compute_90a,code=sm_90a',
      '-gencode=arch=compute_80,code=sm_80',
      '-gencode=arch=compute_90,code=compute_90',
    ]);
    expect(gencodeFlags(['86', '90a'])).toEqual([
      '-gencode=arch=compute_86,code=sm_86',
      '-gencode=arch=compute_90a,code=sm_90a',
      '-gencode=arch=compute_90,code=compute_90',
    ]);
  });
});
