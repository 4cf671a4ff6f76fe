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

  // Counts in llama.cpp's own load logs of files its quantizer wrote (`llama_model_loader: - type
  // ...: N tensors`): a Llama 3 8B at Q3_K_L (with rope_freqs: f32 66) and a 32-layer model with
  // 8 KV heads of 32 at Q3_K_M (Mistral 7B's shape, no rope_freqs: f32 65). Their rules do not
  // depend on the vocabulary or the widths, so the Llama 3.1 8B config stands for both.
  it('Q3_K_L and Q3_K_M: the tensor-type counts of llama.cpp-made files of the same layer and head shape', () => {
    const s = spec(join(CONFIGS, 'llama-3.1-8b.json'));
    expect(counts(plan(s, 'Q3_K_L', true))).toEqual({ F32: 66, Q3_K: 129, Q5_K: 96, Q6_K: 1 });
    const m = plan(s, 'Q3_K_M');
    expect(counts(m)).toEqual({ F32: 65, Q3_K: 129, Q4_K: 92, Q5_K: 4, Q6_K: 1 });
    // Q3_K_M's four Q5_K: attn_v and ffn_down of the first two layers (32 / 16).
    expect(['blk.0.attn_v.weight', 'blk.1.attn_v.weight', 'blk.0.ffn_down.weight', 'blk.1.ffn_down.weight'].map((n) => m.get(n))).toEqual(['Q5_K', 'Q5_K', 'Q5_K', 'Q5_K']);
    expect(m.get('blk.2.attn_v.weight')).toBe('Q4_K');
    expect(m.get('blk.2.attn_output.weight')).toBe('Q4_K');
    expect(m.get('blk.2.ffn_up.weight')).toBe('Q3_K');
  });

  // Per-tensor types in llama.cpp's load logs of Q5_K_M files: a 32-layer GQA model (4096 wide,
  // 32000 vocab: Mistral 7B) and a 32-layer MHA one (Llama 2 7B).
  it('Q5_K_M: the extra bits of Q4_K_M on a Q5_K base, in the layers llama.cpp-made files show', () => {
    const m = plan(spec(join(CONFIGS, 'llama-3.1-8b.json')), 'Q5_K_M', true);
    expect(counts(m)).toEqual({ F32: 66, Q5_K: 193, Q6_K: 33 });
    for (const n of ['blk.29.attn_v.weight', 'blk.30.attn_v.weight', 'blk.29.ffn_down.weight', 'blk.30.ffn_down.weight', 'output.weight']) expect(m.get(n), n).toBe('Q6_K');
    for (const n of ['blk.29.attn_output.weight', 'blk.29.attn_q.weight', 'blk.30.attn_k.weight', 'blk.30.ffn_gate.weight', 'blk.26.attn_v.weight', 'blk.26.ffn_down.weight']) expect(m.get(n), n).toBe('Q5_K');
  });

  // The remaining mixes, by llama.cpp's `llama_tensor_get_type` (src/llama-quant.cpp).
  it('Q2_K, Q3_K_S, Q4_K_S and Q5_K_S on the Llama 3.1 8B shape', () => {
    const s = spec(join(CONFIGS, 'llama-3.1-8b.json'));
    const q2 = plan(s, 'Q2_K');
    // attn_v at Q4_K (4 q heads a KV head), ffn_down and attn_output at Q3_K.
    expect(counts(q2)).toEqual({ F32: 65, Q2_K: 129, Q3_K: 64, Q4_K: 32, Q6_K: 1 });
    expect([q2.get('blk.5.attn_v.weight'), q2.get('blk.5.ffn_down.weight'), q2.get('blk.5.attn_output.weight')]).toEqual(['Q4_K', 'Q3_K', 'Q3_K']);
    expect(counts(plan(s, 'Q3_K_S'))).toEqual({ F32: 65, Q3_K: 225, Q6_K: 1 });
    // Q4_K_S: attn_v of the first four layers and ffn_down of the first eighth at Q5_K.
    const q4s = plan(s, 'Q4_K_S');
    expect(counts(q4s)).toEqual({ F32: 65, Q4_K: 217, Q5_K: 8, Q6_K: 1 });
    expect([q4s.get('blk.3.attn_v.weight'), q4s.get('blk.4.attn_v.weight'), q4s.get('blk.3.ffn_down.weight'), q4s.get('blk.4.ffn_down.weight')]).toEqual(['Q5_K', 'Q4_K', 'Q5_K', 'Q4_K']);
    expect(counts(plan(s, 'Q5_K_S'))).toEqual({ F32: 65, Q5_K: 225, Q6_K: 1 });
    // With fewer than four q heads a KV head, Q2_K's attn_v is Q3_K.
    const mha = { ...s, numKvHeads: s.numHeads };
    expect(plan(mha, 'Q2_K').get('blk.0.attn_v.weight')).toBe('Q3_K');
  });

  it('IQ4_NL and IQ4_XS: attn_v at Q5_K with four q heads a KV head, the first eighth of ffn_down at Q5_K', () => {
    const s = spec(join(CONFIGS, 'llama-3.1-8b.json'));
    for (const t of ['IQ4_NL', 'IQ4_XS'] as const) {
      const m = plan(s, t);
      expect(counts(m), t).toEqual({ F32: 65, [t]: 189, Q5_K: 36, Q6_K: 1 });
      expect([m.get('blk.9.attn_v.weight'), m.get('blk.3.ffn_down.weight'), m.get('blk.4.ffn_down.weight'), m.get('token_embd.weight')]).toEqual(['Q5_K', 'Q5_K', t, t]);
    }
    // Two q heads a KV head (the Shakespeare model): attn_v keeps the base type.
    const small = spec(join(MODELS, 'tiny-shakespeare-qwen3', 'config.json'));
    expect(plan(small, 'IQ4_XS').get('blk.0.attn_v.weight')).toBe('IQ4_XS');
    // IQ4_XS rows that are not whole 256-blocks fall back to IQ4_NL; IQ4_NL's to F16.
    const tiny = spec(join(MODELS, 'tiny-random-llama', 'config.json')); // hidden 64, intermediate 176
    expect(plan(tiny, 'IQ4_XS').get('blk.0.attn_q.weight')).toBe('IQ4_NL');
    expect(plan(tiny, 'IQ4_NL').get('blk.1.ffn_down.weight')).toBe('F16');
  });

  it('the 32-block file types: every matrix at the type, the output at Q6_K', () => {
    const s = spec(join(CONFIGS, 'llama-3.1-8b.json'));
    for (const t of ['Q4_1', 'Q5_0', 'Q5_1'] as const) expect(counts(plan(s, t)), t).toEqual({ F32: 65, [t]: 225, Q6_K: 1 });
  });

  it('"70B" models: a Q3_K or Q4_K attn_v becomes Q5_K', () => {
    const s = spec(join(CONFIGS, 'llama-3.1-8b.json'));
    const big = { ...s, numLayers: 80 };
    expect(plan(big, 'Q3_K_M').get('blk.40.attn_v.weight')).toBe('Q5_K');
    expect(plan(big, 'Q4_K_M').get('blk.11.attn_v.weight')).toBe('Q5_K');
    expect(plan(big, 'Q4_K_M').get('blk.12.attn_v.weight')).toBe('Q6_K');
    expect(plan(s, 'Q4_K_M').get('blk.5.attn_v.weight')).toBe('Q4_K');
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
