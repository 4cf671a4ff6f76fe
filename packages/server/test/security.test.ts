import { request as httpRequest, type ServerResponse } from 'node:http';
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { DEFAULT_CONFIG } from '../src/config.js';
import { type RunningServer, startServer } from '../src/server.js';
import { SseWriter } from '../src/sse.js';
import { MODEL, startTestServer } from './helpers.js';

/**
 * The server's security findings, one test each: the API key cannot be bypassed, hostile
 * requests are refused before they cost anything, and connections are bounded.
 */

const KEY = 'sk-security-test';
let keyed: RunningServer;
let open: RunningServer;
beforeAll(async () => {
  [keyed, open] = await Promise.all([
    startTestServer({ apiKey: KEY }),
    startTestServer({ maxNumSeqs: 4, maxQueue: 4, headersTimeoutS: 1, bodyTimeoutS: 2, maxConnections: 8, sseBufferBytes: 4096 }),
  ]);
});
afterAll(async () => {
  await Promise.all([keyed?.shutdown(), open?.shutdown()]);
});

interface Raw {
  status: number;
  body: string;
}

/** A request with the target sent byte for byte as given (fetch would normalize it). */
function raw(url: string, method: string, target: string, body?: string, headers: Record<string, string> = {}): Promise<Raw> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      { host: u.hostname, port: u.port, method, path: target, headers: { ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...headers } },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

const completion = JSON.stringify({ model: MODEL, prompt: 'KING:', max_tokens: 2 });

describe('API key: decided on the matched route, deny by default', () => {
  it('every spelling of a /v1 route without the key gets no completion', async () => {
    const port = new URL(keyed.url).port;
    const targets = [
      '/v1/completions',
      '/%761/completions', // encoded 'v'
      '/%76%31/completions',
      '/v1/%63ompletions',
      '/x/../v1/completions', // dot segments
      '/./v1/completions',
      '//v1/completions', // double slash
      '/v1//completions',
      '/V1/completions', // case
      '/v1/Completions',
      `http://127.0.0.1:${port}/v1/completions`, // absolute form
      '/v1/completions?x=1',
      '/v1/completions#frag',
    ];
    for (const t of targets) {
      const r = await raw(keyed.url, 'POST', t, completion);
      expect([400, 401, 404], `${t} -> ${r.status} ${r.body}`).toContain(r.status);
      expect(r.body).not.toContain('"choices"');
    }
    // The routes the router does match answer 401 in OpenAI's shape.
    for (const t of ['/v1/completions', '/%761/completions', '/v1/completions?x=1']) {
      const r = await raw(keyed.url, 'POST', t, completion);
      expect(r.status, t).toBe(401);
      expect(JSON.parse(r.body).error).toMatchObject({ type: 'authentication_error', code: 'invalid_api_key' });
    }
  });

  it('the key opens the route; a wrong key, a wrong scheme or a prefix of the key does not', async () => {
    const ok = await raw(keyed.url, 'POST', '/v1/completions', completion, { authorization: `Bearer ${KEY}` });
    expect(ok.status).toBe(200);
    const lower = await raw(keyed.url, 'POST', '/v1/completions', completion, { authorization: `bearer ${KEY}` });
    expect(lower.status).toBe(200);
    for (const auth of [`Bearer ${KEY}x`, `Bearer ${KEY.slice(0, -1)}`, `Basic ${KEY}`, KEY, 'Bearer ']) {
      const r = await raw(keyed.url, 'POST', '/v1/completions', completion, { authorization: auth });
      expect(r.status, auth).toBe(401);
    }
  });

  it('/metrics, /v1/memory and /v1/models need the key; /health stays open without details', async () => {
    for (const t of ['/metrics', '/v1/memory', '/v1/models', '/nope', '/%6detrics']) {
      const r = await raw(keyed.url, 'GET', t);
      expect(r.status, t).toBe(401);
    }
    const h = await raw(keyed.url, 'GET', '/health');
    expect(h.status).toBe(200);
    expect(JSON.parse(h.body)).toEqual({ status: 'ok' });
    const m = await raw(keyed.url, 'GET', '/metrics', undefined, { authorization: `Bearer ${KEY}` });
    expect(m.status).toBe(200);
  });
});

describe('the key from the environment, and a warning without one beyond loopback', () => {
  it('NERVA_API_KEY sets the key; listening on 0.0.0.0 without a key logs a warning', async () => {
    const lines: string[] = [];
    process.env.NERVA_API_KEY = 'sk-from-env';
    let s: RunningServer | undefined;
    try {
      s = await startServer({ ...DEFAULT_CONFIG, port: 0, backend: 'cpu' }, { log: (l) => lines.push(l) });
      expect(s.state.apiKey).toBe('sk-from-env');
      expect(lines.join('\n')).not.toContain('without an API key');
    } finally {
      delete process.env.NERVA_API_KEY;
      await s?.shutdown();
    }
    const wide = await startServer({ ...DEFAULT_CONFIG, host: '0.0.0.0', port: 0, backend: 'cpu' }, { log: (l) => lines.push(l) });
    await wide.shutdown();
    expect(lines.join('\n')).toMatch(/warning: listening on 0\.0\.0\.0 without an API key/);
  });
});

