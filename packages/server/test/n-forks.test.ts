import { InvalidParamsError, WorkerEngine } from '@nerva/engine';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defaultModelDir } from '../src/default-model.js';
import type { RunningServer } from '../src/server.js';
import { MODEL, parseSse, startTestServer, waitAllFree } from './helpers.js';

/**
 * OpenAI's `n`: the n choices of a prompt run as shared-prefix forks (Engine.submitFork): the
 * prompt is prefilled once, fork i samples with seed + i. Prefix caching is off here, so the
 * prompt tokens the engine computes show whether a prompt was prefilled once or n times.
 */
let server: RunningServer;
beforeAll(async () => {
  server = await startTestServer({ maxNumSeqs: 4, enablePrefixCaching: false });
});
afterAll(async () => {
  await server?.shutdown();
});

async function post(path: string, body: Record<string, unknown>): Promise<{ status: number; json: any; text: string }> {
  const r = await fetch(server.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, ...body }) });
  const text = await r.text();
  let json: any;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, json, text };
}

/** Prefill tokens the engine has computed so far (nerva:prompt_tokens_total). */
async function promptTokensTotal(): Promise<number> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const m = /^nerva:prompt_tokens_total(?:\{[^}]*\})? (\S+)$/m.exec(text);
  return m ? Number(m[1]) : 0;
}

const BASE = { prompt: 'KING RICHARD:\nNow is the winter of our discontent', max_tokens: 8, temperature: 0.8, ignore_eos: true, return_token_ids: true };

/** Choice token ids of the same prompt run as separate n = 1 requests, seed + i each. */
async function separately(n: number, seed: number, body: Record<string, unknown> = BASE): Promise<number[][]> {
  const out: number[][] = [];
  for (let i = 0; i < n; i++) out.push((await post('/v1/completions', { ...body, seed: seed + i })).json.choices[0].token_ids);
  return out;
}

