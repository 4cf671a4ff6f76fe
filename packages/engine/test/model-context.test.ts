import { CpuBackend } from '@nerva/cpu-backend';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, ModelContext, NervaModel, type RequestOutcome } from '../src/index.js';
import { sharedModel } from '../examples/shared-model.js';
import { DEFAULT_MODEL } from './fixtures.js';

const PROMPTS = ['ROMEO:', 'First Citizen:\nBefore we proceed', 'KING HENRY'];
const params = (seed: number) => ({ temperature: 0.9, topK: 40, topP: 0.95, seed, maxTokens: 16, ignoreEos: true });

describe('one model, two contexts (CPU)', () => {
  let lone: RequestOutcome[];
  beforeAll(async () => {
    const engine = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', maxNumSeqs: 8 });
    lone = [];
    for (let i = 0; i < PROMPTS.length; i++) lone.push(await engine.submit(PROMPTS[i], params(10 + i)).done);
    engine.dispose();
  });

  let backend: CpuBackend;
  let model: NervaModel;
  afterAll(() => {
    model?.dispose();
    backend?.dispose();
  });

  it('allocates the weights once and gives each context the tokens a lone engine gives', async () => {
    backend = new CpuBackend();
    const empty = backend.stats();
    model = await NervaModel.load({ model: DEFAULT_MODEL, backend });
    const loaded = backend.stats();
    const weightBytes = loaded.liveBytes - empty.liveBytes;
    expect(weightBytes).toBe(model.weightBytes);
    const weightAllocs = loaded.allocCalls - empty.allocCalls;

    const a = model.createContext({ maxNumSeqs: 8 });
    const afterA = backend.stats();
    const b = new ModelContext(model, { maxNumSeqs: 8 });
    const afterB = backend.stats();
    expect(model.contexts).toEqual([a, b]);
    // Each context adds the same KV cache and activations, and no weight.
    const contextBytes = afterA.liveBytes - loaded.liveBytes;
    expect(afterB.liveBytes - afterA.liveBytes).toBe(contextBytes);
    expect(afterB.allocCalls - afterA.allocCalls).toBe(afterA.allocCalls - loaded.allocCalls);
    expect(contextBytes).toBeLessThan(afterB.liveBytes - weightBytes);
    expect(weightAllocs).toBeGreaterThan(0);
    // Both memory reports count the one set of weights.
    for (const c of [a, b]) expect(c.memoryReport().weights.totalBytes).toBe(a.memoryReport().weights.totalBytes);
    expect(a.memoryReport().weights.totalBytes).toBeLessThanOrEqual(weightBytes);

    // Both contexts run at once, interleaving their steps on one backend.
    const [outA, outB] = await Promise.all([Promise.all(PROMPTS.map((p, i) => a.submit(p, params(10 + i)).done)), Promise.all(PROMPTS.map((p, i) => b.submit(p, params(10 + i)).done))]);
    for (let i = 0; i < PROMPTS.length; i++) {
      expect(outA[i].tokenIds).toEqual(lone[i].tokenIds);
      expect(outB[i].tokenIds).toEqual(lone[i].tokenIds);
      expect(outB[i].text).toEqual(lone[i].text);
    }

    // Disposing a context frees its KV and activations, not the weights.
    a.dispose();
    expect(backend.stats().liveBytes).toBe(afterB.liveBytes - contextBytes);
    expect(model.contexts).toEqual([b]);
    expect((await b.submit(PROMPTS[0], params(10)).done).tokenIds).toEqual(lone[0].tokenIds);
    // Disposing the model disposes its contexts, then frees the weights (the backend was the caller's).
    model.dispose();
    expect(() => b.submit('ROMEO:', { maxTokens: 1 })).toThrow(/disposed/);
    expect(backend.stats().liveBytes).toBe(empty.liveBytes);
    expect(() => model.createContext()).toThrow(/disposed/);
  });
});

describe('examples/shared-model.ts', () => {
  it('runs: each context gives the greedy text a lone engine gives', async () => {
    const got = await sharedModel(DEFAULT_MODEL);
    const engine = await Engine.create({ model: DEFAULT_MODEL, backend: 'auto' });
    try {
      const greedy = { maxTokens: 16, temperature: 0 };
      expect(got.chat).toBe((await engine.submit('ROMEO:', greedy).done).text);
      expect(got.batch[1]).toBe((await engine.submit('KING HENRY:', greedy).done).text);
      expect(got.batch).toHaveLength(3);
    } finally {
      engine.dispose();
    }
  });
});
