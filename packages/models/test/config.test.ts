import { readFile, readdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ConfigError, isMoeLayer, loadModelConfig, parseModelConfig } from '../src/index.js';
import { CONFIGS, MODELS, tempDir } from './helpers.js';

async function rawConfig(dir: string): Promise<Record<string, any>> {
  return JSON.parse(await readFile(join(dir, 'config.json'), 'utf8'));
}

function configErr(json: unknown): ConfigError {
  try {
    parseModelConfig(json, 'test-config.json');
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return e as ConfigError;
  }
  throw new Error('expected a ConfigError');
}

describe('parseModelConfig on the fixture models', () => {
  it('every fixture config parses and matches its config.json', async () => {
    for (const name of await readdir(MODELS)) {
      const c = await rawConfig(join(MODELS, name));
      const s = await loadModelConfig(join(MODELS, name));
      expect(s.arch).toBe(c.model_type);
      expect(s.vocabSize).toBe(c.vocab_size);
      expect(s.hiddenSize).toBe(c.hidden_size);
      expect(s.numLayers).toBe(c.num_hidden_layers);
      expect(s.numHeads).toBe(c.num_attention_heads);
      expect(s.numKvHeads).toBe(c.num_key_value_heads);
      expect(s.headDim).toBe(c.head_dim ?? c.hidden_size / c.num_attention_heads);
      expect(s.rmsNormEps).toBe(c.rms_norm_eps);
      expect(s.ropeTheta).toBe(c.rope_theta);
      expect(s.tieWordEmbeddings).toBe(c.tie_word_embeddings);
      expect(s.eosTokenIds).toEqual([c.eos_token_id]);
      expect(s.bosTokenId).toBe(c.bos_token_id);
      expect(s.maxPositionEmbeddings).toBe(c.max_position_embeddings);
    }
  });

  it('tiny-shakespeare: head_dim 128 differs from hidden/heads = 64; qk-norm; tied', async () => {
    const s = await loadModelConfig(join(MODELS, 'tiny-shakespeare-qwen3'));
    expect(s.headDim).toBe(128);
    expect(s.hiddenSize / s.numHeads).toBe(64);
    expect(s.qkNorm).toBe(true);
    expect(s.tieWordEmbeddings).toBe(true);
    expect(s.attentionBias).toBe(false);
    expect(s.torchDtype).toBe('bfloat16');
    expect(s.ropeScaling).toEqual({ type: 'default' });
  });

  it('tiny-random-llama: llama3 RoPE scaling, no qk-norm, f32', async () => {
    const s = await loadModelConfig(join(MODELS, 'tiny-random-llama'));
    expect(s.ropeScaling).toEqual({ type: 'llama3', factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 64 });
    expect(s.qkNorm).toBe(false);
    expect(s.attentionBias).toBe(false);
    expect(s.oProjBias).toBe(false);
    expect(s.torchDtype).toBe('float32');
  });

  it('tiny-random-qwen2: MQA and q/k/v bias by default, no o bias', async () => {
    const c = await rawConfig(join(MODELS, 'tiny-random-qwen2'));
    expect(c.attention_bias).toBeUndefined(); // the default must come from the architecture
    const s = parseModelConfig(c);
    expect(s.numKvHeads).toBe(1);
    expect(s.attentionBias).toBe(true);
    expect(s.oProjBias).toBe(false);
    expect(s.qkNorm).toBe(false);
    expect(s.headDim).toBe(16);
    expect(s.torchDtype).toBe('float16');
  });

  it('tiny-random-qwen3-moe: MoE fields', async () => {
    const s = await loadModelConfig(join(MODELS, 'tiny-random-qwen3-moe'));
    expect(s.moe).toEqual({ numExperts: 8, topK: 2, moeIntermediateSize: 32, normTopkProb: true, decoderSparseStep: 1, mlpOnlyLayers: [] });
    expect(s.intermediateSize).toBe(128);
    expect(s.qkNorm).toBe(true);
    expect(isMoeLayer(s, 0)).toBe(true);
    expect(isMoeLayer(s, 1)).toBe(true);
  });
});

