// Pipeline stages under VRAM budgets: a model larger than one budget runs resident across stages,
// placed so each stage's weights, activations and KV share fit its own budget, with the tokens of
// one stage. On the CPU backend the budgets are its memory capability (the planner enforces them).
import { describe, expect, it } from 'vitest';
import { Engine, type EngineOptions, PipelineConfigError, TensorParallelConfigError } from '../src/index.js';
import { DEFAULT_MODEL } from './fixtures.js';

const PROMPT = [1, 5, 9, 14, 3, 27, 8, 2, 11, 6, 19, 4];
const SHAPE = { backend: 'cpu' as const, model: DEFAULT_MODEL, maxNumSeqs: 4, maxNumBatchedTokens: 16 };
const MiB = 2 ** 20;

async function withEngine<T>(o: Partial<EngineOptions>, fn: (e: Engine) => Promise<T>): Promise<T> {
  const e = await Engine.create({ ...SHAPE, ...o });
  try {
    return await fn(e);
  } finally {
    e.dispose();
  }
}

const greedy = async (e: Engine) => (await e.submit(PROMPT, { temperature: 0, maxTokens: 12, ignoreEos: true }).done).tokenIds;

// The embedded model: 6 layers of ~4 MiB (f32 on the CPU) and a 4 MiB tied embedding, ~26.5 MiB.
const whole = withEngine({}, async (e) => ({ tokens: await greedy(e), weightBytes: e.memoryReport().weights.totalBytes }));

