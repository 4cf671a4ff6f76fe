import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { NervaModel } from '../src/index.js';
import { DEFAULT_MODEL, MODELS } from './fixtures.js';

// The decode roofline divides by the bytes a step reads: an untied embedding table gives one row a
// token, a tied one is also the LM head and is read whole.
describe('decodeWeightBytes (CPU)', () => {
  const models: NervaModel[] = [];
  afterEach(() => {
    for (const m of models.splice(0)) m.dispose();
  });
  const load = async (model: string, extra: Record<string, unknown> = {}) => {
    const m = await NervaModel.load({ model, backend: 'cpu', ...extra });
    models.push(m);
    return m;
  };

  it('leaves out an untied embedding table but one row', async () => {
    const m = await load(join(MODELS, 'tiny-random-qwen3'));
    expect(m.spec.tieWordEmbeddings).toBe(false);
    const table = m.internals.weights.embed!.byteLength;
    expect(table).toBeGreaterThan(0);
    expect(m.decodeWeightBytes).toBeCloseTo(m.weightBytes - table + table / m.spec.vocabSize, 6);
    const ctx = m.createContext();
    expect(ctx.model.decodeWeightBytes).toBe(m.decodeWeightBytes);
  });

  it('counts a tied table whole: it is the LM head', async () => {
    const m = await load(DEFAULT_MODEL);
    expect(m.spec.tieWordEmbeddings).toBe(true);
    expect(m.decodeWeightBytes).toBe(m.weightBytes);
  });

  it('counts the gathered table once over pipeline stages on one backend', async () => {
    const one = await load(join(MODELS, 'tiny-random-qwen3'));
    const staged = await load(join(MODELS, 'tiny-random-qwen3'), { pipelineParallel: 2, allowSingleDeviceStages: true });
    expect(staged.weightBytes).toBe(one.weightBytes);
    expect(staged.decodeWeightBytes).toBeCloseTo(one.decodeWeightBytes, 6);
  });
});
