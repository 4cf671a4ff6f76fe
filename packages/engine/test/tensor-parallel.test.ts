import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { NervaError } from '@nerva/core';
import type { DeviceBackend } from '@nerva/core';
import { createCpuBackend } from '@nerva/cpu-backend';
import { convertToGguf, writeSyntheticCheckpoint } from '@nerva/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, type EngineOptions, shardGeometry, splitRange, TensorParallelConfigError } from '../src/index.js';
import { DEFAULT_MODEL, fixtureModels, localFixtureModels, LOCAL_MODELS, MODELS } from './fixtures.js';

/**
 * Tensor parallelism on the CPU backend, a CPU backend per shard standing in for a GPU each:
 * greedy tokens and raw logits equal the one-backend run bit for bit (toEqual on Float32Arrays),
 * alone and for a batch of concurrent requests, on every fixture the split applies to.
 */

// 12 prompt ids: the prefill pass takes the per-layer ops (more than 8 rows), decode the fused ops.
const PROMPT = [1, 5, 9, 14, 3, 27, 8, 2, 11, 6, 19, 4];
const SHAPE = { backend: 'cpu' as const, maxNumSeqs: 4, maxNumBatchedTokens: 16, kvCacheBytes: 2 ** 20 };

async function withEngine<T>(o: Partial<EngineOptions> & { model: string }, fn: (e: Engine) => Promise<T>): Promise<T> {
  const e = await Engine.create({ ...SHAPE, ...o });
  try {
    return await fn(e);
  } finally {
    e.dispose();
  }
}

interface Run {
  tokens: number[];
  /** Logits at the last prompt position, then before each greedy token (host sampling). */
  logits: Float32Array[];
  /** Three concurrent requests: greedy, seeded sampling, a repetition penalty. */
  batch: number[][];
  /** The same prompt sampled on the device (no logits asked for). */
  deviceTokens: number[];
}

async function run(e: Engine): Promise<Run> {
  const o = await e.submit(PROMPT, { temperature: 0, maxTokens: 6, ignoreEos: true, returnPromptLogits: true, returnStepLogits: true }).done;
  const device = await e.submit(PROMPT, { temperature: 0, maxTokens: 10, ignoreEos: true }).done;
  const reqs = [
    { prompt: PROMPT, temperature: 0 },
    { prompt: PROMPT.slice(0, 5), temperature: 0.9, topK: 20, seed: 7 },
    { prompt: [2, 7, 1, 8], temperature: 0, repetitionPenalty: 1.3 },
  ];
  const outs = await Promise.all(reqs.map(({ prompt, ...p }) => e.submit(prompt, { ...p, maxTokens: 8, ignoreEos: true }).done));
  return { tokens: o.tokenIds, logits: [o.promptLogits!, ...o.stepLogits!], batch: outs.map((x) => x.tokenIds), deviceTokens: device.tokenIds };
}

let synthetic: string;
beforeAll(async () => {
  // Four KV heads (MHA) so a 4-way split exists; qk-norm as in Qwen3; widths that do not divide by 4 or 3.
  synthetic = await mkdtemp(join(tmpdir(), 'nerva-tp-'));
  await writeSyntheticCheckpoint({
    outDir: synthetic,
    dtype: 'f32',
    seed: 3,
    config: {
      architectures: ['Qwen3ForCausalLM'],
      model_type: 'qwen3',
      hidden_size: 64,
      intermediate_size: 90,
      num_hidden_layers: 2,
      num_attention_heads: 8,
      num_key_value_heads: 4,
      head_dim: 16,
      vocab_size: 301,
      max_position_embeddings: 256,
      rms_norm_eps: 1e-6,
      rope_theta: 10000,
      tie_word_embeddings: false,
      torch_dtype: 'float32',
    },
  });
});
afterAll(async () => {
  if (synthetic) await rm(synthetic, { recursive: true, force: true });
});

// The sliding-window fixtures made in this repository too (a window per layer, masked per shard alike).
const models = [DEFAULT_MODEL, ...fixtureModels().map((m) => join(MODELS, m)), ...localFixtureModels().map((m) => join(LOCAL_MODELS, m))];

