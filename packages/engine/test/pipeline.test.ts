import { join } from 'node:path';
import { createCpuBackend } from '@nerva/cpu-backend';
import type { DeviceBackend } from '@nerva/core';
import { afterAll, describe, expect, it } from 'vitest';
import { Engine, type EngineOptions, PipelineConfigError } from '../src/index.js';
import { DEFAULT_MODEL, fixtureModels, MODELS } from './fixtures.js';
import { passes, recordingBackend } from './recording-backend.js';

// 12 prompt ids: the prefill pass takes the unfused path (more than 8 rows), decode the fused ops
// or the whole-stack op, so a stage boundary is crossed on both paths.
const PROMPT = [1, 5, 9, 14, 3, 27, 8, 2, 11, 6, 19, 4];
const SHAPE = { backend: 'cpu' as const, maxNumSeqs: 4, maxNumBatchedTokens: 16, kvCacheBytes: 2 ** 20 };

async function greedy(e: Engine, n = 12): Promise<number[]> {
  return (await e.submit(PROMPT, { temperature: 0, maxTokens: n, ignoreEos: true }).done).tokenIds;
}

async function withEngine<T>(o: Partial<EngineOptions> & { model: string }, fn: (e: Engine) => Promise<T>): Promise<T> {
  const e = await Engine.create({ ...SHAPE, ...o });
  try {
    return await fn(e);
  } finally {
    e.dispose();
  }
}

const models = [DEFAULT_MODEL, ...fixtureModels().map((m) => join(MODELS, m))];
const layersOf = async (model: string) => withEngine({ model }, async (e) => e.spec.numLayers);

/** Raw logits at the last prompt position and before each of 4 greedy tokens (host sampling). */
async function logits(e: Engine): Promise<Float32Array[]> {
  const o = await e.submit(PROMPT, { temperature: 0, maxTokens: 4, ignoreEos: true, returnPromptLogits: true, returnStepLogits: true }).done;
  return [o.promptLogits!, ...o.stepLogits!];
}

describe.each(models)('a CPU pipeline gives one stage\'s greedy tokens: %s', (model) => {
  const one: Promise<number[]> = withEngine({ model }, (e) => greedy(e));
  const oneLogits: Promise<Float32Array[]> = withEngine({ model }, logits);

  it.each([2, 3])('%i stages', async (n) => {
    const layers = await layersOf(model);
    if (n > layers) {
      // A stage needs a layer: the 2-layer fixtures cannot run 3 stages, and say so.
      await expect(Engine.create({ model, ...SHAPE, pipelineParallel: n })).rejects.toThrow(PipelineConfigError);
      await expect(Engine.create({ model, ...SHAPE, pipelineParallel: n })).rejects.toThrow(`pipelineParallel ${n} exceeds the model's ${layers} decoder layers`);
      return;
    }
    await withEngine({ model, pipelineParallel: n }, async (e) => {
      const out = await e.submit(PROMPT, { temperature: 0, maxTokens: 12, ignoreEos: true }).done;
      expect(out.tokenIds).toEqual(await one);
      const d = e.pipelineDescription()!;
      expect(d.stages).toHaveLength(n);
      expect(d.stages[0].firstLayer).toBe(0);
      expect(d.stages.at(-1)!.endLayer).toBe(layers);
      for (let s = 1; s < n; s++) expect(d.stages[s].firstLayer).toBe(d.stages[s - 1].endLayer);
      expect(d.links).toEqual(new Array(n - 1).fill('in-process'));
      expect(d).toMatchObject({ shared: true, microBatches: 1, capturable: true });
      // The whole pipeline is one captured decode graph, as one stage is.
      const s = out.ledger.summary();
      expect(s.graph_replays_per_decode_token).toBe(1);
      expect(s.hot_path_allocations).toBe(0);
      expect(s.notes.some((x) => x.startsWith(`pipeline: ${n} stages`))).toBe(true);
      // Same kernels in the same order: the logits are bit for bit those of one stage.
      expect(await logits(e)).toEqual(await oneLogits);
    });
  });
});

