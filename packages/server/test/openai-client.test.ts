import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../src/server.js';
import { MODEL, startTestServer, waitAllFree } from './helpers.js';

let server: RunningServer;
let client: OpenAI;

beforeAll(async () => {
  server = await startTestServer({ apiKey: 'sk-test' });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'sk-test', maxRetries: 0 });
});
afterAll(async () => {
  await server?.shutdown();
});

describe('OpenAI client against a live server', () => {
  it('lists the served model', async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual([MODEL]);
  });

  it('chat completion: text, usage, finish_reason length at max_tokens', async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Speak, friend.' }], max_tokens: 6, seed: 7, temperature: 0.8 });
    expect(r.object).toBe('chat.completion');
    expect(r.choices).toHaveLength(1);
    const c = r.choices[0];
    expect(c.message.role).toBe('assistant');
    expect(typeof c.message.content).toBe('string');
    expect(['length', 'stop']).toContain(c.finish_reason);
    expect(r.usage!.completion_tokens).toBeGreaterThan(0);
    expect(r.usage!.completion_tokens).toBeLessThanOrEqual(6);
    if (c.finish_reason === 'length') expect(r.usage!.completion_tokens).toBe(6);
    expect(r.usage!.total_tokens).toBe(r.usage!.prompt_tokens + r.usage!.completion_tokens);
    // Same seed, same request: same text.
    const again = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Speak, friend.' }], max_tokens: 6, seed: 7, temperature: 0.8 });
    expect(again.choices[0].message.content).toBe(c.message.content);
  });

  it('completion from text and from token ids agree; logprobs in the legacy shape', async () => {
    const text = await client.completions.create({ model: MODEL, prompt: 'ROMEO:', max_tokens: 5, temperature: 0, ignore_eos: true, logprobs: 2, return_token_ids: true } as any);
    const c = text.choices[0] as any;
    expect(c.token_ids).toHaveLength(5);
    expect(c.finish_reason).toBe('length');
    expect(c.logprobs.tokens).toHaveLength(5);
    expect(c.logprobs.token_logprobs.every((x: number) => x <= 0)).toBe(true);
    expect(c.logprobs.text_offset[0]).toBe(0);
    expect(c.logprobs.tokens.join('')).toBe(c.text);
    for (const d of c.logprobs.top_logprobs) expect(Object.keys(d).length).toBeGreaterThanOrEqual(1);
    // Greedy: the sampled token is the most likely one.
    c.logprobs.top_logprobs.forEach((d: Record<string, number>, i: number) => expect(c.logprobs.token_logprobs[i]).toBeCloseTo(Math.max(...Object.values(d)), 5));
    const ids = await client.completions.create({ model: MODEL, prompt: c.prompt_token_ids, max_tokens: 5, temperature: 0, ignore_eos: true, return_token_ids: true } as any);
    expect((ids.choices[0] as any).token_ids).toEqual(c.token_ids);
    expect(ids.choices[0].text).toBe(c.text);
  });

  it('streaming chat with include_usage: deltas add up to the non-streamed text', async () => {
    const body = { model: MODEL, messages: [{ role: 'user' as const, content: 'What news?' }], max_tokens: 8, seed: 3, logprobs: true, top_logprobs: 2 };
    const whole = await client.chat.completions.create(body);
    const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | undefined;
    let nLogprobs = 0;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const ch of chunk.choices) {
        text += ch.delta.content ?? '';
        nLogprobs += ch.logprobs?.content?.length ?? 0;
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    }
    expect(text).toBe(whole.choices[0].message.content);
    expect(finish).toBe(whole.choices[0].finish_reason);
    expect(usage).toEqual(whole.usage);
    expect(nLogprobs).toBe(whole.usage!.completion_tokens);
    const lp = whole.choices[0].logprobs!.content!;
    expect(lp).toHaveLength(whole.usage!.completion_tokens);
    for (const e of lp) {
      expect(e.top_logprobs).toHaveLength(2);
      expect(Buffer.from(e.bytes!).toString('utf8')).toBe(e.token);
    }
  });

  it('n samples with a seed are seed, seed+1, ...; stop strings end the text', async () => {
    const r = await client.completions.create({ model: MODEL, prompt: 'KING:', max_tokens: 6, n: 3, seed: 11, ignore_eos: true, return_token_ids: true } as any);
    expect(r.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    const second = await client.completions.create({ model: MODEL, prompt: 'KING:', max_tokens: 6, seed: 12, ignore_eos: true, return_token_ids: true } as any);
    expect((second.choices[0] as any).token_ids).toEqual((r.choices[1] as any).token_ids);
    expect(r.usage!.completion_tokens).toBe(18);
    const stopped = await client.completions.create({ model: MODEL, prompt: 'KING:', max_tokens: 40, temperature: 0, ignore_eos: true, stop: ['\n'] } as any);
    expect(stopped.choices[0].text).not.toContain('\n');
    expect(stopped.choices[0].finish_reason).toBe('stop');
  });

  it('errors map to the client error classes with the param named', async () => {
    const bad = client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], temperature: -1 });
    await expect(bad).rejects.toBeInstanceOf(OpenAI.BadRequestError);
    await expect(bad).rejects.toMatchObject({ status: 400, param: 'temperature', type: 'invalid_request_error' });
    await expect(client.chat.completions.create({ model: MODEL, messages: [] })).rejects.toMatchObject({ status: 400, param: 'messages' });
    await expect(client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 10_000_000 })).rejects.toMatchObject({ status: 400, param: 'max_tokens' });
    await expect(client.completions.create({ model: 'gpt-4', prompt: 'x' })).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    const noKey = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await expect(noKey.models.list()).rejects.toBeInstanceOf(OpenAI.AuthenticationError);
    const m = await waitAllFree(server.url, { authorization: 'Bearer sk-test' });
    expect(m.kv_blocks_used).toBe(0);
    expect(m.kv_invariants).toBe('ok');
  });
});