describe('browsers and other hosts', () => {
  it('a Host outside the allowlist (DNS rebinding) gets 403', async () => {
    for (const host of ['evil.example', 'evil.example:8000', '127.0.0.1.evil.example', 'localhost.', '[::2]:80']) {
      const r = await raw(open.url, 'POST', '/v1/completions', completion, { host });
      expect(r.status, `${host} -> ${r.body}`).toBe(403);
      expect(JSON.parse(r.body).error.code).toBe('host_not_allowed');
    }
    const local = await raw(open.url, 'GET', '/health', undefined, { host: `localhost:${new URL(open.url).port}` });
    expect(local.status).toBe(200);
  });

  it('only application/json bodies: a form or text/plain post (no CORS preflight) gets 415', async () => {
    for (const type of ['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x']) {
      const r = await raw(open.url, 'POST', '/v1/completions', completion, { 'content-type': type });
      expect(r.status, type).toBe(415);
      expect(JSON.parse(r.body).error.type).toBe('invalid_request_error');
    }
    const json = await raw(open.url, 'POST', '/v1/completions', completion, { 'content-type': 'application/json; charset=utf-8' });
    expect(json.status).toBe(200);
  });
});

describe('request budgets, checked before any work', () => {
  const post = (body: Record<string, unknown>) => raw(open.url, 'POST', '/v1/completions', JSON.stringify({ model: MODEL, prompt: 'x', max_tokens: 2, ...body }));

  it('one request cannot take the whole queue: sequences per request are capped', async () => {
    // Capacity 8 (4 running + 4 queued): a quarter per request.
    const r = await post({ n: 3 });
    expect(r.status).toBe(400);
    expect(JSON.parse(r.body).error).toMatchObject({ param: 'n', code: 'too_many_sequences' });
    const two = await post({ n: 2 });
    expect(two.status).toBe(200);
  });

  it('stop lists are bounded in count and length; stop_token_ids in count', async () => {
    expect((await post({ stop: Array.from({ length: 17 }, (_, i) => `s${i}`) })).status).toBe(400);
    expect((await post({ stop: ['x'.repeat(257)] })).status).toBe(400);
    expect((await post({ stop_token_ids: Array.from({ length: 257 }, (_, i) => i) })).status).toBe(400);
    expect((await post({ stop: Array.from({ length: 16 }, (_, i) => `s${i}`) })).status).toBe(200);
  });

  it('prompt characters are capped before tokenizing', async () => {
    const r = await post({ prompt: 'a'.repeat(256 * 1024 + 1) });
    expect(r.status).toBe(400);
    expect(JSON.parse(r.body).error.code).toBe('prompt_too_long');
  });

  it('a large prompt is tokenized off the event loop (the same ids)', async () => {
    const tok = open.state.engine!.tokenizer!;
    const prompt = 'the king and the queen spoke. '.repeat(6000);
    const spy = vi.spyOn(tok, 'encode');
    let r: Raw;
    try {
      r = await post({ prompt });
      expect(spy).not.toHaveBeenCalled();
    } finally {
      spy.mockRestore();
    }
    // Too long for the model: the error names the token count the worker found.
    expect(r.status).toBe(400);
    expect(JSON.parse(r.body).error.message).toContain(`${tok.encode(prompt).length} tokens`);
    const chat = await raw(open.url, 'POST', '/v1/chat/completions', JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: prompt }], max_tokens: 1 }));
    expect(chat.status).toBe(400);
    expect(JSON.parse(chat.body).error.message).toMatch(/\d+ tokens/);
  });

  it('client priority needs the operator to enable it', async () => {
    const r = await post({ priority: -1000000 });
    expect(r.status).toBe(400);
    expect(JSON.parse(r.body).error.param).toBe('priority');
    expect((await post({ priority: 0 })).status).toBe(200);
  });
});

describe('connections', () => {
  it('a client that never finishes its headers is cut after the headers timeout', async () => {
    const u = new URL(open.url);
    const t0 = Date.now();
    const closedAfter = await new Promise<number>((resolve, reject) => {
      const s = connect(Number(u.port), u.hostname, () => s.write('POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n'));
      s.on('error', () => {});
      s.resume();
      s.on('close', () => resolve(Date.now() - t0));
      setTimeout(() => reject(new Error('not closed within 10 s')), 10_000).unref();
    });
    expect(closedAfter).toBeLessThan(5000);
  });

  it('connections beyond max_connections are refused; the server still answers after', async () => {
    const u = new URL(open.url);
    const socks = await Promise.all(
      Array.from({ length: 12 }, () => new Promise<ReturnType<typeof connect>>((resolve) => {
        const s = connect(Number(u.port), u.hostname, () => resolve(s));
        s.on('error', () => {});
      })),
    );
    const closed = await Promise.all(socks.map((s) => new Promise<boolean>((resolve) => {
      if (s.destroyed) return resolve(true);
      s.once('close', () => resolve(true));
      setTimeout(() => resolve(false), 500).unref();
    })));
    expect(closed.filter(Boolean).length).toBeGreaterThanOrEqual(4);
    for (const s of socks) s.destroy();
    await new Promise((r) => setTimeout(r, 100));
    expect((await raw(open.url, 'GET', '/health')).status).toBe(200);
  });

  it('an SSE client that never reads is disconnected at the buffer cap', () => {
    // A response whose socket never drains: every write stays buffered.
    const res = { writableLength: 0, destroyed: false, writableEnded: false, write(chunk: string) {
      this.writableLength += Buffer.byteLength(chunk);
      return false;
    }, destroy() {
      this.destroyed = true;
    } };
    const sse = new SseWriter(res as unknown as ServerResponse, 4096);
    for (let i = 0; i < 1000 && !sse.closed; i++) sse.send({ text: 'x'.repeat(100) });
    expect(res.destroyed).toBe(true);
    expect(res.writableLength).toBeLessThan(4096 + 200);
  });
});