/** Four concurrent requests: greedy and seeded sampling, one with a penalty (host sampling). */
async function batch(e: Engine): Promise<number[][]> {
  const reqs = [
    { prompt: PROMPT, temperature: 0 },
    { prompt: PROMPT.slice(0, 5), temperature: 0.9, topK: 20, seed: 7 },
    { prompt: [3, 1, 4, 1, 5, 9, 2, 6, 5, 3], temperature: 0.7, seed: 11 },
    { prompt: [2, 7, 1, 8], temperature: 0, repetitionPenalty: 1.3 },
  ];
  const outs = await Promise.all(reqs.map(({ prompt, ...p }) => e.submit(prompt, { ...p, maxTokens: 10, ignoreEos: true }).done));
  return outs.map((o) => o.tokenIds);
}

describe('pipelines with micro-batches and a backend per stage', () => {
  const moe = join(MODELS, 'tiny-random-qwen3-moe');
  const cases: [string, Partial<EngineOptions>][] = [
    ['shared backend, 2 micro-batches', { pipelineParallel: 2, pipelineMicroBatches: 2 }],
    ['a CPU backend per stage (host links), 2 micro-batches by default', { stageDevices: [0, 1] }],
    ['3 CPU backends, 3 micro-batches', { stageDevices: [0, 1, 2], pipelineMicroBatches: 3 }],
    ['stages 0 and 1 on one backend, 2 on another', { stageDevices: [0, 0, 1] }],
  ];
  const want = new Map<string, Promise<number[][]>>();
  const reference = (model: string) => {
    if (!want.has(model)) want.set(model, withEngine({ model }, batch));
    return want.get(model)!;
  };
  const alone = withEngine({ model: DEFAULT_MODEL }, (e) => greedy(e));

  it.each(cases)('%s: the same tokens as one stage, alone and batched', async (_name, extra) => {
    await withEngine({ model: DEFAULT_MODEL, ...extra }, async (e) => {
      expect(await batch(e)).toEqual(await reference(DEFAULT_MODEL));
      expect(await greedy(e)).toEqual(await alone);
      const d = e.pipelineDescription()!;
      expect(d.capturable).toBe(false);
      if (extra.stageDevices) {
        expect(d.shared).toBe(false);
        expect(d.stages.map((s) => s.device)).toEqual(extra.stageDevices);
        expect(d.microBatches).toBe(extra.pipelineMicroBatches ?? extra.stageDevices.length);
      }
    });
  });

  it('a MoE model on a CPU backend per stage (fused decode ops across the boundary)', async () => {
    const want = await withEngine({ model: moe }, logits);
    await withEngine({ model: moe, stageDevices: [0, 1] }, async (e) => {
      expect(await batch(e)).toEqual(await reference(moe));
      // The logits come home to stage 0 over the logits link, bit for bit.
      expect(await logits(e)).toEqual(want);
    });
  });

  it('ledgers of a multi-backend pipeline count every backend: the handoffs move bytes, nothing is captured', async () => {
    await withEngine({ model: DEFAULT_MODEL, stageDevices: [0, 1] }, async (e) => {
      const out = await e.submit(PROMPT, { temperature: 0, maxTokens: 6, ignoreEos: true }).done;
      const s = out.ledger.summary();
      expect(s.graph_replays_per_decode_token).toBe(0);
      expect(s.hot_path_allocations).toBe(0);
      // Each decode token's step read hidden rows off stage 0's backend (d2h) and wrote them into stage 1's (h2d).
      const decode = out.ledger.all().filter((r) => r.phase === 'decode');
      expect(decode.length).toBeGreaterThan(0);
      for (const r of decode) {
        expect(r.d2hBytes).toBeGreaterThanOrEqual(e.spec.hiddenSize * 4);
        expect(r.launches).toBeGreaterThan(0);
      }
    });
  });

  it('eager stages put each stage\'s device time and each handoff\'s in the ledger', async () => {
    await withEngine({ model: DEFAULT_MODEL, stageDevices: [0, 1, 2], pipelineMicroBatches: 2 }, async (e) => {
      const out = await e.submit(PROMPT, { temperature: 0, maxTokens: 6, ignoreEos: true }).done;
      for (const r of out.ledger.all()) {
        expect(r.stageMs).toHaveLength(3);
        expect(r.linkMs).toHaveLength(2);
        // Every stage ran layers (CPU events time the ops themselves); the handoffs took time too.
        for (const ms of r.stageMs!) expect(ms).toBeGreaterThan(0);
        for (const ms of r.linkMs!) expect(ms).toBeGreaterThanOrEqual(0);
        // Stage and handoff times are parts of the step: none exceeds the token's wall time.
        expect(r.stageMs!.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(r.wallMs);
      }
      const s = out.ledger.summary();
      expect(s.stage_ms_total).toHaveLength(3);
      expect(s.link_ms_total).toHaveLength(2);
      expect(s.stage_ms_total!.every((x) => x > 0)).toBe(true);
    });
    // A captured pipeline runs as one graph: no per-stage split is measured, none is reported.
    await withEngine({ model: DEFAULT_MODEL, pipelineParallel: 2 }, async (e) => {
      const out = await e.submit(PROMPT, { temperature: 0, maxTokens: 6, ignoreEos: true }).done;
      expect(out.ledger.summary().stage_ms_total).toBeUndefined();
    });
  });
});

describe('the single-stage path is unchanged', () => {
  it('pipelineParallel 1 issues the same ops and keeps the same ledger as no option', async () => {
    const run = async (extra: Partial<EngineOptions>) => {
      const { backend, calls } = recordingBackend();
      const e = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE, backend, ...extra });
      try {
        const out = await e.submit(PROMPT, { temperature: 0, maxTokens: 8, ignoreEos: true }).done;
        expect(e.pipelineDescription()).toBeUndefined();
        const s = out.ledger.summary();
        return { tokens: out.tokenIds, ops: calls.map((c) => `${c.op}:${c.rows}`), graphs: e.graphNodes(), s };
      } finally {
        e.dispose();
        backend.dispose();
      }
    };
    const plain = await run({});
    const one = await run({ pipelineParallel: 1 });
    expect(one.tokens).toEqual(plain.tokens);
    expect(one.ops).toEqual(plain.ops);
    expect(one.graphs).toEqual(plain.graphs);
    for (const k of ['graph_replays', 'graph_replays_per_decode_token', 'launches', 'syncs', 'syncs_per_decode_token', 'allocator_calls', 'hot_path_allocations', 'notes'] as const) expect(one.s[k]).toEqual(plain.s[k]);
    expect(one.s.graph_replays_per_decode_token).toBe(1);
  });

  it('two stages on one backend add only the stage boundary: no extra kernel in a decode pass', async () => {
    // Decode passes: per stage a decoder_layers op over its layers; the final norm and LM head once.
    const { backend, calls } = recordingBackend();
    const e = await Engine.create({ model: DEFAULT_MODEL, ...SHAPE, backend, pipelineParallel: 2, useGraphs: false });
    try {
      await e.submit(PROMPT, { temperature: 0, maxTokens: 4, ignoreEos: true }).done;
    } finally {
      e.dispose();
      backend.dispose();
    }
    const decode = passes(calls).slice(1);
    expect(decode.length).toBe(3);
    // (No gather_rows: a decode pass samples every row in order, so the LM head, with the final
    // norm folded in, reads them as they are.)
    // The first stage's stack op takes the embedding (capabilities.opFields decoder_layers: embed), the second's not.
    for (const p of decode) {
      expect(p.map((c) => c.op)).toEqual(['decoder_layers', 'decoder_layers', 'fused_matmul', 'sample', 'ring_push']);
      expect(p[0].args.embed).toBeDefined();
      expect(p[1].args.embed).toBeUndefined();
    }
  });
});

