import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { GgmlTypeName } from '@nerva/core';
import { ggufTensorLayout, parseModelConfig, planGgufTypes, useMoreBits, type GgufConvertType, type ModelSpec } from '../src/index.js';
import { CONFIGS, MODELS } from './helpers.js';

const spec = (path: string): ModelSpec => parseModelConfig(JSON.parse(readFileSync(path, 'utf8')), path);

function plan(s: ModelSpec, type: GgufConvertType, withRopeFreqs = false): Map<string, GgmlTypeName> {
  const shapes = ggufTensorLayout(s).map((t) => ({ name: t.name, dims: t.dims }));
  if (withRopeFreqs) shapes.push({ name: 'rope_freqs.weight', dims: [s.headDim / 2] });
  return planGgufTypes(shapes, s, type);
}

function counts(m: Map<string, GgmlTypeName>): Record<string, number> {
  const c: Record<string, number> = {};
  for (const t of m.values()) c[t] = (c[t] ?? 0) + 1;
  return c;
}

describe('llama.cpp type rules', () => {
  it('use_more_bits picks the first and last eighth and every third layer between', () => {
    const picked = Array.from({ length: 32 }, (_, i) => i).filter((i) => useMoreBits(i, 32));
    expect(picked).toEqual([0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]);
  });

  it('Llama 3.1 8B at Q4_K_M: the tensor-type counts llama.cpp reports for its own Q4_K_M file (f32 66, q4_K 193, q6_K 33)', () => {
    const m = plan(spec(join(CONFIGS, 'llama-3.1-8b.json')), 'Q4_K_M', true);
    expect(counts(m)).toEqual({ F32: 66, Q4_K: 193, Q6_K: 33 });
    expect(m.get('output.weight')).toBe('Q6_K');
    expect(m.get('token_embd.weight')).toBe('Q4_K');
    expect(m.get('blk.0.attn_v.weight')).toBe('Q6_K');
    expect(m.get('blk.4.attn_v.weight')).toBe('Q4_K');
    expect(m.get('blk.6.ffn_down.weight')).toBe('Q6_K');
    expect(m.get('blk.7.ffn_down.weight')).toBe('Q4_K');
    expect(m.get('blk.7.attn_q.weight')).toBe('Q4_K');
  });

  it('Q4_0 and Q6_K put the output matrix at Q6_K; Q8_0 keeps it Q8_0; Q4_K is pure', () => {
    const s = spec(join(CONFIGS, 'llama-3.1-8b.json'));
    expect(counts(plan(s, 'Q4_0'))).toEqual({ F32: 65, Q4_0: 225, Q6_K: 1 });
    expect(counts(plan(s, 'Q6_K'))).toEqual({ F32: 65, Q6_K: 226 });
    expect(counts(plan(s, 'Q8_0'))).toEqual({ F32: 65, Q8_0: 226 });
    expect(counts(plan(s, 'Q4_K'))).toEqual({ F32: 65, Q4_K: 226 });
    expect(counts(plan(s, 'BF16'))).toEqual({ F32: 65, BF16: 226 });
  });

  it('a tied embedding is quantized as the output matrix (Qwen3 0.6B: Q6_K)', () => {
    const s = spec(join(CONFIGS, 'qwen3-0.6b.json'));
    expect(s.tieWordEmbeddings).toBe(true);
    const m = plan(s, 'Q4_K_M');
    expect(m.get('token_embd.weight')).toBe('Q6_K');
    expect(m.has('output.weight')).toBe(false);
    expect(m.get('blk.0.attn_q_norm.weight')).toBe('F32');
  });

  it('MoE: stacked expert tensors follow their projection, the router stays F32 (Qwen3-30B-A3B)', () => {
    const s = spec(join(CONFIGS, 'qwen3-30b-a3b.json'));
    const layout = ggufTensorLayout(s);
    const down = layout.find((t) => t.name === 'blk.0.ffn_down_exps.weight')!;
    expect(down.dims).toEqual([s.moe!.moeIntermediateSize, s.hiddenSize, s.moe!.numExperts]);
    expect(down.sources[127]).toBe('model.layers.0.mlp.experts.127.down_proj.weight');
    const m = plan(s, 'Q4_K_M');
    expect(m.get('blk.0.ffn_gate_inp.weight')).toBe('F32');
    expect(m.get('blk.0.ffn_down_exps.weight')).toBe('Q6_K');
    expect(m.get('blk.10.ffn_down_exps.weight')).toBe('Q4_K');
    expect(m.get('blk.0.ffn_up_exps.weight')).toBe('Q4_K');
  });

  it('8-expert models: attn_v / attn_k at Q8_0, attn_output at Q5_K (here falling back to Q5_1: 64-wide rows)', () => {
    const s = spec(join(MODELS, 'tiny-random-qwen3-moe', 'config.json'));
    const m = plan(s, 'Q4_K_M');
    expect(m.get('blk.0.attn_v.weight')).toBe('Q8_0');
    expect(m.get('blk.1.attn_k.weight')).toBe('Q8_0');
    expect(m.get('blk.1.attn_output.weight')).toBe('Q5_1');
  });

  it('rows that are not whole blocks fall back as llama.cpp does (Q4_K → Q5_0 → F16; Q6_K → Q8_0; Q8_0 → F16)', () => {
    const s = spec(join(MODELS, 'tiny-random-llama', 'config.json')); // hidden 64, intermediate 176
    const km = plan(s, 'Q4_K_M');
    expect(km.get('blk.0.attn_q.weight')).toBe('Q5_0'); // 64: not a multiple of 256, a multiple of 32
    expect(km.get('blk.1.ffn_up.weight')).toBe('Q5_0');
    expect(km.get('blk.1.ffn_down.weight')).toBe('F16'); // 176 = 5.5 blocks of 32
    expect(km.get('output.weight')).toBe('Q8_0'); // 64 % 256 ≠ 0: llama.cpp's Q8_0 for the output
    expect(plan(s, 'Q6_K').get('blk.0.attn_v.weight')).toBe('Q8_0');
    expect(plan(s, 'Q8_0').get('blk.1.ffn_down.weight')).toBe('F16');
    expect(plan(s, 'Q4_0').get('blk.1.ffn_down.weight')).toBe('F16');
  });
});