describe('n choices as shared-prefix forks', () => {
  it('completions: choices 0..n-1 equal separate runs with seed + i; the prompt is prefilled and counted once', async () => {
    const want = await separately(3, 11);
    const before = await promptTokensTotal();
    const r = await post('/v1/completions', { ...BASE, n: 3, seed: 11 });
    expect(r.status).toBe(200);
    const P = r.json.choices[0].prompt_token_ids.length;
    expect(r.json.choices.map((c: any) => c.index)).toEqual([0, 1, 2]);
    for (let i = 0; i < 3; i++) {
      expect(r.json.choices[i].token_ids).toEqual(want[i]);
      expect(r.json.choices[i].finish_reason).toBe('length');
      expect(typeof r.json.choices[i].text).toBe('string');
    }
    expect(new Set(r.json.choices.map((c: any) => c.token_ids.join(','))).size).toBeGreaterThan(1);
    expect(r.json.usage).toEqual({ prompt_tokens: P, completion_tokens: 24, total_tokens: P + 24, prompt_tokens_details: { cached_tokens: 0 } });
    expect((await promptTokensTotal()) - before).toBe(P);
    const m = await waitAllFree(server.url);
    expect(m.kv_blocks_used).toBe(0);
    expect(m.kv_invariants).toBe('ok');
  });

  it('n above the forks one batch holds (max_num_seqs 4) runs as several fork groups, seeds still seed + i', async () => {
    const want = await separately(6, 50);
    const before = await promptTokensTotal();
    const r = await post('/v1/completions', { ...BASE, n: 6, seed: 50 });
    expect(r.status).toBe(200);
    const P = r.json.choices[0].prompt_token_ids.length;
    expect(r.json.choices.map((c: any) => c.token_ids)).toEqual(want);
    // Two groups (4 + 2): two prefills, where six separate requests would make six.
    expect((await promptTokensTotal()) - before).toBe(2 * P);
    expect(r.json.usage.prompt_tokens).toBe(P);
    await waitAllFree(server.url);
  });

  it('several prompts x n: choice index = prompt index * n + sample', async () => {
    const second = { ...BASE, prompt: 'ROMEO:' };
    const want = [...(await separately(2, 7)), ...(await separately(2, 7, second))];
    const r = await post('/v1/completions', { ...BASE, prompt: [BASE.prompt, 'ROMEO:'], n: 2, seed: 7 });
    expect(r.status).toBe(200);
    expect(r.json.choices.map((c: any) => c.index)).toEqual([0, 1, 2, 3]);
    expect(r.json.choices.map((c: any) => c.token_ids)).toEqual(want);
    const P = r.json.choices[0].prompt_token_ids.length + r.json.choices[2].prompt_token_ids.length;
    expect(r.json.usage.prompt_tokens).toBe(P);
    await waitAllFree(server.url);
  });

  it('streaming completions: each index streams its own text and ends once; usage counts the prompt once', async () => {
    const whole = await post('/v1/completions', { ...BASE, n: 3, seed: 11 });
    const r = await post('/v1/completions', { ...BASE, n: 3, seed: 11, stream: true, stream_options: { include_usage: true } });
    expect(r.status).toBe(200);
    const events = parseSse(r.text);
    expect(events[events.length - 1]).toBe('[DONE]');
    const chunks = events.filter((e): e is Record<string, any> => e !== '[DONE]');
    const texts = ['', '', ''];
    const ids: number[][] = [[], [], []];
    const finishes = [0, 0, 0];
    for (const c of chunks) {
      if (c.choices.length === 0) continue;
      expect(c.choices).toHaveLength(1);
      const ch = c.choices[0];
      texts[ch.index] += ch.text;
      if (ch.token_ids) ids[ch.index].push(...ch.token_ids);
      if (ch.finish_reason !== null) finishes[ch.index]++;
    }
    expect(finishes).toEqual([1, 1, 1]);
    for (let i = 0; i < 3; i++) {
      expect(texts[i]).toBe(whole.json.choices[i].text);
      expect(ids[i]).toEqual(whole.json.choices[i].token_ids);
    }
    const usage = chunks[chunks.length - 1];
    expect(usage.choices).toEqual([]);
    expect(usage.usage).toEqual(whole.json.usage);
    await waitAllFree(server.url);
  });

  it('chat completions: n messages, streamed and not', async () => {
    const body = { messages: [{ role: 'user', content: 'Speak, friend.' }], max_tokens: 6, temperature: 0.8, seed: 3, n: 2 };
    const r = await post('/v1/chat/completions', body);
    expect(r.status).toBe(200);
    expect(r.json.object).toBe('chat.completion');
    expect(r.json.choices.map((c: any) => c.index)).toEqual([0, 1]);
    for (const c of r.json.choices) {
      expect(c.message.role).toBe('assistant');
      expect(typeof c.message.content).toBe('string');
    }
    const one = await post('/v1/chat/completions', { ...body, n: 1, seed: 4 });
    expect(one.json.choices[0].message.content).toBe(r.json.choices[1].message.content);
    expect(r.json.usage.prompt_tokens).toBe(one.json.usage.prompt_tokens);
    expect(r.json.usage.completion_tokens).toBe(r.json.usage.total_tokens - r.json.usage.prompt_tokens);

    const s = await post('/v1/chat/completions', { ...body, stream: true });
    const chunks = parseSse(s.text).filter((e): e is Record<string, any> => e !== '[DONE]');
    const content = ['', ''];
    const roles = [0, 0];
    for (const c of chunks) {
      const ch = c.choices[0];
      if (ch.delta.role) roles[ch.index]++;
      content[ch.index] += ch.delta.content ?? '';
    }
    expect(roles).toEqual([1, 1]);
    expect(content).toEqual(r.json.choices.map((c: any) => c.message.content));
    await waitAllFree(server.url);
  });

  it('a bad n is a 400 naming n, and nothing runs', async () => {
    for (const n of [0, -1, 1.5, '2', 129, true]) {
      const r = await post('/v1/completions', { ...BASE, n });
      expect(r.status, String(n)).toBe(400);
      expect(r.json.error.param).toBe('n');
      expect(r.json.error.type).toBe('invalid_request_error');
    }
    const chat = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], n: 0 });
    expect(chat.status).toBe(400);
    expect(chat.json.error.param).toBe('n');
    const m = await waitAllFree(server.url);
    expect(m.kv_sequences).toBe(0);
  });
});

describe('WorkerEngine.submitFork', () => {
  it('forks in the worker: seed + i tokens, a fork aborted alone, bad n thrown synchronously', async () => {
    const w = await WorkerEngine.create({ model: defaultModelDir(), backend: 'cpu', maxNumSeqs: 4 });
    try {
      expect(w.maxForks).toBe(4);
      const o = { maxTokens: 10, temperature: 0.9, seed: 21, ignoreEos: true };
      const want: number[][] = [];
      for (let i = 0; i < 3; i++) want.push((await w.submit('ROMEO:', { ...o, seed: 21 + i }).done).tokenIds);
      const hs = w.submitFork('ROMEO:', 3, o);
      hs[2].abort();
      const got = await Promise.all(hs.map((h) => h.done));
      expect(got[0].tokenIds).toEqual(want[0]);
      expect(got[1].tokenIds).toEqual(want[1]);
      expect(got[2].finishReason).toBe('abort');
      for (const n of [0, 5, 2.5]) {
        expect(() => w.submitFork('ROMEO:', n, o)).toThrow(InvalidParamsError);
        expect(() => w.submitFork('ROMEO:', n, o)).toThrow(/^n: must be an integer in \[1, 4\]/);
      }
      expect(() => w.submitFork('ROMEO:', 2, { ...o, temperature: -1 })).toThrow(/^temperature:/);
      expect(w.numInFlight).toBe(0);
      const s = await w.stats();
      expect(s.kv.sequences).toBe(0);
      expect(s.kv.freeBlocks).toBe(s.kv.totalBlocks - 1);
      await w.checkInvariants();
    } finally {
      await w.dispose();
    }
  });
});
