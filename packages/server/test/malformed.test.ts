import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../src/server.js';
import { MODEL, startTestServer, waitAllFree } from './helpers.js';

let server: RunningServer;
beforeAll(async () => {
  server = await startTestServer({ bodyLimitBytes: 64 * 1024 });
});
afterAll(async () => {
  await server?.shutdown();
});

async function send(path: string, body: string | Uint8Array, headers: Record<string, string> = { 'content-type': 'application/json' }) {
  const r = await fetch(server.url + path, { method: 'POST', headers, body });
  const json = (await r.json()) as { error?: { message: string; type: string; param: string | null; code: string | null } };
  return { status: r.status, json };
}

const chat = (extra: Record<string, unknown>) => JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, ...extra });

/** Every error body has exactly OpenAI's four fields with the right types. */
function expectOpenAiError(json: { error?: Record<string, unknown> }, type: string, param: string | null) {
  expect(json.error).toBeDefined();
  expect(Object.keys(json.error!).sort()).toEqual(['code', 'message', 'param', 'type']);
  expect(typeof json.error!.message).toBe('string');
  expect((json.error!.message as string).length).toBeGreaterThan(0);
  expect(json.error!.type).toBe(type);
  expect(json.error!.param).toBe(param);
}

describe('malformed requests get 4xx in OpenAI shape', () => {
  const cases: [string, string, string | Uint8Array, number, string | null][] = [
    ['bad JSON', '/v1/chat/completions', '{"model": "x", ', 400, null],
    ['empty body', '/v1/completions', '', 400, null],
    ['body not an object', '/v1/completions', '[1, 2]', 400, null],
    ['invalid UTF-8 bytes', '/v1/completions', new Uint8Array([...Buffer.from('{"model":"'), 0xff, 0xfe, ...Buffer.from('","prompt":"x"}')]), 400, null],
    ['missing model', '/v1/completions', JSON.stringify({ prompt: 'x' }), 400, 'model'],
    ['unknown model', '/v1/completions', JSON.stringify({ model: 'gpt-4o', prompt: 'x' }), 404, 'model'],
    ['empty messages', '/v1/chat/completions', JSON.stringify({ model: MODEL, messages: [] }), 400, 'messages'],
    ['messages not an array', '/v1/chat/completions', JSON.stringify({ model: MODEL, messages: 'hi' }), 400, 'messages'],
    ['message without role', '/v1/chat/completions', JSON.stringify({ model: MODEL, messages: [{ content: 'hi' }] }), 400, 'messages[0].role'],
    ['image content part', '/v1/chat/completions', JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }), 400, 'messages[0].content[0].type'],
    ['temperature as a string', '/v1/chat/completions', chat({ temperature: 'hot' }), 400, 'temperature'],
    ['max_tokens a float', '/v1/chat/completions', chat({ max_tokens: 2.5 }), 400, 'max_tokens'],
    ['huge max_tokens', '/v1/chat/completions', chat({ max_tokens: 1e9 }), 400, 'max_tokens'],
    ['max_tokens zero', '/v1/completions', JSON.stringify({ model: MODEL, prompt: 'x', max_tokens: 0 }), 400, 'max_tokens'],
    ['top_p out of range', '/v1/completions', JSON.stringify({ model: MODEL, prompt: 'x', top_p: 1.5 }), 400, 'top_p'],
    ['n zero', '/v1/completions', JSON.stringify({ model: MODEL, prompt: 'x', n: 0 }), 400, 'n'],
    ['stop of numbers', '/v1/completions', JSON.stringify({ model: MODEL, prompt: 'x', stop: [1] }), 400, 'stop'],
    ['token id out of vocabulary', '/v1/completions', JSON.stringify({ model: MODEL, prompt: [1, 999999] }), 400, 'prompt'],
    ['empty prompt', '/v1/completions', JSON.stringify({ model: MODEL, prompt: '' }), 400, 'prompt'],
    ['stream_options without stream', '/v1/completions', JSON.stringify({ model: MODEL, prompt: 'x', stream_options: { include_usage: true } }), 400, 'stream_options'],
    ['top_logprobs without logprobs', '/v1/chat/completions', chat({ top_logprobs: 3 }), 400, 'top_logprobs'],
    ['logit_bias key not a token id', '/v1/completions', JSON.stringify({ model: MODEL, prompt: 'x', logit_bias: { five: 10 } }), 400, 'logit_bias'],
    ['priority a float', '/v1/completions', JSON.stringify({ model: MODEL, prompt: 'x', priority: 0.5 }), 400, 'priority'],
  ];
  it.each(cases)('%s', async (_name, path, body, status, param) => {
    const r = await send(path, body);
    expect(r.status).toBe(status);
    expectOpenAiError(r.json, status === 404 ? 'not_found_error' : 'invalid_request_error', param);
  });

  it('oversized body → 413', async () => {
    const r = await send('/v1/completions', JSON.stringify({ model: MODEL, prompt: 'x'.repeat(100 * 1024) }));
    expect(r.status).toBe(413);
    expectOpenAiError(r.json, 'invalid_request_error', null);
  });

  it('unknown route → 404 in the same shape', async () => {
    const r = await fetch(`${server.url}/v1/nope`);
    expect(r.status).toBe(404);
    expectOpenAiError((await r.json()) as never, 'not_found_error', null);
  });

  it('the server keeps serving afterwards, with no block held', async () => {
    const r = await send('/v1/chat/completions', chat({ max_tokens: 3, ignore_eos: true }));
    expect(r.status).toBe(200);
    const m = await waitAllFree(server.url);
    expect(m.kv_blocks_used).toBe(0);
    expect(m.server_sequences_in_flight).toBe(0);
  });
});
