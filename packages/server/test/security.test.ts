import { request as httpRequest, type ServerResponse } from 'node:http';
import { EventEmitter } from 'node:events';
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { DEFAULT_CONFIG } from '../src/config.js';
import { type RunningServer, startServer } from '../src/server.js';
import { resolveSecurity } from '../src/security-options.js';
import { SLOW_CLIENT_ERROR, SseWriter } from '../src/sse.js';
import { OFF_THREAD_CHARS } from '../src/tokenize-pool.js';
import { MODEL, startTestServer } from './helpers.js';

/**
 * The server's security findings, one test each: the API key cannot be bypassed, hostile
 * requests are refused before they cost anything, and connections are bounded.
 */

const KEY = 'sk-security-test';
let keyed: RunningServer;
let open: RunningServer;
/** Capacity 4 (4 running, none queued), 2 sequences per client, client priorities on (default range). */
let fair: RunningServer;
beforeAll(async () => {
  [keyed, open, fair] = await Promise.all([
    startTestServer({ apiKey: KEY }),
    startTestServer({ maxNumSeqs: 4, maxQueue: 4, headersTimeoutS: 1, bodyTimeoutS: 2, maxConnections: 8, sseBufferBytes: 4096 }),
    startTestServer({ maxNumSeqs: 4, maxQueue: 0, maxSequencesPerClient: 2, allowClientPriority: true }),
  ]);
});
afterAll(async () => {
  await Promise.all([keyed?.shutdown(), open?.shutdown(), fair?.shutdown()]);
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

  it('short prompts tokenize on the event loop; from OFF_THREAD_CHARS of prompt text (prompts together) in the worker', async () => {
    const tok = open.state.engine!.tokenizer!;
    const spy = vi.spyOn(tok, 'encode');
    try {
      const short = 'the king and the queen spoke. '.slice(0, OFF_THREAD_CHARS - 1);
      const one = await post({ prompt: short });
      expect(one.status).toBe(200);
      expect(spy).toHaveBeenCalledTimes(1);
      spy.mockClear();
      // Two prompts, each shorter than the threshold, together past it: both in the worker, the same tokens.
      const part = 'KING: what news? '.repeat(4);
      expect(part.length < OFF_THREAD_CHARS && 2 * part.length >= OFF_THREAD_CHARS).toBe(true);
      const many = await post({ prompt: [part, part], max_tokens: 1, return_token_ids: true });
      expect(many.status).toBe(200);
      expect(spy).not.toHaveBeenCalled();
      const ids = (JSON.parse(many.body) as { choices: { prompt_token_ids: number[] }[] }).choices.map((c) => c.prompt_token_ids);
      spy.mockRestore();
      expect(ids).toEqual([tok.encode(part), tok.encode(part)]);
    } finally {
      spy.mockRestore();
    }
  });

  it('client priority needs the operator to enable it', async () => {
    const r = await post({ priority: -1000000 });
    expect(r.status).toBe(400);
    expect(JSON.parse(r.body).error.param).toBe('priority');
    expect((await post({ priority: 0 })).status).toBe(200);
  });

  it('an enabled client priority must lie in client_priority_range (default [0, 10]: no client gets ahead of the rest)', async () => {
    const on = (priority: number) => raw(fair.url, 'POST', '/v1/completions', JSON.stringify({ model: MODEL, prompt: 'x', max_tokens: 1, priority }));
    for (const p of [-1, -1000000, 11]) {
      const r = await on(p);
      expect(r.status, String(p)).toBe(400);
      const e = JSON.parse(r.body).error;
      expect(e).toMatchObject({ type: 'invalid_request_error', param: 'priority', code: 'priority_out_of_range' });
      expect(e.message).toContain('client_priority_range [0, 10]');
      expect(e.message).toContain(`got ${p}`);
    }
    for (const p of [0, 5, 10]) expect((await on(p)).status, String(p)).toBe(200);
    // A configured range replaces the default.
    expect(resolveSecurity({ clientPriorityRange: [-2, 5] }, '127.0.0.1').clientPriorityRange).toEqual([-2, 5]);
    expect(resolveSecurity({}, '127.0.0.1').clientPriorityRange).toEqual([0, 10]);
  });
});

