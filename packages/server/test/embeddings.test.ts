import { join } from 'node:path';
import { Engine, InvalidParamsError, WorkerEngine } from '@nerva/engine';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeEmbedding } from '../src/embeddings.js';
import type { RunningServer } from '../src/server.js';
import { FIXTURES } from './cli-helpers.js';
import { MODEL, startTestServer, waitAllFree } from './helpers.js';

// The default model on the CPU backend, at most 64 tokens an input; 8 sequences at once, so at
// most 2 + 64/4 = 18 inputs a request (a quarter of the admission capacity).
const MAX_LEN = 64;
let server: RunningServer;
let engine: Engine;

beforeAll(async () => {
  server = await startTestServer({ maxModelLen: MAX_LEN, maxNumSeqs: 8, maxQueue: 64 });
  // The same model in process: what the endpoint must return, bit for bit.
  engine = await Engine.create({ model: server.states[0].modelDir, backend: 'cpu', maxModelLen: MAX_LEN });
});
afterAll(async () => {
  await server?.shutdown();
  engine?.dispose();
});

interface EmbeddingResponse {
  object: string;
  data: { object: string; index: number; embedding: number[] | string }[];
  model: string;
  usage: { prompt_tokens: number; total_tokens: number };
}
interface ErrorBody {
  error?: { message: string; type: string; param: string | null; code: string | null };
}

