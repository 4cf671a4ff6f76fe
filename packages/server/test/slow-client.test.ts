import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../src/server.js';
import { MODEL, parseSse, promSeries, startTestServer, waitAllFree } from './helpers.js';

/**
 * A streaming client that stops reading: its request is stopped once more than sse_buffer_bytes
 * wait for it (the generation aborted, its KV freed) and its connection closed after the grace
 * period, while other requests finish.
 *
 * The kernel takes several MiB of a connection's output before anything waits in the server
 * (on loopback: the receiver's buffer and a send buffer of up to tcp_wmem's 4 MiB), more than
 * the tiny model generates in a test's time. So the stream opens with a burst larger than that:
 * `echo` of 1024 choices of a 500-token prompt of the longest token (15 characters), ~7.7 MB.
 * A reader takes the burst (a reading client of the same stream measures it first); for the
 * client that never reads it stays queued, and the tokens that follow push the queue past a cap
 * set just above the burst (each stream takes the cap in force when it starts).
 */

// " Northumberland", the tokenizer's longest token.
const PROMPT = Array.from({ length: 500 }, () => 3019);
const PROMPTS = 8;
const N = 128;
const SEQUENCES = PROMPTS * N;
const request = (maxTokens: number) => ({
  model: MODEL,
  prompt: Array.from({ length: PROMPTS }, () => PROMPT),
  n: N,
  echo: true,
  max_tokens: maxTokens,
  ignore_eos: true,
  stream: true,
  seed: 1,
});

let server: RunningServer;
beforeAll(async () => {
  server = await startTestServer({
    maxNumSeqs: 128,
    maxQueue: 1024,
    maxSequencesPerRequest: SEQUENCES,
    // Every request here comes from 127.0.0.1.
    maxSequencesPerClient: 2 * SEQUENCES,
    // Until the reading client has shown how large the burst is (the test then sets the cap).
    sseBufferBytes: 64 << 20,
    sseGraceS: 0,
  });
});
afterAll(async () => {
  await server?.shutdown();
});

const metric = async (name: string): Promise<number> => promSeries(await (await fetch(`${server.url}/metrics`)).text()).get(name) ?? 0;

/** A connection that sends `body` as a POST and never reads the answer. */
function neverReads(body: unknown): Promise<Socket> {
  const u = new URL(server.url);
  const json = JSON.stringify(body);
  return new Promise((resolve) => {
    const s = connect(Number(u.port), u.hostname, () => {
      s.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(json)}\r\n\r\n${json}`);
      resolve(s);
    });
    s.pause();
    s.on('error', () => {});
  });
}

describe('a streaming client that stops reading', () => {
  it('is stopped at sse_buffer_bytes and disconnected; other requests finish', async () => {
    // A reading client gets the whole stream, burst and tokens.
    const r = await fetch(`${server.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(request(1)) });
    expect(r.status).toBe(200);
    const text = await r.text();
    const blocks = text.split('\n\n');
    const echoed = blocks.slice(0, SEQUENCES).map((b) => JSON.parse(b.slice('data: '.length)) as { choices: { text: string }[] });
    expect(echoed.every((e) => e.choices[0].text.length === 15 * PROMPT.length)).toBe(true);
    const evs = parseSse(text);
    expect(evs.at(-1)).toBe('[DONE]');
    expect(evs.some((e) => e !== '[DONE]' && 'error' in e)).toBe(false);
    // The cap for the rest: the burst, with room for its HTTP framing and some tokens.
    const burst = blocks.slice(0, SEQUENCES).reduce((n, b) => n + Buffer.byteLength(b) + 2, 0);
    expect(burst).toBeGreaterThan(7 << 20);
    server.state.security.sseBufferBytes = burst + (32 << 10);
    await waitAllFree(server.url);
    const before = await metric('nerva:generation_tokens_total');

    // The same stream to a client that never reads, and meanwhile another client's request.
    const sock = await neverReads(request(16));
    const closed = new Promise<void>((resolve) => sock.once('close', () => resolve()));
    const other = await fetch(`${server.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'KING:', max_tokens: 8, ignore_eos: true, stream: true }),
    });
    expect(other.status).toBe(200);
    const otherEvs = parseSse(await other.text());
    expect(otherEvs.at(-1)).toBe('[DONE]');
    expect((otherEvs.at(-2) as { choices: { finish_reason: string }[] }).choices[0].finish_reason).toBe('length');

    // Stopped: counted, every KV block back, far fewer tokens than the request asked for.
    for (let i = 0; i < 600 && (await metric('nerva:stream_slow_client_aborts_total')) === 0; i++) await new Promise((res) => setTimeout(res, 100));
    expect(await metric('nerva:stream_slow_client_aborts_total')).toBe(1);
    const m = await waitAllFree(server.url);
    expect(m.kv_blocks_used).toBe(0);
    expect(m.server_sequences_in_flight).toBe(0);
    expect(m.kv_invariants).toBe('ok');
    expect((await metric('nerva:generation_tokens_total')) - before).toBeLessThan(SEQUENCES * 16);
    // And disconnected (grace 0): reading now finds the connection closed, the stream without [DONE].
    let got = '';
    sock.on('data', (c: Buffer) => (got += c.toString('latin1')));
    sock.resume();
    await closed;
    expect(got).not.toContain('[DONE]');
    // The server still serves.
    const after = await fetch(`${server.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, prompt: 'x', max_tokens: 2 }) });
    expect(after.status).toBe(200);
  });
});
