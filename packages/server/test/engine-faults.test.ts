import { copyFile, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeSyntheticCheckpoint } from '@nerva/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defaultModelDir } from '../src/default-model.js';
import type { RunningServer } from '../src/server.js';
import { MODEL, startTestServer, waitAllFree } from './helpers.js';

/**
 * No request can end the others, and an engine that dies or hangs is seen: its requests get an
 * OpenAI-style 503 within the watchdog's time, /health answers 503, and the engine comes back.
 */

const TOKENIZER_IDS = 4097; // the default model's tokenizer: 4096 vocabulary ids + 1 added token
let dir: string;
let padded: RunningServer;
let faulty: RunningServer;

beforeAll(async () => {
  // A checkpoint with more embedding rows than its tokenizer has ids, as Qwen ships (151,936 rows, ~151,665 ids).
  dir = await mkdtemp(join(tmpdir(), 'nerva-padded-'));
  const base = JSON.parse(await readFile(join(defaultModelDir(), 'config.json'), 'utf8')) as Record<string, unknown>;
  await writeSyntheticCheckpoint({
    config: { ...base, vocab_size: 4096 + 1024, num_hidden_layers: 1, hidden_size: 64, intermediate_size: 128, head_dim: 16, num_attention_heads: 4, num_key_value_heads: 2 },
    outDir: dir,
    dtype: 'f32',
    seed: 5,
  });
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) await copyFile(join(defaultModelDir(), f), join(dir, f));
  [padded, faulty] = await Promise.all([startTestServer({ model: dir, servedModelName: 'padded' }), startTestServer({ engineWatchdogS: 2 })]);
});
afterAll(async () => {
  await Promise.all([padded?.shutdown(), faulty?.shutdown()]);
  if (dir) await rm(dir, { recursive: true, force: true });
});

const post = (s: RunningServer, body: Record<string, unknown>) =>
  fetch(`${s.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });

describe('a padded vocabulary', () => {
  it('sampled at high temperature never yields an id without a token, and the requests alongside finish', async () => {
    const hot = Array.from({ length: 4 }, (_, i) =>
      post(padded, { model: 'padded', prompt: 'KING:', max_tokens: 48, temperature: 100, n: 4, seed: i, ignore_eos: true, return_token_ids: true }),
    );
    // Host sampling too (penalties and logprobs move a row to the host sampler).
    const hostHot = post(padded, { model: 'padded', prompt: 'KING:', max_tokens: 48, temperature: 100, logprobs: 2, presence_penalty: 0.5, seed: 9, ignore_eos: true, return_token_ids: true });
    const calm = Array.from({ length: 3 }, (_, i) => post(padded, { model: 'padded', prompt: `Act ${i}`, max_tokens: 24, temperature: 0, ignore_eos: true }));
    const rs = await Promise.all([...hot, hostHot, ...calm]);
    for (const r of rs) expect(r.status, await r.clone().text()).toBe(200);
    let sampled = 0;
    for (const r of [...rs.slice(0, 5)]) {
      const body = (await r.json()) as { choices: { token_ids: number[]; finish_reason: string }[] };
      for (const c of body.choices) {
        expect(c.finish_reason).toBe('length');
        for (const t of c.token_ids) expect(t).toBeLessThan(TOKENIZER_IDS);
        sampled += c.token_ids.length;
      }
    }
    // At temperature 100 a fifth of the ids would be padding: thousands of draws would hit one.
    expect(sampled).toBe(4 * 4 * 48 + 48);
    for (const r of rs.slice(5)) expect(((await r.json()) as { choices: { finish_reason: string }[] }).choices[0].finish_reason).toBe('length');
    expect((await waitAllFree(padded.url)).kv_blocks_used).toBe(0);
  });
});

async function health(s: RunningServer): Promise<number> {
  return (await fetch(`${s.url}/health`)).status;
}

async function until(what: () => Promise<boolean>, ms: number): Promise<void> {
  const t0 = Date.now();
  while (!(await what())) {
    if (Date.now() - t0 > ms) throw new Error(`not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('an engine that dies or hangs', () => {
  for (const fault of ['exit', 'hang'] as const) {
    it(`a ${fault === 'exit' ? 'killed' : 'hung'} worker: 503 in OpenAI shape within the timeout, /health 503, then recovery`, async () => {
      const long = post(faulty, { model: MODEL, prompt: 'A long speech:', max_tokens: 900, ignore_eos: true });
      const stream = post(faulty, { model: MODEL, prompt: 'Another:', max_tokens: 900, ignore_eos: true, stream: true });
      await new Promise((r) => setTimeout(r, 300));
      const t0 = Date.now();
      faulty.state.engine!.injectFault(fault);
      const r = await long;
      expect(Date.now() - t0).toBeLessThan(fault === 'hang' ? 6000 : 2000);
      expect(r.status).toBe(503);
      expect(((await r.json()) as { error: unknown }).error).toMatchObject({ type: 'service_unavailable', code: 'engine_unavailable' });
      const s = await stream;
      expect(s.status).toBe(200);
      expect(await s.text()).toContain('engine_unavailable');
      // Down until the new engine is loaded; new requests get 503 meanwhile, never a hang.
      if ((await health(faulty)) === 503) {
        const during = await post(faulty, { model: MODEL, prompt: 'x', max_tokens: 2 });
        expect([200, 503]).toContain(during.status);
      }
      await until(async () => (await health(faulty)) === 200, 30_000);
      const after = await post(faulty, { model: MODEL, prompt: 'KING:', max_tokens: 4 });
      expect(after.status).toBe(200);
      const m = await waitAllFree(faulty.url);
      expect(m.server_sequences_in_flight).toBe(0);
      expect((await fetch(`${faulty.url}/metrics`)).status).toBe(200);
    });
  }
});
