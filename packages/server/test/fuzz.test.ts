import { copyFile, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeSyntheticCheckpoint } from '@nerva/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defaultModelDir } from '../src/default-model.js';
import type { RunningServer } from '../src/server.js';
import { MODEL, startTestServer, waitAllFree } from './helpers.js';

/**
 * Fuzzing a live server with random and mutated OpenAI requests (types, sizes, unicode, nesting,
 * broken JSON, wrong content types and paths). Every answer must be a 2xx or a 4xx in OpenAI's
 * shape (or the documented 503); the server must not crash, its memory must stay bounded, and it
 * must still answer a normal request at the end. Deterministic: the requests come from a seeded
 * generator. Generation is kept cheap by the per-request token budget (max_request_tokens).
 */

const REQUESTS = 10_000;
const CONCURRENCY = 16;
const SEED = 20261128;

let server: RunningServer;
let dir: string;
beforeAll(async () => {
  // A one-layer model of the default model's shape family and tokenizer: generation is cheap, so
  // the run's time goes to the server's parsing, validation and error paths.
  dir = await mkdtemp(join(tmpdir(), 'nerva-fuzz-'));
  const base = JSON.parse(await readFile(join(defaultModelDir(), 'config.json'), 'utf8')) as Record<string, unknown>;
  await writeSyntheticCheckpoint({
    config: { ...base, num_hidden_layers: 1, hidden_size: 64, intermediate_size: 128, head_dim: 16, num_attention_heads: 4, num_key_value_heads: 2 },
    outDir: dir,
    dtype: 'f32',
  });
  for (const f of ['tokenizer.json', 'tokenizer_config.json', 'generation_config.json']) await copyFile(join(defaultModelDir(), f), join(dir, f));
  server = await startTestServer({ model: dir, servedModelName: MODEL, maxRequestTokens: 64, maxPromptChars: 256, bodyLimitBytes: 256 * 1024, maxNumSeqs: 8, maxQueue: 32, requestTimeoutS: 30 });
});
afterAll(async () => {
  await server?.shutdown();
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** mulberry32: a small seeded PRNG. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const UNICODE = ['', 'a', 'KING:', '\u0000', '\uD800', '\uDFFF', '😀', '\u202E', '\u200B', 'é', '日本語', '\uFFFD', '<|im_start|>', '<|endoftext|>', '{{ 7*7 }}', '{% for x in range(99999999) %}', '\\', '"', '\n\r\t'];

class Gen {
  constructor(readonly r: () => number) {}
  int(n: number): number {
    return Math.floor(this.r() * n);
  }
  pick<T>(xs: readonly T[]): T {
    return xs[this.int(xs.length)];
  }
  str(max = 64): string {
    const len = this.int(4) === 0 ? this.int(max * 64) : this.int(max);
    let s = '';
    while (s.length < len) s += this.int(3) === 0 ? this.pick(UNICODE) : String.fromCharCode(32 + this.int(95));
    return s;
  }
  /** Any JSON value, nested up to `depth`. */
  value(depth = 3): unknown {
    switch (this.int(depth > 0 ? 12 : 9)) {
      case 0:
        return null;
      case 1:
        return this.r() < 0.5;
      case 2:
        return this.int(10) - 3;
      case 3:
        return this.pick([0, -1, 1e9, -1e9, 2 ** 53, 1e308, -0, 0.5, 1e-300, 4096, 4097]);
      case 4:
      case 5:
        return this.str();
      case 6:
        return this.pick(UNICODE);
      case 7:
        return [];
      case 8:
        return {};
      case 9:
        return Array.from({ length: this.int(5) }, () => this.value(depth - 1));
      case 10:
        return Object.fromEntries(Array.from({ length: this.int(5) }, () => [this.str(8), this.value(depth - 1)]));
      default: {
        // Deep nesting: arrays within arrays.
        let v: unknown = 1;
        for (let i = 0, d = this.int(2000); i < d; i++) v = [v];
        return v;
      }
    }
  }
}

const FIELDS = [
  'model', 'prompt', 'messages', 'max_tokens', 'max_completion_tokens', 'temperature', 'top_p', 'top_k', 'min_p', 'n', 'stream', 'stream_options', 'stop',
  'stop_token_ids', 'seed', 'logprobs', 'top_logprobs', 'presence_penalty', 'frequency_penalty', 'repetition_penalty', 'min_tokens', 'ignore_eos', 'priority',
  'return_token_ids', 'nerva', 'chat_template_kwargs', 'tools', 'logit_bias', 'cache_salt', 'include_stop_str_in_output', 'echo', 'user', '__proto__', 'constructor',
];

function validBody(g: Gen, chat: boolean): Record<string, unknown> {
  const b: Record<string, unknown> = { model: MODEL, max_tokens: 1 + g.int(2) };
  if (chat) b.messages = [{ role: g.pick(['user', 'system', 'assistant']), content: g.str(12) || 'hi' }, { role: 'user', content: g.str(12) || 'hi' }];
  else b.prompt = g.int(4) === 0 ? [g.int(4096), g.int(4096)] : g.str(12) || 'x';
  if (g.int(3) === 0) b.temperature = g.r() * 2;
  if (g.int(4) === 0) b.stream = true;
  if (g.int(6) === 0) b.n = 1 + g.int(2);
  if (g.int(8) === 0) b.logprobs = chat ? true : g.int(3);
  if (g.int(8) === 0) b.stop = [g.str(4)];
  return b;
}

interface FuzzRequest {
  method: string;
  path: string;
  headers: Record<string, string>;
  body?: string | Uint8Array;
}

/** Percent-encode every UTF-8 byte (lone surrogates become U+FFFD, as a client would send). */
const pct = (s: string): string => [...Buffer.from(s, 'utf8')].map((b) => `%${b.toString(16).padStart(2, '0')}`).join('');

function fuzzRequest(g: Gen): FuzzRequest {
  const chat = g.r() < 0.5;
  let path = chat ? '/v1/chat/completions' : '/v1/completions';
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  const b = validBody(g, chat);
  // Mutations: a few per request.
  for (let k = 0, m = g.int(4); k < m; k++) {
    const f = g.pick(FIELDS);
    const op = g.int(4);
    if (op === 0) delete b[f];
    else b[f] = g.value();
  }
  // Keep generation bounded: a max_tokens that survived as a number is clamped.
  if (typeof b.max_tokens === 'number' && b.max_tokens > 4) b.max_tokens = 4;
  let body: string | Uint8Array = JSON.stringify(b);
  switch (g.int(24)) {
    case 0:
      body = body.slice(0, g.int(body.length)); // truncated JSON
      break;
    case 1:
      body = Uint8Array.from({ length: g.int(256) }, () => g.int(256)); // random bytes
      break;
    case 2:
      headers['content-type'] = g.pick(['text/plain', 'application/x-www-form-urlencoded', 'application/jsonx', '', 'application/json; charset=latin1']);
      break;
    case 3:
      path = g.pick(['/v1/models', '/v1/memory', '/metrics', '/health', '/v1/', '/%', '/v1/completions/../completions', '/' + pct(g.str(20)), '/v1/chat/completions?x=' + pct(g.str(10))]);
      break;
    case 4:
      body = JSON.stringify(g.value(4)); // any JSON at all
      break;
    case 5:
      body = '{"model":"' + MODEL + '","prompt":"' + 'x'.repeat(g.int(300_000)) + '"}'; // maybe past the body limit
      break;
    default:
      break;
  }
  const method = g.int(40) === 0 ? g.pick(['GET', 'PUT', 'DELETE', 'PATCH', 'OPTIONS']) : 'POST';
  return { method, path, headers, body: method === 'GET' ? undefined : body };
}

describe('fuzz', () => {
  it(`${REQUESTS} random and mutated requests: no 5xx but 503, no crash, bounded memory, a normal request answered at the end`, async () => {
    const g = new Gen(rng(SEED));
    const reqs = Array.from({ length: REQUESTS }, () => fuzzRequest(g));
    const byStatus = new Map<number, number>();
    const msByStatus = new Map<number, number>();
    const bad: string[] = [];
    global.gc?.();
    const rss0 = process.memoryUsage().rss;
    // RSS once the heap has warmed up (a fifth of the requests): the rest must not keep growing it.
    let rssWarm = rss0;
    let next = 0;
    const t0 = Date.now();
    const worker = async () => {
      for (;;) {
        const i = next++;
        if (i >= reqs.length) return;
        if (i === Math.floor(reqs.length / 5)) rssWarm = process.memoryUsage().rss;
        const q = reqs[i];
        let status = 0;
        let text = '';
        const tq = performance.now();
        try {
          const r = await fetch(server.url + q.path, { method: q.method, headers: q.headers, body: q.body });
          status = r.status;
          text = await r.text();
        } catch (e) {
          bad.push(`#${i} ${q.method} ${q.path}: ${(e as Error).message}`);
          continue;
        }
        byStatus.set(status, (byStatus.get(status) ?? 0) + 1);
        msByStatus.set(status, (msByStatus.get(status) ?? 0) + performance.now() - tq);
        if (status >= 500 && status !== 503) bad.push(`#${i} ${q.method} ${q.path} -> ${status}: ${text.slice(0, 300)}`);
        if (status >= 400 && q.method !== 'HEAD') {
          let shape = false;
          try {
            const j = JSON.parse(text) as { error?: { message?: unknown; type?: unknown } };
            shape = typeof j.error?.message === 'string' && typeof j.error?.type === 'string';
          } catch {
            shape = false;
          }
          if (!shape) bad.push(`#${i} ${q.method} ${q.path} -> ${status} not in OpenAI's error shape: ${text.slice(0, 200)}`);
        }
      }
    };
    await Promise.all(Array.from({ length: CONCURRENCY }, worker));
    const seconds = (Date.now() - t0) / 1000;
    console.log(`fuzz: ${REQUESTS} requests in ${seconds.toFixed(1)} s; by status ${JSON.stringify(Object.fromEntries([...byStatus].sort((a, b) => a[0] - b[0])))}`);
    console.log(`fuzz: mean ms by status ${JSON.stringify(Object.fromEntries([...msByStatus].map(([k, v]) => [k, Math.round(v / byStatus.get(k)!)])))}`);
    // One example of each kind of failure (status and start of the answer).
    const kinds = new Map(bad.map((b) => [b.replace(/^#\d+ /, '').slice(0, 120), b]));
    expect([...kinds.values()].slice(0, 20)).toEqual([]);
    // Some requests must have reached generation, or the fuzz only tested the validator.
    expect(byStatus.get(200) ?? 0).toBeGreaterThan(REQUESTS / 20);
    // A normal request still works, and nothing is held.
    const ok = await fetch(`${server.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, prompt: 'KING:', max_tokens: 4 }) });
    expect(ok.status).toBe(200);
    const m = await waitAllFree(server.url);
    expect(m.kv_blocks_used).toBe(0);
    expect(m.server_sequences_in_flight).toBe(0);
    expect(m.kv_invariants).toBe('ok');
    global.gc?.();
    const rss = process.memoryUsage().rss;
    const mib = (b: number) => Math.round(b / 2 ** 20);
    console.log(`fuzz: RSS ${mib(rss0)} MiB at start, ${mib(rssWarm)} after a fifth of the requests, ${mib(rss)} at the end`);
    expect(mib(rss - rss0)).toBeLessThan(768);
    expect(mib(rss - rssWarm)).toBeLessThan(384);
  });
});