describe('per-client budgets', () => {
  const body = (maxTokens: number, seed: number) => ({ model: MODEL, prompt: 'KING:', max_tokens: maxTokens, ignore_eos: true, seed });
  const from = (remoteAddress: string, payload: unknown) => fair.app.inject({ method: 'POST', url: '/v1/completions', payload: payload as object, remoteAddress });

  it("one client's flood is capped at its share; another client's request is still admitted", async () => {
    const admission = fair.state.admission!;
    expect(admission.perClient).toBe(2);
    // Client A floods with 6 requests: 2 are admitted (its share), 4 get 429 at once.
    const flood = Array.from({ length: 6 }, (_, i) => from('10.0.0.1', body(32, i)));
    const refused = await settle(flood, 4);
    expect(refused.map((r) => r.statusCode)).toEqual([429, 429, 429, 429]);
    expect(refused).toHaveLength(4);
    for (const r of refused) {
      const retry = Number(r.headers['retry-after']);
      expect(Number.isInteger(retry) && retry >= 1 && retry <= 60).toBe(true);
      expect(r.json().error).toMatchObject({ type: 'rate_limit_error', code: 'client_limit', param: null });
      expect(r.json().error.message).toContain('max_sequences_per_client');
    }
    expect(admission.heldBy('10.0.0.1')).toBe(2);
    // Client B, while A's two run: admitted and answered (without the per-client cap A's flood
    // would hold all 4 slots and B would get 429 queue_full).
    const b = await from('10.0.0.2', body(2, 99));
    expect(b.statusCode, b.body).toBe(200);
    expect(b.json().usage.completion_tokens).toBe(2);
    expect(admission.heldBy('10.0.0.1')).toBe(2);
    const done = await Promise.all(flood);
    expect(done.filter((r) => r.statusCode === 200)).toHaveLength(2);
    expect(admission.heldBy('10.0.0.1')).toBe(0);
    expect(admission.inFlight).toBe(0);
  });
});

/** Resolves with the first `k` of `ps` to settle. */
function settle<T>(ps: Promise<T>[], k: number): Promise<T[]> {
  const out: T[] = [];
  return new Promise((resolve, reject) => {
    for (const p of ps) {
      p.then((v) => {
        out.push(v);
        if (out.length === k) resolve(out);
      }, reject);
    }
  });
}

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

  it('an SSE client that stops reading: the request stops at the buffer cap, the connection closes after the grace period', () => {
    vi.useFakeTimers();
    try {
      for (const drains of [false, true]) {
        const res = new StuckResponse();
        const onOverflow = vi.fn();
        const sse = new SseWriter(res as unknown as ServerResponse, { maxBuffered: 4096, graceMs: 10_000, onOverflow });
        for (let i = 0; i < 1000; i++) sse.send({ text: 'x'.repeat(100) });
        // Stopped at the cap: told once, nothing written past it, the connection still open.
        expect(onOverflow).toHaveBeenCalledTimes(1);
        expect(sse.overflowed && sse.closed).toBe(true);
        expect(res.writableLength).toBeGreaterThan(4096);
        expect(res.writableLength).toBeLessThan(4096 + 200);
        sse.done();
        expect(res.writableEnded).toBe(false);
        if (drains) {
          // The client catches up within the grace period: it learns why its stream ended.
          vi.advanceTimersByTime(5_000);
          res.drain();
          expect(res.writableEnded).toBe(true);
          expect(res.text.endsWith(`data: ${JSON.stringify(SLOW_CLIENT_ERROR)}\n\ndata: [DONE]\n\n`)).toBe(true);
          vi.advanceTimersByTime(10_000);
          expect(res.destroyed).toBe(false);
        } else {
          vi.advanceTimersByTime(9_999);
          expect(res.destroyed).toBe(false);
          vi.advanceTimersByTime(1);
          expect(res.destroyed).toBe(true);
        }
      }
    } finally {
      vi.useRealTimers();
    }
  });
});

/** A response whose client does not read: every write stays buffered until `drain()`. */
class StuckResponse extends EventEmitter {
  writableLength = 0;
  destroyed = false;
  writableEnded = false;
  writableFinished = false;
  text = '';
  write(chunk: string): boolean {
    this.text += chunk;
    this.writableLength += Buffer.byteLength(chunk);
    return false;
  }
  end(chunk?: string): void {
    if (chunk !== undefined) this.write(chunk);
    this.writableEnded = true;
  }
  destroy(): void {
    this.destroyed = true;
    this.emit('close');
  }
  /** The client took everything. */
  drain(): void {
    this.writableLength = 0;
    this.emit('drain');
    if (this.writableEnded) this.writableFinished = true;
  }
}
