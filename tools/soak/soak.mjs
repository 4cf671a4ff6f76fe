#!/usr/bin/env node
// Soak test of a running `nerva serve` (not run in CI): mixed load for a while, with clients that
// disconnect mid-stream and malformed requests, then a report: requests, errors by code, the
// server's RSS and GPU memory at start and end, and leaked KV blocks once idle (must be 0).
//
//   node tools/soak/soak.mjs --url http://127.0.0.1:8000 --pid <server pid> [--minutes 30]
//        [--concurrency 32] [--model NAME] [--out soak.json] [--stop-file PATH]
//   --stop-file: the load ends early once PATH exists (a machine lent for less than the run);
//   the report's minutes_run says how long it ran.
//   API key: $NERVA_API_KEY. Exit status 1 when a KV block leaked, the KV invariants fail, or an
//   answer was a 5xx other than 503. Plain Node 20, no dependencies.
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('--') ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
const url = args.url ?? 'http://127.0.0.1:8000';
const minutes = Number(args.minutes ?? 30);
const concurrency = Number(args.concurrency ?? 32);
const pid = args.pid ? Number(args.pid) : undefined;
const stopFile = args['stop-file'];
const running = () => Date.now() < deadline && !(stopFile && existsSync(stopFile));
const key = process.env.NERVA_API_KEY;
const auth = key ? { authorization: `Bearer ${key}` } : {};

function rssMiB() {
  if (!pid) return null;
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : null;
}

function gpuMiB() {
  try {
    const out = execFileSync('nvidia-smi', ['--query-gpu=memory.used', '--format=csv,noheader,nounits'], { encoding: 'utf8' });
    return out.trim().split('\n').map(Number);
  } catch {
    return null;
  }
}

async function memory() {
  const r = await fetch(`${url}/v1/memory?check=1`, { headers: auth });
  return r.json();
}

const model = args.model ?? (await (await fetch(`${url}/v1/models`, { headers: auth })).json()).data[0].id;
const byCode = new Map();
let requests = 0;
const count = (k) => byCode.set(k, (byCode.get(k) ?? 0) + 1);
const rand = (n) => Math.floor(Math.random() * n);
const words = 'the king and the queen of the realm spoke of war and peace in the long night'.split(' ');
const text = (n) => Array.from({ length: n }, () => words[rand(words.length)]).join(' ');

/** One request of the mix; returns the status (or a name for a client-side end). */
async function one() {
  const kind = rand(100);
  const headers = { 'content-type': 'application/json', ...auth };
  let path = '/v1/completions';
  let body;
  if (kind < 10) {
    // Malformed: broken JSON, wrong types, wrong content type.
    body = [`{"model": "${model}", "prompt": `, JSON.stringify({ model, prompt: 5 }), JSON.stringify({ model, prompt: 'x', max_tokens: 'many' })][rand(3)];
    if (rand(4) === 0) headers['content-type'] = 'text/plain';
  } else if (kind < 40) {
    path = '/v1/chat/completions';
    body = JSON.stringify({ model, messages: [{ role: 'user', content: text(5 + rand(200)) }], max_tokens: 16 + rand(256), temperature: Math.random(), stream: rand(2) === 0 });
  } else if (kind < 50) {
    // Several samples, sometimes with logprobs and penalties (host sampling rows).
    body = JSON.stringify({ model, prompt: text(20 + rand(100)), n: 1 + rand(8), max_tokens: 32 + rand(64), temperature: 1, logprobs: rand(2) ? 2 : undefined, presence_penalty: rand(2) ? 0.5 : undefined });
  } else if (kind < 55) {
    // Long prompt.
    body = JSON.stringify({ model, prompt: text(1000 + rand(3000)), max_tokens: 8 });
  } else {
    // Some at temperature 100: near-uniform sampling reaches the padded vocabulary rows (ids the
    // tokenizer lacks), which must never be sampled.
    const temperature = [0, 0.8, 100][rand(3)];
    body = JSON.stringify({ model, prompt: text(5 + rand(400)), max_tokens: 16 + rand(512), temperature, stream: rand(2) === 0 });
  }
  const ac = new AbortController();
  // A quarter of the requests are abandoned by their client part-way (mid-stream disconnects).
  const abandon = rand(4) === 0;
  const timer = abandon ? setTimeout(() => ac.abort(), 50 + rand(3000)) : undefined;
  try {
    const r = await fetch(url + path, { method: 'POST', headers, body, signal: ac.signal });
    await r.text();
    return r.status;
  } catch (e) {
    return ac.signal.aborted ? 'client_abort' : `client_error:${e.cause?.code ?? e.message}`;
  } finally {
    clearTimeout(timer);
  }
}

const start = { at: new Date().toISOString(), rssMiB: rssMiB(), gpuMiB: gpuMiB(), memory: await memory() };
const began = Date.now();
const deadline = began + minutes * 60_000;
const samples = [];
const sampler = setInterval(async () => {
  try {
    const m = await memory();
    samples.push({ t: Math.round((Date.now() - began) / 1000), rssMiB: rssMiB(), gpuMiB: gpuMiB(), kvUsed: m.kv_blocks_used, inFlight: m.server_sequences_in_flight });
  } catch (e) {
    samples.push({ error: e.message });
  }
}, 30_000);

await Promise.all(
  Array.from({ length: concurrency }, async () => {
    while (running()) {
      const s = await one();
      requests++;
      count(String(s));
    }
  }),
);
clearInterval(sampler);
const minutesRun = (Date.now() - began) / 60_000;

// Idle: every sequence must end and free its KV blocks.
let idle;
for (let i = 0; i < 120; i++) {
  idle = await memory();
  if (idle.kv_blocks_used === 0 && idle.server_sequences_in_flight === 0) break;
  await new Promise((r) => setTimeout(r, 500));
}
const end = { at: new Date().toISOString(), rssMiB: rssMiB(), gpuMiB: gpuMiB(), memory: idle };
const errors5xx = [...byCode].filter(([k]) => /^5\d\d$/.test(k) && k !== '503');
const report = {
  url,
  minutes,
  minutes_run: Math.round(minutesRun * 100) / 100,
  concurrency,
  requests,
  by_code: Object.fromEntries([...byCode].sort()),
  rss_mib: { start: start.rssMiB, end: end.rssMiB },
  gpu_mib: { start: start.gpuMiB, end: end.gpuMiB },
  leaked_kv_blocks: idle.kv_blocks_used,
  sequences_in_flight_at_end: idle.server_sequences_in_flight,
  kv_invariants: idle.kv_invariants ?? null,
  samples,
};
const line = JSON.stringify(report, null, 2);
console.log(line);
if (args.out) writeFileSync(args.out, line + '\n');
process.exit(idle.kv_blocks_used !== 0 || (idle.kv_invariants ?? 'ok') !== 'ok' || errors5xx.length > 0 ? 1 : 0);
