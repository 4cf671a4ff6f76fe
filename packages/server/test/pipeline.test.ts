import { afterAll, describe, expect, it } from 'vitest';
import { DEFAULT_CONFIG } from '../src/config.js';
import { type RunningServer, startServer } from '../src/server.js';
import { MODEL, startTestServer } from './helpers.js';

/**
 * `nerva serve` with pipeline_parallel: the worker's engine runs the layers as stages (on the CPU
 * backend they share one backend), and completions carry one stage's tokens.
 */
const servers: RunningServer[] = [];
afterAll(async () => {
  for (const s of servers) await s.shutdown();
});

const complete = async (s: RunningServer, prompt: string) => {
  const r = await fetch(`${s.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt, max_tokens: 10, temperature: 0, ignore_eos: true, return_token_ids: true }),
  });
  expect(r.status).toBe(200);
  return ((await r.json()) as { choices: { token_ids: number[]; text: string }[] }).choices[0];
};

describe('serve with pipeline_parallel', () => {
  it('serves one stage\'s tokens from a 3-stage pipeline', async () => {
    const one = await startTestServer({ kvCacheBytes: 2 ** 21 });
    servers.push(one);
    const want = await Promise.all(['ROMEO:', 'JULIET:'].map((p) => complete(one, p)));
    const three = await startTestServer({ kvCacheBytes: 2 ** 21, pipelineParallel: 3 });
    servers.push(three);
    const got = await Promise.all(['ROMEO:', 'JULIET:'].map((p) => complete(three, p)));
    expect(got.map((c) => c.token_ids)).toEqual(want.map((c) => c.token_ids));
    expect(got[0].token_ids).toHaveLength(10);
  });

  it('a stage count the model cannot take fails the load with the engine\'s message', async () => {
    const s = await startServer({ ...DEFAULT_CONFIG, port: 0, backend: 'cpu', pipelineParallel: 9 });
    servers.push(s);
    await expect(s.ready).rejects.toThrow("pipelineParallel 9 exceeds the model's 6 decoder layers");
    const h = await fetch(`${s.url}/health`);
    expect(h.status).toBe(503);
  });
});
