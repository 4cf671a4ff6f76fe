import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../src/server.js';
import { MODEL, parseSse, startTestServer, waitAllFree } from './helpers.js';

let server: RunningServer;
let impatient: RunningServer;
beforeAll(async () => {
  // Capacity: 2 running + 2 queued, all of it open to one client (the per-client cap is tested in security.test.ts).
  server = await startTestServer({ maxNumSeqs: 2, maxQueue: 2, maxSequencesPerClient: 4 });
  // A 1 s request timeout (a server of its own, so slow CI cannot time out the overload test).
  impatient = await startTestServer({ requestTimeoutS: 1 });
});
afterAll(async () => {
  await Promise.all([server?.shutdown(), impatient?.shutdown()]);
});

const post = (path: string, body: unknown, on = server) =>
  fetch(on.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });

describe('backpressure', () => {
  it('past the queue cap: 429 with Retry-After in OpenAI shape, and the admitted requests finish', async () => {
    const rs = await Promise.all(
      Array.from({ length: 12 }, (_, i) => post('/v1/completions', { model: MODEL, prompt: `Act ${i}`, max_tokens: 12, ignore_eos: true, seed: i, stream: i % 2 === 0 })),
    );
    const ok = rs.filter((r) => r.status === 200);
    const limited = rs.filter((r) => r.status === 429);
    expect(ok).toHaveLength(4);
    expect(limited).toHaveLength(8);
    for (const r of limited) {
      const retry = Number(r.headers.get('retry-after'));
      expect(Number.isInteger(retry) && retry >= 1 && retry <= 60).toBe(true);
      const body = (await r.json()) as { error: Record<string, unknown> };
      expect(body.error).toMatchObject({ type: 'rate_limit_error', code: 'queue_full', param: null });
      expect(typeof body.error.message).toBe('string');
    }
    for (const r of ok) {
      if (r.headers.get('content-type')?.startsWith('text/event-stream')) {
        const evs = parseSse(await r.text());
        expect(evs.at(-1)).toBe('[DONE]');
        const last = evs.at(-2) as { choices: { finish_reason: string }[] };
        expect(last.choices[0].finish_reason).toBe('length');
      } else {
        const body = (await r.json()) as { usage: { completion_tokens: number } };
        expect(body.usage.completion_tokens).toBe(12);
      }
    }
    // n counts against capacity: more samples than the server can ever hold is a 400.
    const tooMany = await post('/v1/completions', { model: MODEL, prompt: 'x', max_tokens: 1, n: 5 });
    expect(tooMany.status).toBe(400);
    expect(((await tooMany.json()) as { error: { param: string } }).error.param).toBe('n');
  });

  it('request timeout: 408 in OpenAI shape, an error event in a stream; the blocks are freed', async () => {
    const slow = { model: MODEL, prompt: 'A long speech:', max_tokens: 900, ignore_eos: true };
    const r = await post('/v1/completions', slow, impatient);
    expect(r.status).toBe(408);
    expect(((await r.json()) as { error: unknown }).error).toMatchObject({ type: 'timeout_error', code: 'request_timeout' });
    const s = await post('/v1/completions', { ...slow, stream: true }, impatient);
    expect(s.status).toBe(200);
    const evs = parseSse(await s.text());
    expect(evs.at(-1)).toBe('[DONE]');
    expect(evs.at(-2)).toMatchObject({ error: { type: 'timeout_error', code: 'request_timeout' } });
    const m = await waitAllFree(impatient.url);
    expect(m.kv_blocks_used).toBe(0);
    expect(m.kv_invariants).toBe('ok');
  });
});
