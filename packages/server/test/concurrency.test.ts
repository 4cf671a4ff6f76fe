import { afterAll, beforeAll, expect, it } from 'vitest';
import type { RunningServer } from '../src/server.js';
import { MODEL, parseSse, startTestServer, waitAllFree } from './helpers.js';

let server: RunningServer;
beforeAll(async () => {
  server = await startTestServer();
});
afterAll(async () => {
  await server?.shutdown();
});

const PROMPTS = ['ROMEO:', 'First Citizen:\nBefore we proceed', 'KING HENRY VI:', 'To be', 'O', 'MENENIUS:\nWhy, masters'];

interface Case {
  kind: 'chat' | 'completion';
  body: Record<string, unknown>;
}

/** A deterministic mix of endpoints, prompts, lengths, seeds and sampling paths. */
function cases(n: number): Case[] {
  const out: Case[] = [];
  for (let i = 0; i < n; i++) {
    const prompt = PROMPTS[i % PROMPTS.length];
    const common: Record<string, unknown> = { model: MODEL, stream: true, max_tokens: 3 + ((i * 7) % 9), seed: 1000 + i, return_token_ids: true };
    if (i % 4 === 1) common.temperature = 0;
    // Some requests take the host sampling path (penalties, logprobs) inside the same batches.
    if (i % 5 === 2) common.presence_penalty = 0.5;
    if (i % 8 === 3) common.min_tokens = 2;
    if (i % 2 === 0) out.push({ kind: 'completion', body: { ...common, prompt, ...(i % 6 === 0 ? { logprobs: 1 } : {}) } });
    else out.push({ kind: 'chat', body: { ...common, messages: [{ role: 'user', content: prompt }], ...(i % 6 === 3 ? { logprobs: true, top_logprobs: 1 } : {}) } });
  }
  return out;
}

interface Streamed {
  status: number;
  ids: number[];
  text: string;
  finish: string | undefined;
  done: boolean;
}

async function stream(c: Case): Promise<Streamed> {
  const path = c.kind === 'chat' ? '/v1/chat/completions' : '/v1/completions';
  const r = await fetch(server.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(c.body) });
  const body = await r.text();
  const out: Streamed = { status: r.status, ids: [], text: '', finish: undefined, done: false };
  if (r.status !== 200) return out;
  for (const ev of parseSse(body)) {
    if (ev === '[DONE]') {
      out.done = true;
      continue;
    }
    for (const ch of ev.choices) {
      out.ids.push(...(ch.token_ids ?? []));
      out.text += c.kind === 'chat' ? (ch.delta.content ?? '') : ch.text;
      if (ch.finish_reason) out.finish = ch.finish_reason;
    }
  }
  return out;
}

/** Wall time of the concurrent phase; NERVA_STRESS_S overrides it. */
const STRESS_MS = Number(process.env.NERVA_STRESS_S ?? 30) * 1000;

it('64 concurrent streaming clients for a while: no token lost, duplicated or reordered; equal to each request run alone', async () => {
  const pool = cases(640);
  let next = 0;
  const runs: { c: Case; s: Streamed }[] = [];
  const t0 = Date.now();
  // 64 closed-loop clients: each sends its next request as soon as the previous one finished.
  await Promise.all(
    Array.from({ length: 64 }, async () => {
      while (Date.now() - t0 < STRESS_MS && next < pool.length) {
        const c = pool[next++];
        runs.push({ c, s: await stream(c) });
      }
    }),
  );
  const concurrentMs = Date.now() - t0;
  expect(runs.length).toBeGreaterThanOrEqual(64);
  expect(runs.filter((r) => r.s.status !== 200).map((r) => r.s.status)).toEqual([]);
  for (const { c, s } of runs) {
    expect(s.done, 'stream ended with [DONE]').toBe(true);
    expect(['stop', 'length']).toContain(s.finish);
    expect(s.ids.length).toBeGreaterThan(0);
    expect(s.ids.length).toBeLessThanOrEqual(c.body.max_tokens as number);
    if (s.finish === 'length') expect(s.ids.length).toBe(c.body.max_tokens);
  }
  // Alone: the same request, one at a time, must give the same tokens and text.
  for (const { c, s } of runs) {
    const alone = await stream(c);
    expect(alone.ids, `${c.kind} seed ${String(c.body.seed)} ids`).toEqual(s.ids);
    expect(alone.text).toBe(s.text);
    expect(alone.finish).toBe(s.finish);
  }
  const m = await waitAllFree(server.url);
  expect(m.kv_blocks_used).toBe(0);
  expect(m.kv_sequences).toBe(0);
  expect(m.kv_invariants).toBe('ok');
  console.log(`64 clients for ${concurrentMs} ms: ${runs.length} requests, ${runs.reduce((a, r) => a + r.s.ids.length, 0)} tokens`);
});