/** The CPU backend dressed as a CUDA backend with `count` GPUs: the engine's device checks apply. */
function fakeGpu(count: number): DeviceBackend {
  const inner = createCpuBackend();
  const capabilities = Object.freeze({ ...inner.capabilities, deviceKind: 'cuda', deviceCount: count });
  return new Proxy(inner, {
    get(target, prop, receiver) {
      if (prop === 'capabilities') return capabilities;
      const v = Reflect.get(target, prop, receiver) as unknown;
      return typeof v === 'function' ? (v as (...x: unknown[]) => unknown).bind(target) : v;
    },
  }) as DeviceBackend;
}

describe('pipeline options are checked', () => {
  const fakes: DeviceBackend[] = [];
  afterAll(() => fakes.forEach((b) => b.dispose()));
  const gpu = (n: number) => {
    const b = fakeGpu(n);
    fakes.push(b);
    return b;
  };

  it('pipelineParallel must be a positive integer', async () => {
    for (const bad of [0, -1, 1.5, Number.NaN, '2' as unknown as number]) {
      await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, pipelineParallel: bad })).rejects.toThrow(/pipelineParallel must be a positive integer/);
    }
    // Checked before the model loads: a bad count is named even for a missing folder.
    await expect(Engine.create({ model: '/nonexistent', pipelineParallel: 0 })).rejects.toThrow(PipelineConfigError);
  });

  it('N may not exceed the model\'s layers', async () => {
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, pipelineParallel: 7 })).rejects.toThrow("pipelineParallel 7 exceeds the model's 6 decoder layers: every stage needs at least one layer");
  });

  it('a host budget (paged weights) with more than one stage is refused; VRAM budgets are pipeline-budgets.test.ts\'s', async () => {
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, pipelineParallel: 2, hostBudget: 2 ** 30 })).rejects.toThrow(/with a host budget is not supported yet/);
  });

  it('N > visible GPUs is an error unless stages may share one GPU', async () => {
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, backend: gpu(1), pipelineParallel: 2 })).rejects.toThrow(
      'pipelineParallel 2 needs 2 GPUs, but 1 is visible; --allow-single-device-stages (allowSingleDeviceStages) places every stage on one GPU, to test the pipeline',
    );
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, backend: gpu(2), pipelineParallel: 3 })).rejects.toThrow(/needs 3 GPUs, but 2 are visible/);
    const want = await withEngine({ model: DEFAULT_MODEL, backend: gpu(1) }, (e) => greedy(e));
    await withEngine({ model: DEFAULT_MODEL, backend: gpu(1), pipelineParallel: 2, allowSingleDeviceStages: true }, async (e) => {
      // On a GPU the stages of one device pass hidden states by device-to-device copies.
      expect(e.pipelineDescription()).toMatchObject({ links: ['device-copy'], shared: true, capturable: true });
      expect(e.notes.some((n) => n.includes('stages share one GPU'))).toBe(true);
      expect(await greedy(e)).toEqual(want);
    });
  });

  it('stageDevices must fit the machine and the stage count', async () => {
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, backend: gpu(1), stageDevices: [0, 1] })).rejects.toThrow('stageDevices names device 1, but 1 cuda device(s) are visible');
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, backend: gpu(2), stageDevices: [1, 1] })).rejects.toThrow(/two stages on device 1; stages that share a device need allowSingleDeviceStages/);
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, pipelineParallel: 3, stageDevices: [0, 1] })).rejects.toThrow('stageDevices lists 2 device(s) for pipelineParallel 3');
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, stageDevices: [0, -1] })).rejects.toThrow(/stageDevices must list one device ordinal/);
    await expect(Engine.create({ model: DEFAULT_MODEL, ...SHAPE, pipelineParallel: 2, pipelineMicroBatches: 0 })).rejects.toThrow(/pipelineMicroBatches must be a positive integer/);
  });

  it('the CPU backend takes any N up to the layer count: stages share its host memory', async () => {
    await withEngine({ model: DEFAULT_MODEL, pipelineParallel: 6 }, async (e) => {
      expect(e.pipelineDescription()!.stages.map((s) => s.endLayer - s.firstLayer)).toEqual([1, 1, 1, 1, 1, 1]);
      expect(e.notes).toContain('pipeline on the CPU backend: 6 stages share one backend and its host memory (in-process links)');
    });
  });
});
