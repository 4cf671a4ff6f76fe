import { readdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { Checkpoint, ConfigError, listWeightSlots, loadModelConfig, parseModelConfig, planSyntheticCheckpoint, resolveWeights, SafetensorsFile, writeSyntheticCheckpoint } from '../src/index.js';
import { CONFIGS, MODELS, tempDir } from './helpers.js';

const TINY = {
  model_type: 'qwen3',
  vocab_size: 300,
  hidden_size: 32,
  intermediate_size: 80,
  num_hidden_layers: 3,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 16,
  tie_word_embeddings: false,
  torch_dtype: 'bfloat16',
};

function stats(x: Float32Array): { mean: number; std: number } {
  let s = 0;
  for (const v of x) s += v;
  const mean = s / x.length;
  let q = 0;
  for (const v of x) q += (v - mean) ** 2;
  return { mean, std: Math.sqrt(q / x.length) };
}

describe('writeSyntheticCheckpoint', () => {
  it('round-trips a sharded tiny Qwen3: index valid, every tensor resolves with sane values', async () => {
    const dir = await tempDir();
    const progress: [number, number][] = [];
    const r = await writeSyntheticCheckpoint({ config: TINY, outDir: dir, seed: 7, shardBytes: 40_000, onProgress: (d, t) => progress.push([d, t]) });
    expect(r.files.length).toBeGreaterThan(2);
    expect(r.indexPath).toBe(join(dir, 'model.safetensors.index.json'));
    expect(JSON.parse(await readFile(join(dir, 'config.json'), 'utf8'))).toEqual(TINY);

    const index = JSON.parse(await readFile(r.indexPath!, 'utf8'));
    expect(index.metadata.total_size).toBe(r.totalBytes);
    const shardNames = [...new Set(Object.values(index.weight_map))].sort();
    expect(shardNames).toEqual(r.files.map((f) => f.slice(dir.length + 1)).sort());
    expect(shardNames[0]).toMatch(/^model-00001-of-0000\d\.safetensors$/);
    expect((await readdir(dir)).some((f) => f.endsWith('.partial'))).toBe(false);

    const spec = await loadModelConfig(dir);
    const ck = await Checkpoint.open(dir);
    const w = resolveWeights(spec, ck);
    const slots = listWeightSlots(w);
    expect(slots.length).toBe(r.numTensors);
    expect(ck.names().sort()).toEqual(slots.map((s) => s.name).sort());
    expect(ck.totalBytes).toBe(r.totalBytes);
    expect(w.lmHead.name).toBe('lm_head.weight');
    for (const s of slots) expect(s.dtype).toBe('BF16');
    // Each shard's header keeps the data section 8-byte aligned.
    for (const f of ck.files) expect(f.dataOffset % 8).toBe(0);

    const q = stats(await ck.readF32(w.layers[1].q.name));
    expect(Math.abs(q.mean)).toBeLessThan(0.002);
    expect(q.std).toBeGreaterThan(0.018);
    expect(q.std).toBeLessThan(0.022);
    const norm = stats(await ck.readF32(w.layers[2].inputNorm.name));
    expect(Math.abs(norm.mean - 1)).toBeLessThan(0.01);
    expect(norm.std).toBeLessThan(0.05);
    const qn = await ck.readF32(w.layers[0].qNorm!.name);
    expect(qn.every((v) => v > 0.8 && v < 1.2)).toBe(true);
    await ck.close();

    expect(progress[progress.length - 1]).toEqual([r.totalBytes, r.totalBytes]);
    for (let i = 1; i < progress.length; i++) expect(progress[i][0]).toBeGreaterThan(progress[i - 1][0]);
  });

  it('is deterministic from the seed, independent of sharding', async () => {
    const a = await tempDir();
    const b = await tempDir();
    const c = await tempDir();
    await writeSyntheticCheckpoint({ config: TINY, outDir: a, seed: 3 });
    await writeSyntheticCheckpoint({ config: TINY, outDir: b, seed: 3, shardBytes: 30_000 });
    await writeSyntheticCheckpoint({ config: TINY, outDir: c, seed: 4 });
    const [ca, cb, cc] = await Promise.all([a, b, c].map((d) => Checkpoint.open(d)));
    expect(ca.files.length).toBe(1);
    expect(cb.files.length).toBeGreaterThan(1);
    for (const name of ca.names()) expect(Buffer.from(await cb.readRaw(name)).equals(Buffer.from(await ca.readRaw(name)))).toBe(true);
    const name = 'model.layers.0.mlp.up_proj.weight';
    expect(Buffer.from(await cc.readRaw(name)).equals(Buffer.from(await ca.readRaw(name)))).toBe(false);
    // Different tensors of one checkpoint are different streams.
    expect(Buffer.from(await ca.readRaw('model.layers.0.mlp.gate_proj.weight')).equals(Buffer.from(await ca.readRaw(name)))).toBe(false);
    await Promise.all([ca, cb, cc].map((x) => x.close()));
  });

  it('writes the MoE layout of the fixture config with the same names and shapes as the hub checkpoint', async () => {
    const dir = await tempDir();
    await writeSyntheticCheckpoint({ config: join(MODELS, 'tiny-random-qwen3-moe'), outDir: dir, seed: 1, dtype: 'bf16' });
    const real = await SafetensorsFile.open(join(MODELS, 'tiny-random-qwen3-moe', 'model.safetensors'));
    const synth = await Checkpoint.open(dir);
    expect(synth.names().sort()).toEqual(real.names().sort());
    for (const n of real.names()) expect(synth.info(n).shape).toEqual(real.info(n).shape);
    const w = resolveWeights(await loadModelConfig(dir), synth);
    expect(w.layers[0].mlp.kind).toBe('moe');
    await Promise.all([real.close(), synth.close()]);
  });

  it('omits lm_head when tied, supports f32, and replaces stale weights of an earlier run', async () => {
    const dir = await tempDir();
    await writeSyntheticCheckpoint({ config: TINY, outDir: dir, shardBytes: 20_000 });
    expect((await readdir(dir)).includes('model.safetensors.index.json')).toBe(true);
    await writeSyntheticCheckpoint({ config: { ...TINY, tie_word_embeddings: true }, outDir: dir, dtype: 'f32' });
    const files = await readdir(dir);
    expect(files.sort()).toEqual(['config.json', 'model.safetensors']);
    const ck = await Checkpoint.open(dir);
    expect(ck.has('lm_head.weight')).toBe(false);
    expect(ck.info('model.norm.weight').dtype).toBe('F32');
    resolveWeights(await loadModelConfig(dir), ck);
    await ck.close();
  });

  it('plans a real-size Qwen3-8B layout (16 GB in 2 GiB shards) without writing it', async () => {
    const spec = parseModelConfig(JSON.parse(await readFile(join(CONFIGS, 'qwen3-8b.json'), 'utf8')));
    const plan = planSyntheticCheckpoint(spec);
    // Parameter count from the architecture: untied embedding + LM head, 36 layers, final norm.
    const [V, H, L, I, D, Q, KV] = [151936, 4096, 36, 12288, 128, 32 * 128, 8 * 128];
    const perLayer = Q * H + 2 * KV * H + H * Q + 2 * D + 2 * H + 3 * I * H;
    const params = 2 * V * H + L * perLayer + H;
    expect(params).toBeGreaterThan(8.18e9);
    expect(params).toBeLessThan(8.2e9);
    expect(plan.totalBytes).toBe(2 * params);
    expect(plan.numTensors).toBe(2 + L * 11 + 1);
    expect(plan.shards.length).toBe(8);
    for (const sh of plan.shards) expect(sh.bytes).toBeLessThanOrEqual(2 * 1024 ** 3);
    expect(plan.shards[7].file).toBe('model-00008-of-00008.safetensors');
    expect(plan.shards.reduce((a, sh) => a + sh.bytes, 0)).toBe(plan.totalBytes);
  });

  it('rejects a bad config with a ConfigError before writing weights', async () => {
    const dir = await tempDir();
    await expect(writeSyntheticCheckpoint({ config: { ...TINY, model_type: 'qwen3_next' }, outDir: dir })).rejects.toBeInstanceOf(ConfigError);
    await expect(writeSyntheticCheckpoint({ config: join(dir, 'nope.json'), outDir: dir })).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await writeFile(join(dir, 'bad.json'), '{');
    await expect(writeSyntheticCheckpoint({ config: join(dir, 'bad.json'), outDir: dir })).rejects.toMatchObject({ code: 'NOT_JSON' });
    expect((await readdir(dir)).filter((f) => f.endsWith('.safetensors'))).toEqual([]);
  });
});
