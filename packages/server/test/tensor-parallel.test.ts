import { afterAll, describe, expect, it } from 'vitest';
import { DEFAULT_CONFIG, parseConfigTable } from '../src/config.js';
import { type RunningServer, startServer } from '../src/server.js';
import { MODEL, startTestServer } from './helpers.js';

/**
 * `nerva serve` with tensor_parallel: the worker's engine splits every layer across two CPU
 * backends; completions carry one backend's tokens and /v1/memory lists each shard's residency.
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
  return ((await r.json()) as { choices: { token_ids: number[] }[] }).choices[0].token_ids;
};

interface Devices {
  devices: { backend: string; weight_bytes: number; kv_bytes: number }[] | null;
  kv_cache_bytes: number;
}

describe('serve with tensor_parallel', () => {
  it("serves one backend's tokens from 2 shards and reports each shard's residency", async () => {
    const one = await startTestServer({ kvCacheBytes: 2 ** 21 });
    servers.push(one);
    const want = await Promise.all(['ROMEO:', 'JULIET:'].map((p) => complete(one, p)));
    expect(((await (await fetch(`${one.url}/v1/memory`)).json()) as Devices).devices).toBeNull();
    const two = await startTestServer({ kvCacheBytes: 2 ** 21, tensorParallel: 2 });
    servers.push(two);
    const got = await Promise.all(['ROMEO:', 'JULIET:'].map((p) => complete(two, p)));
    expect(got).toEqual(want);
    const m = (await (await fetch(`${two.url}/v1/memory`)).json()) as Devices;
    expect(m.devices).toHaveLength(2);
    for (const d of m.devices!) expect(d.weight_bytes).toBeGreaterThan(0);
    expect(m.devices![0].kv_bytes + m.devices![1].kv_bytes).toBe(m.kv_cache_bytes);
  });

  it("a shard count the model cannot take fails the load with the engine's message", async () => {
    const s = await startServer({ ...DEFAULT_CONFIG, port: 0, backend: 'cpu', tensorParallel: 4 });
    servers.push(s);
    await expect(s.ready).rejects.toThrow("tensorParallel 4 does not divide the model's 2 KV head(s)");
    expect((await fetch(`${s.url}/health`)).status).toBe(503);
  });

  it('takes tensor_parallel from a TOML table, and refuses a count that is not a positive integer', () => {
    expect(parseConfigTable({ tensor_parallel: 2 }, 'nerva.toml')).toMatchObject({ tensorParallel: 2 });
    expect(() => parseConfigTable({ tensor_parallel: 0 }, 'nerva.toml')).toThrow(/tensor_parallel/);
  });
});
