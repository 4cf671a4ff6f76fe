import { Worker } from 'node:worker_threads';

/** What the streaming clients are asked to do. */
export interface ClientPlan {
  /** The server's base URL (http://host:port). */
  url: string;
  model: string;
  /** Streams open at once. */
  concurrency: number;
  /** The warm-up's requests, all at once, outside the figures. */
  warm: { prompt: number[]; maxTokens: number }[];
  /** Token-id prompts, one per measured request, each for `maxTokens` tokens. */
  prompts: number[][];
  maxTokens: number;
}

/** One streamed completion as its client saw it (client clock, ms). */
export interface RequestResult {
  ok: boolean;
  tokens: number;
  ttftMs?: number;
  firstMs?: number;
  lastMs?: number;
  gapsMs: number[];
}

export interface ClientRun {
  results: RequestResult[];
  wallMs: number;
}

/**
 * The clients' loop. It runs in a worker thread of its own, so what the clients cost (HTTP
 * parsing, JSON, timing) does not take the server's event loop as a client in the same thread
 * would; its source is sent as text (new Worker(..., { eval: true })), so it uses nothing but
 * Node's built-ins and works from a bundle as from the sources. Warm-up first (every request of
 * `warm` at once), then 'start', then `concurrency` closed-loop streams over `prompts`; posts the
 * results.
 */
function clientMain(): void {
  const { workerData, parentPort } = process.getBuiltinModule('node:worker_threads');
  const http = process.getBuiltinModule('node:http');
  const plan = workerData as ClientPlan;
  const base = new URL(plan.url);
  const agent = new http.Agent({ keepAlive: true, maxSockets: Math.max(1, plan.concurrency) });
  const one = (prompt: number[], seed: number, maxTokens: number): Promise<RequestResult> => {
    const res: RequestResult = { ok: false, tokens: 0, gapsMs: [] };
    const body = JSON.stringify({ model: plan.model, prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, seed, stream: true, return_token_ids: true });
    return new Promise((resolve) => {
      const t0 = performance.now();
      let buf = '';
      let sawDone = false;
      const req = http.request(
        { host: base.hostname, port: base.port, path: '/v1/completions', method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
        (r) => {
          if (r.statusCode !== 200) {
            r.resume();
            r.on('end', () => resolve(res));
            return;
          }
          r.setEncoding('utf8');
          r.on('data', (part: string) => {
            buf += part;
            let cut: number;
            while ((cut = buf.indexOf('\n\n')) >= 0) {
              const line = buf.slice(0, cut).trim();
              buf = buf.slice(cut + 2);
              if (!line.startsWith('data: ')) continue;
              const data = line.slice(6);
              if (data === '[DONE]') {
                sawDone = true;
                continue;
              }
              const chunk = JSON.parse(data) as { error?: unknown; choices?: { token_ids?: number[] }[] };
              if (chunk.error) {
                r.destroy();
                return;
              }
              let n = 0;
              for (const c of chunk.choices ?? []) n += c.token_ids?.length ?? 0;
              if (n === 0) continue;
              const now = performance.now();
              if (res.ttftMs === undefined) {
                res.ttftMs = now - t0;
                res.firstMs = now;
              } else res.gapsMs.push(now - res.lastMs!);
              res.lastMs = now;
              res.tokens += n;
            }
          });
          r.on('end', () => {
            res.ok = sawDone;
            resolve(res);
          });
          r.on('error', () => resolve(res));
        },
      );
      req.on('error', () => resolve(res));
      req.end(body);
    });
  };
  void (async () => {
    await Promise.all(plan.warm.map((w) => one(w.prompt, 0, w.maxTokens)));
    parentPort!.postMessage({ type: 'start' });
    const results: RequestResult[] = [];
    let next = 0;
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: Math.min(plan.concurrency, plan.prompts.length) }, async () => {
        while (next < plan.prompts.length) {
          const i = next++;
          const r = await one(plan.prompts[i], i, plan.maxTokens);
          results.push(r);
        }
      }),
    );
    const wallMs = performance.now() - t0;
    agent.destroy();
    parentPort!.postMessage({ type: 'done', results, wallMs });
  })();
}

/** Run the clients of `plan` in a worker thread; `onStart` is called when the measured part begins. */
export function runClients(plan: ClientPlan, onStart: () => void): Promise<ClientRun> {
  // A transpiler that names functions (keepNames) calls __name: harmless here.
  const source = `const __name = (f) => f;\n(${clientMain.toString()})();`;
  const w = new Worker(source, { eval: true, workerData: plan });
  return new Promise<ClientRun>((resolve, reject) => {
    w.on('message', (m: { type: 'start' } | ({ type: 'done' } & ClientRun)) => {
      if (m.type === 'start') onStart();
      else {
        resolve({ results: m.results, wallMs: m.wallMs });
        void w.terminate();
      }
    });
    w.on('error', reject);
    w.on('exit', (code) => reject(new Error(`the serve probe's client thread exited with code ${code} before it reported`)));
  });
}