describe.each([...models, 'synthetic (8 q / 4 KV heads)'])('tensor parallel on CPU backends equals one backend bit for bit: %s', (name) => {
  const model = () => (name.startsWith('synthetic') ? synthetic : name);
  let one: Promise<{ run: Run; kv: number; moe: boolean }> | undefined;
  const reference = () => (one ??= withEngine({ model: model() }, async (e) => ({ run: await run(e), kv: e.spec.numKvHeads, moe: e.spec.moe !== undefined })));

  it.each([
    [2, 1],
    [4, 1],
    [2, 2],
  ])('%i shards x %i pipeline stages', async (n, stages) => {
    const want = await reference();
    if (want.moe || want.kv % n !== 0) {
      // The split is refused with the reason, before any shard is made.
      const err = await Engine.create({ model: model(), ...SHAPE, tensorParallel: n }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(TensorParallelConfigError);
      expect((err as NervaError).code).toBe('TENSOR_PARALLEL_CONFIG');
      expect((err as Error).message).toMatch(want.moe ? /sparse \(MoE\) layers/ : new RegExp(`tensorParallel ${n} does not divide the model's ${want.kv} KV head`));
      return;
    }
    await withEngine({ model: model(), tensorParallel: n, ...(stages > 1 ? { pipelineParallel: stages } : {}) }, async (e) => {
      const got = await run(e);
      expect(got.tokens).toEqual(want.run.tokens);
      expect(got.logits).toEqual(want.run.logits);
      expect(got.batch).toEqual(want.run.batch);
      expect(got.deviceTokens).toEqual(want.run.deviceTokens);
      const d = e.tensorParallelDescription()!;
      expect(d.stages).toBe(stages);
      expect(d.shards).toHaveLength(n * stages);
      // Stage-major: the stages' layers tile the model, every stage split into the same n slices.
      expect(d.shards[0].layers[0]).toBe(0);
      expect(d.shards.at(-1)!.layers[1]).toBe(e.spec.numLayers);
      for (let i = n; i < d.shards.length; i++) expect(d.shards[i].kvHeads).toEqual(d.shards[i - n].kvHeads);
      expect(d.shared).toBe(false);
      // Shards on CPU backends of their own exchange slices through host links.
      expect(d.links).toEqual(['in-process']);
      // Each shard holds its KV heads only: the KV bytes split evenly, the weights nearly so.
      const kv = d.shards.map((s) => s.kvBytes / (s.layers[1] - s.layers[0]));
      expect(new Set(kv).size).toBe(1);
      expect(d.shards.slice(0, n).map((s) => s.kvHeads)).toEqual(Array.from({ length: n }, (_, k) => [(k * want.kv) / n, ((k + 1) * want.kv) / n]));
      expect(d.shards.at(-1)!.vocab[1]).toBe(e.spec.vocabSize);
      expect(e.pipelineDescription()).toBeUndefined();
      // The memory report lists every shard's residency (the per-GPU view of /v1/memory).
      expect(e.memoryReport().devices!.map((x) => [x.weightBytes, x.kvBytes])).toEqual(d.shards.map((x) => [x.weightBytes, x.kvBytes]));
      expect(e.memoryReport().devices!.reduce((t, x) => t + x.kvBytes, 0)).toBe(kv[0] * n * e.spec.numLayers);
      const s = (await e.submit(PROMPT, { temperature: 0, maxTokens: 3, ignoreEos: true }).done).ledger.summary();
      expect(s.notes.some((x) => x.startsWith(`tensor parallel: ${n} shards`) && x.includes(stages > 1 ? `in each of ${stages} pipeline stages` : 'a CPU backend per shard'))).toBe(true);
      expect(s.hot_path_allocations).toBe(0);
    });
  });
});

describe.each([
  ['matmul precision bf16 (prefill matmuls round their inputs to bf16)', { matmulPrecision: 'bf16' as const }],
  ['bf16 numerics (bf16 weights, norms and KV)', { numerics: 'bf16' as const }],
])('tensor parallel under %s equals one backend bit for bit', (_name, extra) => {
  const model = join(MODELS, 'tiny-random-qwen3');
  it('2 shards', async () => {
    const want = await withEngine({ model, ...extra }, run);
    await withEngine({ model, ...extra, tensorParallel: 2 }, async (e) => expect(await run(e)).toEqual(want));
  });
});

describe('tensor parallel with every shard on one backend (allowSingleDeviceStages)', () => {
  it('2 shards on the engine\'s backend, linked by copies on it: the same tokens and logits', async () => {
    const model = join(MODELS, 'tiny-random-llama');
    const want = await withEngine({ model }, run);
    await withEngine({ model, tensorParallel: 2, allowSingleDeviceStages: true }, async (e) => {
      expect(await run(e)).toEqual(want);
      const d = e.tensorParallelDescription()!;
      expect(d).toMatchObject({ shared: true, links: ['in-process'] });
      expect(d.shards.every((s) => s.device === undefined)).toBe(true);
    });
  });
});

describe('tensor parallel inside 3 pipeline stages', () => {
  it.each([
    ['a CPU backend per shard of each stage', {}],
    ['every shard of every stage on one backend', { allowSingleDeviceStages: true }],
  ])('2 shards x 3 stages, %s: the tokens and logits of one backend', async (_name, extra) => {
    const want = await withEngine({ model: DEFAULT_MODEL }, run);
    await withEngine({ model: DEFAULT_MODEL, tensorParallel: 2, pipelineParallel: 3, ...extra }, async (e) => {
      expect(await run(e)).toEqual(want);
      const d = e.tensorParallelDescription()!;
      expect(d.shards.map((s) => [s.stage, ...s.layers])).toEqual([
        [0, 0, 2],
        [0, 0, 2],
        [1, 2, 4],
        [1, 2, 4],
        [2, 4, 6],
        [2, 4, 6],
      ]);
      expect(d.shared).toBe('allowSingleDeviceStages' in extra);
    });
  });
});

describe('tensor parallel with shared-prefix forks', () => {
  it('forks copy each shard\'s KV slice of the shared page: the tokens of one backend', async () => {
    const model = join(MODELS, 'tiny-random-qwen3');
    const forks = (e: Engine) => Promise.all(e.submitFork(PROMPT.slice(0, 10), 3, { temperature: 0.8, seed: 5, maxTokens: 6, ignoreEos: true }).map((h) => h.done.then((o) => o.tokenIds)));
    const want = await withEngine({ model, blockSize: 4 }, forks);
    await withEngine({ model, blockSize: 4, tensorParallel: 2 }, async (e) => expect(await forks(e)).toEqual(want));
  });
});

describe('tensor-parallel options and models it cannot split', () => {
  const model = DEFAULT_MODEL;
  it.each([0, -1, 1.5, Number.NaN])('tensorParallel %s is refused before anything loads', async (n) => {
    const err = await Engine.create({ model, ...SHAPE, tensorParallel: n }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TensorParallelConfigError);
    expect((err as Error).message).toMatch(/tensorParallel must be a positive integer/);
  });

  it('refuses the combinations it does not support yet, naming them', async () => {
    await expect(Engine.create({ model, ...SHAPE, tensorParallel: 2, stageDevices: [0, 1] })).rejects.toThrow(/tensorParallel 2 with stageDevices is not supported yet/);
    await expect(Engine.create({ model, ...SHAPE, tensorParallel: 2, pipelineParallel: 2, pipelineMicroBatches: 2 })).rejects.toThrow(/with pipelineMicroBatches 2 is not supported yet/);
    await expect(Engine.create({ model, ...SHAPE, tensorParallel: 2, pipelineParallel: 7 })).rejects.toThrow(/pipelineParallel 7 exceeds the model's 6 decoder layers/);
    await expect(Engine.create({ model, ...SHAPE, tensorParallel: 2, hostBudget: 2 ** 30 })).rejects.toThrow(/with a host budget is not supported yet/);
  });

  it('embeddings are refused on a group with a coded error (not implemented there)', async () => {
    await withEngine({ model, tensorParallel: 2 }, async (e) => {
      await expect(e.embed([[1, 2, 3]])).rejects.toMatchObject({ code: 'UNSUPPORTED' });
    });
  });

  // GGUF files at a block type each, and Q4_K_M's mix (a Q6_K v beside Q4_K q and k in some layers:
  // the shard holds its v rows apart, as one device does): the shards' rows are whole blocks.
  it.each(['Q8_0', 'Q4_0', 'Q4_K_M'] as const)('a %s GGUF checkpoint splits into whole blocks: the one-backend run bit for bit', async (type) => {
    const source = join(MODELS, 'tiny-shakespeare-qwen3');
    const gguf = join(synthetic, `model-${type}.gguf`);
    await convertToGguf({ source, out: gguf, type });
    const want = await withEngine({ model: gguf }, run);
    for (const o of [{ tensorParallel: 2 }, { tensorParallel: 2, pipelineParallel: 2 }]) {
      await withEngine({ model: gguf, ...o }, async (e) => {
        expect(await run(e), JSON.stringify(o)).toEqual(want);
        // The shards keep the blocks: the run is labelled as quantized, exact only to its dequantized weights.
        expect(e.memoryReport().weights.format!.exact).toBe(false);
        expect(Object.keys(e.memoryReport().weights.format!.storedBytes).some((d) => d.startsWith('q'))).toBe(true);
      });
    }
  });

  it('on a GPU backend, more shards than visible GPUs is refused unless every shard may share one', async () => {
    // A CPU backend that says it is one CUDA device: the check runs before any shard is made.
    const cpu = createCpuBackend();
    const oneGpu = new Proxy(cpu, {
      get(t, p) {
        if (p === 'capabilities') return { ...t.capabilities, deviceKind: 'cuda', deviceCount: 1 };
        const v = Reflect.get(t, p) as unknown;
        return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
      },
    }) as DeviceBackend;
    try {
      const live = cpu.stats().liveBuffers;
      await expect(Engine.create({ model, ...SHAPE, backend: oneGpu, tensorParallel: 2 })).rejects.toThrow(
        'tensorParallel 2 needs 2 GPUs, but 1 is visible; --allow-single-device-stages places every shard on one GPU',
      );
      expect(cpu.stats().liveBuffers).toBe(live);
    } finally {
      cpu.dispose();
    }
  });

  it('tensorParallel 1 is one backend', async () => {
    await withEngine({ model, tensorParallel: 1 }, async (e) => {
      expect(e.tensorParallelDescription()).toBeUndefined();
    });
  });

  it('refuses a MoE model and heads that do not split, with the shard count and the heads', () => {
    const spec = { hiddenSize: 64, intermediateSize: 90, numHeads: 8, numKvHeads: 4, vocabSize: 301, headDim: 16 } as Parameters<typeof shardGeometry>[0];
    expect(() => shardGeometry(spec, 3)).toThrow(/tensorParallel 3 does not divide the model's 4 KV head/);
    expect(() => shardGeometry({ ...spec, moe: {} } as typeof spec, 2)).toThrow(/sparse \(MoE\) layers/);
    expect(() => shardGeometry(spec, 0)).toThrow(TensorParallelConfigError);
    expect(() => shardGeometry({ ...spec, numKvHeads: 8, intermediateSize: 4 }, 8)).toThrow(/exceeds the model's hidden \(64\) or intermediate \(4\) size/);
  });

  it('slices tile every dimension in shard order, uneven widths included', () => {
    const g = shardGeometry({ hiddenSize: 64, intermediateSize: 90, numHeads: 8, numKvHeads: 4, vocabSize: 301, headDim: 16 } as Parameters<typeof shardGeometry>[0], 4);
    expect(g.map((x) => x.inter)).toEqual([splitRange(90, 4, 0), splitRange(90, 4, 1), splitRange(90, 4, 2), splitRange(90, 4, 3)]);
    expect(g.map((x) => x.inter.width)).toEqual([22, 23, 22, 23]);
    expect(g.map((x) => x.vocab.offset + x.vocab.width)).toEqual([75, 150, 225, 301]);
    expect(g.map((x) => [x.qHeadOffset, x.qHeads, x.kvHeadOffset, x.kvHeads])).toEqual([
      [0, 2, 0, 1],
      [2, 2, 1, 1],
      [4, 2, 2, 1],
      [6, 2, 3, 1],
    ]);
  });
});
