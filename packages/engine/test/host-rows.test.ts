import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, HostSampler, type RequestOutcome } from '../src/index.js';
import { DEFAULT_MODEL } from './fixtures.js';

/**
 * One request that needs the host sampler (logprobs, penalties, min_tokens) no longer moves the
 * whole batch to the host: the device samples the other rows, the host only the rows that need
 * it, and every request gets the tokens it gets alone.
 */
describe('host sampling only for the rows that need it', () => {
  let engine: Engine;
  beforeAll(async () => {
    engine = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', maxNumSeqs: 8 });
  });
  afterAll(() => engine?.dispose());

  const plain = (prompt: string, seed: number) => engine.submit(prompt, { temperature: 1, seed, maxTokens: 16, ignoreEos: true }).done;
  const needsHost = (prompt: string, seed: number) =>
    engine.submit(prompt, { temperature: 0.8, topP: 0.9, seed, maxTokens: 16, ignoreEos: true, logprobs: true, topLogprobs: 2, presencePenalty: 0.4, minTokens: 3 }).done;

  it('a mixed batch gives each request its tokens alone, and samples only the host rows on the host', async () => {
    const prompts = ['ROMEO:', 'KING HENRY', 'O, what a', 'JULIET:\nAy me'];
    const alone: RequestOutcome[] = [];
    for (let i = 0; i < prompts.length; i++) alone.push(await (i === 1 ? needsHost(prompts[i], 40 + i) : plain(prompts[i], 40 + i)));
    // Count the host sampler's rows while the four run together.
    let hostRows = 0;
    const sample = HostSampler.prototype.sample;
    HostSampler.prototype.sample = function (this: HostSampler, ...a: Parameters<HostSampler['sample']>) {
      hostRows++;
      return sample.apply(this, a);
    };
    let together: RequestOutcome[];
    try {
      together = await Promise.all(prompts.map((p, i) => (i === 1 ? needsHost(p, 40 + i) : plain(p, 40 + i))));
    } finally {
      HostSampler.prototype.sample = sample;
    }
    for (let i = 0; i < prompts.length; i++) expect(together[i].tokenIds, prompts[i]).toEqual(alone[i].tokenIds);
    // 16 tokens of the one request that needs it, not 4 x 16.
    expect(hostRows).toBe(16);
  });
});
