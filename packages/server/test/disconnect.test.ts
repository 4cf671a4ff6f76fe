import { afterAll, beforeAll, expect, it } from 'vitest';
import type { RunningServer } from '../src/server.js';
import { MODEL, startTestServer, waitAllFree } from './helpers.js';

let server: RunningServer;
beforeAll(async () => {
  server = await startTestServer();
});
afterAll(async () => {
  await server?.shutdown();
});

/** Deterministic pseudo-random numbers, so a failure can be replayed. */
function rng(seed: number): () => number {
  let x = seed >>> 0;
  return () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return x / 2 ** 32;
  };
}

/** Start a long stream and drop the connection after `afterChunks` data events (0: right after the headers). */
async function dropMidStream(i: number, afterChunks: number): Promise<number> {
  const ac = new AbortController();
  const chat = i % 2 === 0;
  const body = chat
    ? { model: MODEL, stream: true, max_tokens: 200, ignore_eos: true, seed: i, messages: [{ role: 'user', content: `line ${i}` }] }
    : { model: MODEL, stream: true, max_tokens: 200, ignore_eos: true, seed: i, prompt: `Scene ${i}:` };
  const r = await fetch(`${server.url}/v1/${chat ? 'chat/completions' : 'completions'}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: ac.signal,
  });
  expect(r.status).toBe(200);
  const reader = r.body!.getReader();
  let seen = 0;
  try {
    while (seen < afterChunks) {
      const { done, value } = await reader.read();
      if (done) break;
      seen += new TextDecoder().decode(value).split('data: ').length - 1;
    }
  } finally {
    ac.abort();
  }
  return seen;
}

it('200 random disconnects mid-stream: every block is freed and the server keeps serving', async () => {
  const rand = rng(42);
  const plan = Array.from({ length: 200 }, (_, i) => ({ i, after: Math.floor(rand() * 4) }));
  const WAVE = 40;
  for (let w = 0; w < plan.length; w += WAVE) {
    await Promise.all(plan.slice(w, w + WAVE).map((p) => dropMidStream(p.i, p.after)));
  }
  const m = await waitAllFree(server.url);
  expect(m.kv_blocks_used).toBe(0);
  expect(m.kv_sequences).toBe(0);
  expect(m.server_sequences_in_flight).toBe(0);
  expect(m.kv_invariants).toBe('ok');
  // Aborted requests are counted as such.
  const metrics = await (await fetch(`${server.url}/metrics`)).text();
  const aborted = Number(/nerva:request_success_total\{finished_reason="abort"[^}]*\} (\d+)/.exec(metrics)?.[1] ?? 0);
  expect(aborted).toBe(200);
  const ok = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt: 'ROMEO:', max_tokens: 4, ignore_eos: true }),
  });
  expect(ok.status).toBe(200);
  expect(((await ok.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens).toBe(4);
});