async function post(body: unknown): Promise<{ status: number; json: EmbeddingResponse & ErrorBody }> {
  const r = await fetch(`${server.url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, json: (await r.json()) as EmbeddingResponse & ErrorBody };
}

/** The float32 values of a base64 embedding (little-endian bytes). */
function decodeBase64(s: string): Float32Array {
  const b = Buffer.from(s, 'base64');
  const out = new Float32Array(b.length / 4);
  for (let i = 0; i < out.length; i++) out[i] = b.readFloatLE(i * 4);
  return out;
}

const TEXTS = ['ROMEO:', 'First Citizen:\nBefore we proceed any further, hear me speak.', 'O'];

describe('POST /v1/embeddings', () => {
  it('answers in OpenAI\'s shape with the engine\'s vectors, usage counting the input tokens', async () => {
    const r = await post({ model: MODEL, input: TEXTS });
    expect(r.status).toBe(200);
    expect(r.json.object).toBe('list');
    expect(r.json.model).toBe(MODEL);
    const want = await engine.embed(TEXTS);
    expect(r.json.data.map((d) => [d.object, d.index])).toEqual(TEXTS.map((_, i) => ['embedding', i]));
    for (const [i, d] of r.json.data.entries()) {
      expect(d.embedding).toHaveLength(engine.spec.hiddenSize);
      expect(Float32Array.from(d.embedding as number[])).toEqual(want.embeddings[i]);
    }
    const tokens = want.promptTokens.reduce((a, b) => a + b, 0);
    expect(tokens).toBe(TEXTS.reduce((n, t) => n + engine.encode(t).length, 0));
    expect(r.json.usage).toEqual({ prompt_tokens: tokens, total_tokens: tokens });
  });

  it('a batch equals its inputs sent one by one (the CPU backend: bit for bit)', async () => {
    const batch = await post({ model: MODEL, input: TEXTS });
    const alone = await Promise.all(TEXTS.map((t) => post({ model: MODEL, input: t })));
    for (const [i, a] of alone.entries()) {
      expect(a.status).toBe(200);
      expect(a.json.data).toHaveLength(1);
      expect(a.json.data[0].embedding).toEqual(batch.json.data[i].embedding);
    }
  });

  it('token ids: one list or a list of lists, the same vectors as the texts', async () => {
    const ids = TEXTS.map((t) => engine.encode(t));
    const text = await post({ model: MODEL, input: TEXTS[1] });
    const one = await post({ model: MODEL, input: ids[1] });
    const many = await post({ model: MODEL, input: ids });
    expect(one.status).toBe(200);
    expect(one.json.data[0].embedding).toEqual(text.json.data[0].embedding);
    expect(one.json.usage.prompt_tokens).toBe(ids[1].length);
    expect(many.json.data.map((d) => d.embedding)).toEqual((await post({ model: MODEL, input: TEXTS })).json.data.map((d) => d.embedding));
  });

  it('base64 is the little-endian float32 bytes of the float list', async () => {
    const f = await post({ model: MODEL, input: TEXTS, encoding_format: 'float' });
    const b = await post({ model: MODEL, input: TEXTS, encoding_format: 'base64', user: 'someone' });
    expect(b.status).toBe(200);
    for (const [i, d] of b.json.data.entries()) {
      expect(typeof d.embedding).toBe('string');
      const decoded = decodeBase64(d.embedding as string);
      expect(Array.from(decoded)).toEqual(f.json.data[i].embedding);
    }
    // The encoder itself on values whose bytes are known: 1.0f = 00 00 80 3f, -2.5f = 00 00 20 c0.
    expect(encodeEmbedding(Float32Array.from([1, -2.5]), 'base64')).toBe(Buffer.from([0, 0, 0x80, 0x3f, 0, 0, 0x20, 0xc0]).toString('base64'));
  });

  it('the official openai client (which asks for base64) decodes the same vectors', async () => {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0 });
    const r = await client.embeddings.create({ model: MODEL, input: TEXTS });
    const f = await post({ model: MODEL, input: TEXTS });
    expect(r.data.map((d) => d.embedding)).toEqual(f.json.data.map((d) => d.embedding));
    expect(r.usage.prompt_tokens).toBe(f.json.usage.prompt_tokens);
  });

  it('an input of the model\'s maximum length is taken; one token more is a 400 naming input', async () => {
    const ok = await post({ model: MODEL, input: Array.from({ length: MAX_LEN }, (_, i) => 1 + (i % 40)) });
    expect(ok.status).toBe(200);
    expect(ok.json.usage.prompt_tokens).toBe(MAX_LEN);
    const long = await post({ model: MODEL, input: ['ROMEO:', 'To be, or not to be: that is the question. '.repeat(8)] });
    expect(long.status).toBe(400);
    expect(long.json.error).toMatchObject({ param: 'input', code: 'context_length_exceeded', type: 'invalid_request_error' });
    expect(long.json.error!.message).toMatch(/'input\[1\]' has \d+ tokens; this model's maximum length is 64 tokens/);
  });
});

/** Every error body has exactly OpenAI's four fields with the right types. */
function expectOpenAiError(json: ErrorBody, type: string, param: string | null) {
  expect(json.error).toBeDefined();
  expect(Object.keys(json.error!).sort()).toEqual(['code', 'message', 'param', 'type']);
  expect(json.error!.message.length).toBeGreaterThan(0);
  expect(json.error!.type).toBe(type);
  expect(json.error!.param).toBe(param);
}

describe('malformed embedding requests get a 4xx in OpenAI shape', () => {
  const cases: [string, unknown, number, string | null][] = [
    ['body not an object', [1, 2], 400, null],
    ['missing model', { input: 'x' }, 400, 'model'],
    ['model not a string', { model: 3, input: 'x' }, 400, 'model'],
    ['unknown model', { model: 'text-embedding-3-small', input: 'x' }, 404, 'model'],
    ['missing input', { model: MODEL }, 400, 'input'],
    ['input null', { model: MODEL, input: null }, 400, 'input'],
    ['input a number', { model: MODEL, input: 5 }, 400, 'input'],
    ['input an object', { model: MODEL, input: { text: 'x' } }, 400, 'input'],
    ['input an empty string', { model: MODEL, input: '' }, 400, 'input'],
    ['input an empty array', { model: MODEL, input: [] }, 400, 'input'],
    ['an empty string in the list', { model: MODEL, input: ['a', ''] }, 400, 'input'],
    ['an empty token list in the list', { model: MODEL, input: [[1, 2], []] }, 400, 'input'],
    ['strings and token ids mixed', { model: MODEL, input: ['a', [1, 2]] }, 400, 'input'],
    ['a fractional token id', { model: MODEL, input: [1, 2.5] }, 400, 'input'],
    ['a fractional token id in a list', { model: MODEL, input: [[1], [2.5]] }, 400, 'input'],
    ['a token id outside the vocabulary', { model: MODEL, input: [1, 99999999] }, 400, 'input'],
    ['a negative token id', { model: MODEL, input: [[-3]] }, 400, 'input'],
    ['too many inputs', { model: MODEL, input: Array.from({ length: 40 }, () => 'x') }, 400, 'input'],
    ['encoding_format unknown', { model: MODEL, input: 'x', encoding_format: 'int8' }, 400, 'encoding_format'],
    ['encoding_format a number', { model: MODEL, input: 'x', encoding_format: 1 }, 400, 'encoding_format'],
    ['dimensions zero', { model: MODEL, input: 'x', dimensions: 0 }, 400, 'dimensions'],
    ['dimensions a string', { model: MODEL, input: 'x', dimensions: '8' }, 400, 'dimensions'],
    ['dimensions fractional', { model: MODEL, input: 'x', dimensions: 1.5 }, 400, 'dimensions'],
    ['dimensions on a model that is not Matryoshka', { model: MODEL, input: 'x', dimensions: 8 }, 400, 'dimensions'],
    ['user not a string', { model: MODEL, input: 'x', user: 5 }, 400, 'user'],
    ['a field this server does not take', { model: MODEL, input: 'x', truncate_prompt_tokens: 8 }, 400, 'truncate_prompt_tokens'],
  ];
  it.each(cases)('%s', async (_name, body, status, param) => {
    const r = await post(body);
    expect(r.status).toBe(status);
    expectOpenAiError(r.json, status === 404 ? 'not_found_error' : 'invalid_request_error', param);
  });

  it('an unknown field is refused by name as unsupported_parameter', async () => {
    const r = await post({ model: MODEL, input: 'x', normalize: false });
    expect(r.json.error).toMatchObject({ param: 'normalize', code: 'unsupported_parameter' });
  });

  it('the server keeps serving afterwards, with no KV block held', async () => {
    const r = await post({ model: MODEL, input: 'ROMEO:' });
    expect(r.status).toBe(200);
    const m = await waitAllFree(server.url);
    expect(m.kv_blocks_used).toBe(0);
    expect(m.kv_sequences).toBe(0);
    expect(m.server_sequences_in_flight).toBe(0);
  });
});

describe('several models', () => {
  it('routes by model: a fixture model served beside the default one', async () => {
    const dir = join(FIXTURES, 'models/tiny-random-qwen3');
    const two = await startTestServer({ models: [{ model: server.states[0].modelDir }, { model: dir, servedModelName: 'random' }] });
    try {
      const r = await fetch(`${two.url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'random', input: [[1, 2, 3]] }) });
      expect(r.status).toBe(200);
      const body = (await r.json()) as EmbeddingResponse;
      const e = await Engine.create({ model: dir, backend: 'cpu' });
      try {
        expect(Float32Array.from(body.data[0].embedding as number[])).toEqual((await e.embed([[1, 2, 3]])).embeddings[0]);
      } finally {
        e.dispose();
      }
    } finally {
      await two.shutdown();
    }
  });
});

