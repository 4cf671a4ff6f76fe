import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { canonicalWeightNames, Checkpoint, CheckpointError, listWeightSlots, loadModelConfig, resolveWeights, writeSyntheticCheckpoint, type ModelSpec } from '../src/index.js';
import { MODELS, tempDir } from './helpers.js';

async function fixture(name: string): Promise<{ spec: ModelSpec; ck: Checkpoint }> {
  const dir = join(MODELS, name);
  return { spec: await loadModelConfig(dir), ck: await Checkpoint.open(dir) };
}

describe('canonical weights', () => {
  it('every fixture resolves, and every checkpoint tensor is accounted for', async () => {
    const names = await readdir(MODELS);
    // An empty folder would pass with nothing checked.
    expect(names.length).toBeGreaterThan(0);
    for (const name of names) {
      const { spec, ck } = await fixture(name);
      const w = resolveWeights(spec, ck);
      const used = new Set(listWeightSlots(w).map((s) => s.name));
      expect([...used].sort()).toEqual(ck.names().sort());
      for (const s of listWeightSlots(w)) {
        expect(s.shape).toEqual(ck.info(s.name).shape);
        expect(s.file).toBe(ck.info(s.name).file);
      }
      await ck.close();
    }
  });

  it('qwen2: q/k/v biases, no o bias, tied LM head is the embedding', async () => {
    const { spec, ck } = await fixture('tiny-random-qwen2');
    const w = resolveWeights(spec, ck);
    expect(w.tiedLmHead).toBe(true);
    expect(w.lmHead).toBe(w.embed);
    const l0 = w.layers[0];
    expect(l0.qBias?.shape).toEqual([64]);
    expect(l0.kBias?.shape).toEqual([16]); // MQA: one KV head of 16
    expect(l0.vBias?.name).toBe('model.layers.0.self_attn.v_proj.bias');
    expect(l0.oBias).toBeUndefined();
    expect(l0.qNorm).toBeUndefined();
    expect(l0.q.dtype).toBe('F16');
    await ck.close();
  });

  it('tiny-shakespeare: q is [heads*head_dim, hidden] = [512, 256], o is [256, 512]', async () => {
    const { spec, ck } = await fixture('tiny-shakespeare-qwen3');
    const w = resolveWeights(spec, ck);
    expect(w.layers[0].q.shape).toEqual([512, 256]);
    expect(w.layers[0].o.shape).toEqual([256, 512]);
    expect(w.layers[0].qNorm?.shape).toEqual([128]);
    expect(w.layers[5].kNorm?.slot).toBe('layers.5.k_norm');
    await ck.close();
  });

  it('MoE: router and per-expert tensors', async () => {
    const { spec, ck } = await fixture('tiny-random-qwen3-moe');
    const w = resolveWeights(spec, ck);
    const mlp = w.layers[1].mlp;
    expect(mlp.kind).toBe('moe');
    if (mlp.kind !== 'moe') return;
    expect(mlp.router.name).toBe('model.layers.1.mlp.gate.weight');
    expect(mlp.router.shape).toEqual([8, 64]);
    expect(mlp.experts.length).toBe(8);
    expect(mlp.experts[7].down.name).toBe('model.layers.1.mlp.experts.7.down_proj.weight');
    expect(mlp.experts[7].down.shape).toEqual([64, 32]);
    expect(w.lmHead.name).toBe('lm_head.weight');
    await ck.close();
  });

  it('a tensor the spec needs but the checkpoint lacks → MISSING_TENSOR naming it', async () => {
    const { spec, ck } = await fixture('tiny-random-llama');
    let err: unknown;
    try {
      resolveWeights({ ...spec, attentionBias: true }, ck);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(CheckpointError);
    expect((err as CheckpointError).code).toBe('MISSING_TENSOR');
    expect((err as CheckpointError).tensor).toBe('model.layers.0.self_attn.q_proj.bias');
    expect((err as CheckpointError).message).toContain('model.safetensors');
    await ck.close();
  });

  it('a tensor of the wrong shape → SHAPE_MISMATCH naming tensor and file', async () => {
    const dir = await tempDir();
    const config = {
      model_type: 'llama',
      vocab_size: 16,
      hidden_size: 8,
      intermediate_size: 12,
      num_hidden_layers: 1,
      num_attention_heads: 2,
      num_key_value_heads: 1,
    };
    await writeSyntheticCheckpoint({ config, outDir: dir, seed: 1 });
    const ck = await Checkpoint.open(dir);
    const spec = await loadModelConfig(dir);
    expect(() => resolveWeights({ ...spec, intermediateSize: 10 }, ck)).toThrow(/model\.layers\.0\.mlp\.gate_proj\.weight.*\[12, 8\].*\[10, 8\]/);
    try {
      resolveWeights({ ...spec, intermediateSize: 10 }, ck);
    } catch (e) {
      expect((e as CheckpointError).code).toBe('SHAPE_MISMATCH');
      expect((e as CheckpointError).file).toBe(join(dir, 'model.safetensors'));
    }
    await ck.close();
  });

  it('canonical names need no checkpoint and list the untied LM head last', () => {
    const spec = {
      arch: 'llama', vocabSize: 10, hiddenSize: 4, intermediateSize: 6, numLayers: 2, numHeads: 2, numKvHeads: 1, headDim: 2,
      rmsNormEps: 1e-5, ropeTheta: 1e4, ropeScaling: { type: 'default' }, maxPositionEmbeddings: 16, tieWordEmbeddings: false,
      attentionBias: true, oProjBias: true, qkNorm: false, eosTokenIds: [], torchDtype: 'float32',
    } satisfies ModelSpec;
    const slots = listWeightSlots(canonicalWeightNames(spec));
    expect(slots.length).toBe(1 + 2 * 13 + 1 + 1);
    expect(slots[slots.length - 1]).toEqual({ slot: 'lm_head', name: 'lm_head.weight', shape: [10, 4] });
    expect(slots.find((s) => s.slot === 'layers.1.o_bias')?.shape).toEqual([4]);
    expect(new Set(slots.map((s) => s.slot)).size).toBe(slots.length);
  });
});