describe('pipeline stages under VRAM budgets', () => {
  it('a model larger than one budget runs resident over two stages, with the tokens of one stage', async () => {
    const { tokens, weightBytes } = await whole;
    // Each budget holds well over half the model, none holds all of it.
    const budget = Math.round(weightBytes * 0.7);
    expect(budget).toBeLessThan(weightBytes);
    // One stage under that budget pages its weights (the memory OS streams what does not fit) ...
    await withEngine({ vramBudget: budget }, async (e) => {
      expect(e.memoryReport().mode).toBe('paged');
      expect(e.memoryReport().deployment?.mode).toBe('paged');
      expect(await greedy(e)).toEqual(tokens);
    });
    // ... two stages under the same budget each hold their half resident.
    await withEngine({ pipelineParallel: 2, vramBudget: budget }, async (e) => {
      expect(await greedy(e)).toEqual(tokens);
      const r = e.memoryReport();
      expect(r.mode).toBe('resident');
      expect(r.deployment?.mode).toBe('resident');
      expect(r.devices).toHaveLength(2);
      for (const d of r.devices!) {
        expect(d.budgetBytes).toBe(budget);
        expect(d.weightBytes + d.kvBytes).toBeLessThanOrEqual(budget);
        expect(d.kvBytes).toBeGreaterThan(0);
      }
      expect(r.devices!.map((d) => d.layers)).toEqual([
        [0, 3],
        [3, 6],
      ]);
      expect(e.notes.some((n) => n.startsWith('pipeline under VRAM budgets, all resident: stage 0 '))).toBe(true);
    });
  });

  it('a stage with a smaller budget takes fewer layers (stageVramBudgets), on a CPU backend per stage', async () => {
    const { tokens, weightBytes } = await whole;
    const small = Math.round(weightBytes * 0.45);
    const large = Math.round(weightBytes * 0.9);
    await withEngine({ stageDevices: [0, 1], stageVramBudgets: [small, large] }, async (e) => {
      expect(await greedy(e)).toEqual(tokens);
      const d = e.pipelineDescription()!;
      const layers = d.stages.map((s) => s.endLayer - s.firstLayer);
      expect(layers[0]).toBeLessThan(layers[1]);
      const r = e.memoryReport();
      expect(r.devices!.map((x) => x.budgetBytes)).toEqual([small, large]);
      // A stage alone on its backend reports that backend's weights: they fit its budget.
      for (const x of r.devices!) expect(x.weightBytes + x.kvBytes).toBeLessThanOrEqual(x.budgetBytes!);
    });
  });

  it('refuses budgets the model cannot fit, naming the stage and its bytes', async () => {
    const { weightBytes } = await whole;
    const tight = Math.round(weightBytes * 0.3);
    const err = await Engine.create({ ...SHAPE, pipelineParallel: 2, vramBudget: tight }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PipelineConfigError);
    expect((err as Error).message).toMatch(/the model does not fit 2 stages under VRAM budgets of [\d.]+ MiB, [\d.]+ MiB: stage \d \(layers \d-\d\) needs [\d.]+ MiB \(weights/);
    expect((err as Error).message).toContain('give more stages or larger budgets, or run one stage under vramBudget');
    // Three stages under the same budget each carry less: still too little for 6 layers of ~4 MiB.
    await expect(Engine.create({ ...SHAPE, pipelineParallel: 3, vramBudget: Math.round(weightBytes * 0.2) })).rejects.toThrow(/does not fit 3 stages/);
    // A budget below a stage's fixed buffers is named as such.
    await expect(Engine.create({ ...SHAPE, pipelineParallel: 2, vramBudget: 4096 })).rejects.toThrow(/stage 0's VRAM budget \(0.0 MiB\) does not cover its fixed buffers/);
  });

  it('a KV cache size given by the user must fit the budgets (it is not shrunk)', async () => {
    const { tokens, weightBytes } = await whole;
    const budget = Math.round(weightBytes * 0.7);
    await expect(Engine.create({ ...SHAPE, pipelineParallel: 2, vramBudget: budget, kvCacheBytes: 64 * MiB })).rejects.toThrow(
      /kvCacheBytes 64.0 MiB does not fit the VRAM budgets: stage \d would hold 32.0 MiB of it .* at most [\d.]+ MiB fits/,
    );
    await withEngine({ pipelineParallel: 2, vramBudget: budget, kvCacheBytes: MiB }, async (e) => {
      expect(e.memoryReport().devices!.reduce((t, d) => t + d.kvBytes, 0)).toBeLessThanOrEqual(MiB);
      expect(await greedy(e)).toEqual(tokens);
    });
  });

  it('checks budget options before anything loads', async () => {
    const cases: [Partial<EngineOptions>, RegExp][] = [
      [{ pipelineParallel: 2, stageVramBudgets: [MiB] }, /stageVramBudgets lists 1 budget\(s\) for 2 pipeline stage\(s\): give one per stage/],
      [{ stageVramBudgets: [MiB, MiB] }, /stageVramBudgets lists 2 budget\(s\) for 1 pipeline stage\(s\): give one per stage \(and pipelineParallel for more than one stage\)/],
      [{ pipelineParallel: 2, stageVramBudgets: [MiB, 0] }, /stageVramBudgets must list one budget \(a positive byte count\) per stage, got \[1048576,0\]/],
      [{ pipelineParallel: 2, stageVramBudgets: [MiB, 1.5] }, /stageVramBudgets must list one budget/],
      [{ pipelineParallel: 2, stageVramBudgets: [MiB, MiB], vramBudget: MiB }, /give vramBudget \(the same budget for every stage\) or stageVramBudgets \(one per stage\), not both/],
      [{ pipelineParallel: 2, hostBudget: MiB }, /pipelineParallel 2 with a host budget is not supported yet/],
    ];
    for (const [o, why] of cases) {
      // A missing folder: the options are refused before the checkpoint is opened.
      const err = await Engine.create({ ...SHAPE, ...o, model: '/nonexistent' }).catch((e: unknown) => e);
      expect(err, JSON.stringify(o)).toBeInstanceOf(PipelineConfigError);
      expect((err as Error).message).toMatch(why);
    }
    await expect(Engine.create({ ...SHAPE, tensorParallel: 2, hostBudget: MiB })).rejects.toThrow(TensorParallelConfigError);
  });
});

describe('tensor-parallel shards under VRAM budgets', () => {
  it('each shard holds its half of every layer resident under a budget one device could not: the one-backend tokens', async () => {
    const { tokens, weightBytes } = await whole;
    const budget = Math.round(weightBytes * 0.8);
    await withEngine({ tensorParallel: 2, vramBudget: budget }, async (e) => {
      expect(await greedy(e)).toEqual(tokens);
      const r = e.memoryReport();
      expect(r.mode).toBe('resident');
      expect(r.devices).toHaveLength(2);
      for (const d of r.devices!) {
        expect(d.budgetBytes).toBe(budget);
        expect(d.weightBytes + d.kvBytes).toBeLessThanOrEqual(budget);
        expect(d.kvBytes).toBeGreaterThan(0);
      }
      expect(e.notes.some((n) => n.startsWith('tensor parallel under VRAM budgets, all resident: shard 0 '))).toBe(true);
    });
    // Two stages of two shards, a budget per stage.
    await withEngine({ tensorParallel: 2, pipelineParallel: 2, stageVramBudgets: [budget, budget] }, async (e) => {
      expect(await greedy(e)).toEqual(tokens);
      expect(e.memoryReport().devices!.map((d) => d.budgetBytes)).toEqual([budget, budget, budget, budget]);
    });
  });

  it('refuses a budget a shard cannot fit, naming the shard, before anything is uploaded', async () => {
    const { weightBytes } = await whole;
    const err = await Engine.create({ ...SHAPE, tensorParallel: 2, vramBudget: Math.round(weightBytes * 0.3) }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TensorParallelConfigError);
    expect((err as Error).message).toMatch(/^shard 0 of the model needs about [\d.]+ MiB \(weights [\d.]+ MiB, activations, staging and the embedding [\d.]+ MiB\) but its VRAM budget leaves [\d.]+ MiB: give more shards or stages, or larger budgets$/);
    await expect(Engine.create({ ...SHAPE, tensorParallel: 2, vramBudget: Math.round(weightBytes * 0.8), kvCacheBytes: 256 * MiB })).rejects.toThrow(/kvCacheBytes 256.0 MiB does not fit the VRAM budgets: shard \d of stage 0 has room for/);
  });
});