describe('embed through the worker proxy', () => {
  it('checks inputs on the calling thread, rejects an aborted call once its KV is freed, and serves on', async () => {
    // 8-token steps: 8 inputs of 60 tokens take dozens of steps, so the abort lands before they finish.
    const w = await WorkerEngine.create({ model: server.states[0].modelDir, backend: 'cpu', maxNumBatchedTokens: 8, maxModelLen: MAX_LEN });
    try {
      await expect(w.embed([[1, 2], []])).rejects.toBeInstanceOf(InvalidParamsError);
      await expect(w.embed([[1, 2]], { dimensions: 4 })).rejects.toMatchObject({ param: 'dimensions' });
      const ac = new AbortController();
      const inputs = Array.from({ length: 8 }, (_, k) => Array.from({ length: 60 }, (_, i) => 1 + ((i * 7 + k) % 50)));
      const p = w.embed(inputs, { signal: ac.signal });
      ac.abort();
      await expect(p).rejects.toMatchObject({ code: 'ABORTED' });
      const s = await w.stats();
      expect(s.kv.sequences).toBe(0);
      expect(s.kv.freeBlocks).toBe(s.kv.totalBlocks - 1);
      const r = await w.embed(['ROMEO:']);
      expect(r.embeddings[0]).toEqual((await engine.embed(['ROMEO:'])).embeddings[0]);
    } finally {
      await w.dispose();
    }
  });
});
