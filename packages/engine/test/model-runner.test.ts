import { describe, expect, it } from 'vitest';
import { NORM_FUSION_MAX_WEIGHT_BYTES, normFusesIntoGemv } from '../src/index.js';

describe('normFusesIntoGemv (decode-pass norm fusion rule)', () => {
  it('folds the norm into small GEMVs only (Qwen3 shapes, bf16)', () => {
    // Qwen3-0.6B qkv: (16 + 2 * 8) * 128 = 4096 rows x 1024 = 8 MiB -> fused
    expect(normFusesIntoGemv(4096, 1024, 'bf16')).toBe(true);
    // Qwen3-0.6B gate_up: 2 * 3072 rows x 1024 = 12 MiB -> separate rmsnorm
    expect(normFusesIntoGemv(6144, 1024, 'bf16')).toBe(false);
    // Qwen3-8B qkv and gate_up: 48 MiB and 192 MiB -> separate rmsnorm
    expect(normFusesIntoGemv(6144, 4096, 'bf16')).toBe(false);
    expect(normFusesIntoGemv(24576, 4096, 'bf16')).toBe(false);
  });

  it('counts bytes, so the element size matters', () => {
    // 4096 x 1024 is 8 MiB in bf16 but 16 MiB in f32
    expect(normFusesIntoGemv(4096, 1024, 'f32')).toBe(false);
  });

  it('includes the boundary', () => {
    const rows = NORM_FUSION_MAX_WEIGHT_BYTES / (2 * 1024);
    expect(normFusesIntoGemv(rows, 1024, 'bf16')).toBe(true);
    expect(normFusesIntoGemv(rows + 1, 1024, 'bf16')).toBe(false);
  });
});
