// The heaps after garbage collection across rounds of mixed requests (a leak shows as growth per
// round): `nerva serve` in this process on the embedded model (CPU), each round 200 requests
// (completions, streamed chat, malformed bodies, n = 2 with logprobs), then garbage collected on
// the server's thread and in the engine's worker (its `heap` query), and both heaps read.
// One JSON line per round. Not in CI (a measurement; the fuzz test bounds memory there).
//   node --expose-gc --import tsx tools/soak/heap-rounds.ts [rounds, default 8]
import { DEFAULT_CONFIG, type ServerConfig, startServer } from '@nerva/server';

const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error('run with node --expose-gc');
const rounds = Number(process.argv[2] ?? 8);
const srv = await startServer({ ...DEFAULT_CONFIG, port: 0, backend: 'cpu', accessLog: false } as ServerConfig);
await srv.ready;
const mix = [
  { path: '/v1/completions', body: { prompt: 'the king', max_tokens: 2 } },
  { path: '/v1/chat/completions', body: { messages: [{ role: 'user', content: 'hello there' }], max_tokens: 2, stream: true } },
  { path: '/v1/completions', body: { prompt: 5 } },
  { path: '/v1/completions', body: { prompt: 'x', max_tokens: 'many' } },
  { path: '/v1/completions', body: { prompt: 'the queen', max_tokens: 2, logprobs: 2, n: 2, temperature: 1 } },
];
const mib = (b: number) => Math.round((b / 2 ** 20) * 100) / 100;
for (let round = 0; round < rounds; round++) {
  for (let i = 0; i < 200; i++) {
    const { path, body } = mix[i % mix.length];
    await (await fetch(srv.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })).text();
  }
  gc();
  await new Promise((r) => setTimeout(r, 200));
  gc();
  const m = process.memoryUsage();
  const engine = await srv.state.engine!.query('heap');
  console.log(
    JSON.stringify({ probe: 'heap_rounds', round, requests: (round + 1) * 200, heap_used_mib: mib(m.heapUsed), engine_heap_used_mib: mib(engine.usedBytes), rss_mib: mib(m.rss), external_mib: mib(m.external) }),
  );
}
process.exit(0);
