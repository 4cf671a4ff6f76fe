import { readFile, readdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ConfigError, isMoeLayer, kvReadWindow, layerWindow, loadModelConfig, parseModelConfig } from '../src/index.js';
import { CONFIGS, LOCAL_MODELS, MODELS, tempDir } from './helpers.js';

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
    const names = await readdir(MODELS);
    // An empty folder would pass with nothing checked.
    expect(names.length).toBeGreaterThan(0);
    for (const name of names) {
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
    const files = await readdir(CONFIGS);
    expect(files.length).toBeGreaterThan(0);
    for (const f of files) {
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

  describe('sliding-window attention (transformers 5.x Qwen2Config / Qwen3Config / Qwen3MoeModel semantics)', () => {
    const q = { ...base, num_hidden_layers: 4 };
    const windows = (json: Record<string, unknown>) => {
      const s = parseModelConfig(json);
      return Array.from({ length: s.numLayers }, (_, l) => layerWindow(s, l));
    };

    it('real configs with use_sliding_window=false have no windows', async () => {
      const files = await readdir(CONFIGS);
      expect(files.length).toBeGreaterThan(0);
      for (const f of files) {
        const s = parseModelConfig(JSON.parse(await readFile(join(CONFIGS, f), 'utf8')), f);
        expect(s.layerWindows).toBeUndefined();
        expect(kvReadWindow(s)).toBe(0);
      }
      // Qwen2.5-0.5B: sliding_window 32768 and max_window_layers 24, but use_sliding_window false.
      const q25 = JSON.parse(await readFile(join(CONFIGS, 'qwen2.5-0.5b.json'), 'utf8'));
      expect(q25.sliding_window).toBe(32768);
      expect(parseModelConfig({ ...q25, use_sliding_window: true }).layerWindows).toBeUndefined(); // 24 >= 24 layers
      expect(parseModelConfig({ ...q25, use_sliding_window: true, max_window_layers: 20 }).layerWindows).toEqual([...Array(20).fill(0), 32768, 32768, 32768, 32768]);
    });

    it('the transformers-made sliding-window fixtures: the layer types transformers read back', async () => {
      for (const name of ['tiny-random-qwen2-swa', 'tiny-random-qwen3-swa']) {
        const dir = join(LOCAL_MODELS, name);
        const s = await loadModelConfig(dir);
        const ref = JSON.parse(await readFile(join(dir, 'reference.json'), 'utf8')) as { sliding: { sliding_window: number; layer_types: string[] } };
        expect(s.layerWindows).toEqual(ref.sliding.layer_types.map((t) => (t === 'sliding_attention' ? ref.sliding.sliding_window : 0)));
      }
      expect(kvReadWindow(await loadModelConfig(join(LOCAL_MODELS, 'tiny-random-qwen2-swa')))).toBe(0);
      expect(kvReadWindow(await loadModelConfig(join(LOCAL_MODELS, 'tiny-random-qwen3-swa')))).toBe(5);
    });

    it('without layer_types: layer i slides iff use_sliding_window, a window, and i >= max_window_layers', () => {
      for (const arch of ['qwen2', 'qwen3']) {
        expect(windows({ ...q, model_type: arch, use_sliding_window: true, sliding_window: 6, max_window_layers: 1 })).toEqual([0, 6, 6, 6]);
        expect(windows({ ...q, model_type: arch, use_sliding_window: true, sliding_window: 6, max_window_layers: 0 })).toEqual([6, 6, 6, 6]);
        expect(windows({ ...q, model_type: arch, use_sliding_window: true, sliding_window: 6, max_window_layers: 4 })).toEqual([0, 0, 0, 0]);
        // use_sliding_window false (or absent): transformers sets sliding_window to None.
        expect(windows({ ...q, model_type: arch, use_sliding_window: false, sliding_window: 6, max_window_layers: 0 })).toEqual([0, 0, 0, 0]);
        expect(windows({ ...q, model_type: arch, sliding_window: 6, max_window_layers: 0 })).toEqual([0, 0, 0, 0]);
        // Explicit null: no window in effect.
        expect(windows({ ...q, model_type: arch, use_sliding_window: true, sliding_window: null, max_window_layers: 0 })).toEqual([0, 0, 0, 0]);
      }
      // Dataclass defaults when the keys are absent: sliding_window 4096, max_window_layers 28.
      expect(windows({ ...q, num_hidden_layers: 30, use_sliding_window: true }).slice(26)).toEqual([0, 0, 4096, 4096]);
      expect(windows({ ...q, use_sliding_window: true, max_window_layers: 2 })).toEqual([0, 0, 4096, 4096]);
      const s = parseModelConfig({ ...q, use_sliding_window: true, sliding_window: 6, max_window_layers: 1 });
      expect(s.layerWindows).toEqual([0, 6, 6, 6]);
      expect(kvReadWindow(s)).toBe(0); // layer 0 is full attention: nothing can be freed
      expect(kvReadWindow(parseModelConfig({ ...q, use_sliding_window: true, sliding_window: 6, max_window_layers: 0 }))).toBe(6);
    });

    it('layer_types, when present, wins over max_window_layers', () => {
      const lt = ['sliding_attention', 'full_attention', 'sliding_attention', 'full_attention'];
      expect(windows({ ...q, use_sliding_window: true, sliding_window: 5, max_window_layers: 3, layer_types: lt })).toEqual([5, 0, 5, 0]);
      expect(windows({ ...q, model_type: 'qwen2', use_sliding_window: true, sliding_window: 5, max_window_layers: 0, layer_types: Array(4).fill('full_attention') })).toEqual([0, 0, 0, 0]);
      // All full attention with no window in effect is what transformers saves for ordinary models.
      expect(parseModelConfig({ ...q, use_sliding_window: false, sliding_window: null, layer_types: Array(4).fill('full_attention') }).layerWindows).toBeUndefined();
    });

    it('qwen3_moe slides every layer when use_sliding_window and sliding_window are set', () => {
      const moe = { ...q, model_type: 'qwen3_moe', num_experts: 4, num_experts_per_tok: 2, moe_intermediate_size: 8 };
      expect(windows({ ...moe, use_sliding_window: true, sliding_window: 7, max_window_layers: 2 })).toEqual([7, 7, 7, 7]);
      expect(windows({ ...moe, use_sliding_window: false, sliding_window: 7 })).toEqual([0, 0, 0, 0]);
      const e = configErr({ ...moe, use_sliding_window: true, sliding_window: 7, layer_types: ['full_attention', 'sliding_attention', 'sliding_attention', 'sliding_attention'] });
      expect(e.code).toBe('UNSUPPORTED_FEATURE');
      expect(e.field).toBe('layer_types');
    });

    it('llama has no sliding window: sliding_window is ignored, a use flag or sliding layer types are refused', () => {
      const llama = { ...q, model_type: 'llama' };
      expect(parseModelConfig({ ...llama, sliding_window: 4096 }).layerWindows).toBeUndefined();
      const e = configErr({ ...llama, use_sliding_window: true, sliding_window: 8 });
      expect(e.code).toBe('UNSUPPORTED_FEATURE');
      expect(e.field).toBe('use_sliding_window');
      expect(e.message).toContain('Mistral');
      expect(configErr({ ...llama, layer_types: ['sliding_attention', 'full_attention', 'full_attention', 'full_attention'] }).field).toBe('layer_types');
    });

    const sw = { ...q, use_sliding_window: true, max_window_layers: 0 };
    it('a negative, zero or non-integer window is an INVALID_FIELD naming sliding_window', () => {
      for (const bad of [-4, 0, 2.5, '8', true]) {
        const e = configErr({ ...sw, sliding_window: bad });
        expect(e.code).toBe('INVALID_FIELD');
        expect(e.field).toBe('sliding_window');
        expect(e.message).toContain('sliding_window');
      }
    });

    it('a layer_types list of the wrong length is an INVALID_FIELD', () => {
      const e = configErr({ ...sw, sliding_window: 4, layer_types: ['sliding_attention', 'sliding_attention', 'sliding_attention'] });
      expect(e.code).toBe('INVALID_FIELD');
      expect(e.field).toBe('layer_types');
      expect(e.message).toContain('3 entries but num_hidden_layers is 4');
      expect(configErr({ ...sw, sliding_window: 4, layer_types: 'sliding_attention' }).field).toBe('layer_types');
    });

    it('an unknown layer type is an INVALID_FIELD naming the entry', () => {
      const e = configErr({ ...sw, sliding_window: 4, layer_types: ['full_attention', 'chunked_attention', 'full_attention', 'full_attention'] });
      expect(e.code).toBe('INVALID_FIELD');
      expect(e.field).toBe('layer_types');
      expect(e.message).toContain('layer_types[1] is "chunked_attention"');
    });

    it('sliding layer types without a window in effect are refused (transformers cannot build their mask)', () => {
      const lt = ['sliding_attention', 'full_attention', 'full_attention', 'full_attention'];
      const e = configErr({ ...q, use_sliding_window: false, sliding_window: 4, layer_types: lt });
      expect(e.code).toBe('INVALID_FIELD');
      expect(e.field).toBe('layer_types');
      expect(configErr({ ...q, use_sliding_window: true, sliding_window: null, layer_types: lt }).field).toBe('layer_types');
    });

    it('a non-integer max_window_layers or non-boolean use_sliding_window is an INVALID_FIELD', () => {
      expect(configErr({ ...sw, sliding_window: 4, max_window_layers: -1 }).field).toBe('max_window_layers');
      expect(configErr({ ...sw, sliding_window: 4, max_window_layers: 1.5 }).field).toBe('max_window_layers');
      expect(configErr({ ...q, use_sliding_window: 'yes' }).field).toBe('use_sliding_window');
    });
  });

  it('loadModelConfig reports a missing or malformed file', async () => {
    const dir = await tempDir();
    await expect(loadModelConfig(dir)).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await writeFile(join(dir, 'config.json'), '{ nope');
    await expect(loadModelConfig(dir)).rejects.toMatchObject({ code: 'NOT_JSON' });
  });
});