describe('parseModelConfig on real model shapes and edge cases', () => {
  it('parses every shared real config (Qwen3 dense and MoE, Llama 3.x, Qwen2.5)', async () => {
    for (const f of await readdir(CONFIGS)) {
      const c = JSON.parse(await readFile(join(CONFIGS, f), 'utf8'));
      const s = parseModelConfig(c, f);
      expect(s.numLayers).toBe(c.num_hidden_layers);
      if (c.model_type === 'qwen3_moe') expect(s.moe?.numExperts).toBe(c.num_experts);
      if (c.rope_scaling?.rope_type === 'llama3') expect(s.ropeScaling.type).toBe('llama3');
    }
    const llama = parseModelConfig(JSON.parse(await readFile(join(CONFIGS, 'llama-3.1-8b.json'), 'utf8')));
    expect(llama.ropeTheta).toBe(500000);
    expect(llama.ropeScaling).toMatchObject({ type: 'llama3', originalMaxPositionEmbeddings: 8192 });
  });

  it('unknown or unsupported model_type names what it got and what is supported', () => {
    for (const t of ['qwen3_next', 'qwen3_5', 'gpt2']) {
      const e = configErr({ model_type: t, hidden_size: 8 });
      expect(e.code).toBe('UNSUPPORTED_MODEL_TYPE');
      expect(e.message).toContain(`"${t}"`);
      expect(e.message).toContain('llama, qwen2, qwen3, qwen3_moe');
    }
    expect(configErr({ hidden_size: 8 }).code).toBe('MISSING_FIELD');
    expect(configErr([1]).code).toBe('NOT_JSON');
  });

  const base = {
    model_type: 'qwen3',
    vocab_size: 32,
    hidden_size: 16,
    intermediate_size: 24,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 2,
  };

  it('missing required fields are named', () => {
    for (const f of ['vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers', 'num_attention_heads']) {
      const c: Record<string, unknown> = { ...base };
      delete c[f];
      const e = configErr(c);
      expect(e.code).toBe('MISSING_FIELD');
      expect(e.field).toBe(f);
      expect(e.message).toContain(f);
    }
    const e = configErr({ ...base, model_type: 'qwen3_moe', num_experts: 4 });
    expect(e.field).toBe('num_experts_per_tok');
  });

  it('invalid values are named', () => {
    expect(configErr({ ...base, num_key_value_heads: 3 }).field).toBe('num_key_value_heads');
    expect(configErr({ ...base, hidden_size: 'big' }).code).toBe('INVALID_FIELD');
    expect(configErr({ ...base, hidden_act: 'gelu' }).code).toBe('UNSUPPORTED_FEATURE');
    expect(configErr({ ...base, use_sliding_window: true }).field).toBe('use_sliding_window');
    expect(configErr({ ...base, torch_dtype: 'int8' }).field).toBe('torch_dtype');
  });

  it('applies HF defaults for omitted optional fields', () => {
    const s = parseModelConfig({ ...base, num_key_value_heads: undefined });
    expect(s.numKvHeads).toBe(4);
    expect(s.headDim).toBe(4);
    expect(s.ropeTheta).toBe(10000);
    expect(s.rmsNormEps).toBe(1e-6);
    expect(s.eosTokenIds).toEqual([]);
    expect(s.bosTokenId).toBeUndefined();
    expect(parseModelConfig({ ...base, eos_token_id: [5, 7] }).eosTokenIds).toEqual([5, 7]);
  });

  it('yarn and other rope types are explicit errors; linear and rope_parameters are read', () => {
    const e = configErr({ ...base, rope_scaling: { rope_type: 'yarn', factor: 4, original_max_position_embeddings: 32768 } });
    expect(e.code).toBe('UNSUPPORTED_ROPE');
    expect(e.message).toContain('yarn');
    expect(configErr({ ...base, rope_scaling: { type: 'dynamic', factor: 2 } }).code).toBe('UNSUPPORTED_ROPE');
    expect(configErr({ ...base, rope_scaling: { rope_type: 'llama3', factor: 8 } }).field).toBe('rope_scaling.low_freq_factor');
    expect(parseModelConfig({ ...base, rope_scaling: { type: 'linear', factor: 2 } }).ropeScaling).toEqual({ type: 'linear', factor: 2 });
    // transformers v5 layout: theta and scaling under rope_parameters.
    const v5 = parseModelConfig({ ...base, rope_parameters: { rope_type: 'default', rope_theta: 1e6 } });
    expect(v5.ropeTheta).toBe(1e6);
    expect(v5.ropeScaling).toEqual({ type: 'default' });
  });

  it('isMoeLayer follows decoder_sparse_step and mlp_only_layers', () => {
    const s = parseModelConfig({
      ...base,
      model_type: 'qwen3_moe',
      num_hidden_layers: 6,
      num_experts: 4,
      num_experts_per_tok: 2,
      moe_intermediate_size: 8,
      decoder_sparse_step: 2,
      mlp_only_layers: [3],
    });
    expect([0, 1, 2, 3, 4, 5].map((l) => isMoeLayer(s, l))).toEqual([false, true, false, false, false, true]);
    expect(s.moe?.normTopkProb).toBe(false);
  });

  it('loadModelConfig reports a missing or malformed file', async () => {
    const dir = await tempDir();
    await expect(loadModelConfig(dir)).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await writeFile(join(dir, 'config.json'), '{ nope');
    await expect(loadModelConfig(dir)).rejects.toMatchObject({ code: 'NOT_JSON' });
  });
});
