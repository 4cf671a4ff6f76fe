import { DEFAULT_CONFIG, startServer } from '@nerva/server';

export interface ServeProbeOptions {
  model?: string;
  backend: 'cpu' | 'cuda' | 'auto';
  /** Clients streaming at once. */
  concurrency: number;
  /** Requests in all (default: one per client). */
  requests?: number;
  maxTokens: number;
}

interface RequestResult {
  ok: boolean;
  tokens: number;
  ttftMs?: number;
  gapsMs: number[];
}

function percentile(xs: number[], p: number): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return Math.round(s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] * 100) / 100;
}

/** One streaming completion; times are measured by the client, as a user would see them. */
async function oneRequest(url: string, model: string, i: number, maxTokens: number): Promise<RequestResult> {
  const t0 = performance.now();
  const res: RequestResult = { ok: false, tokens: 0, gapsMs: [] };
  try {
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model, prompt: `Request ${i}:`, max_tokens: maxTokens, ignore_eos: true, seed: i, stream: true, return_token_ids: true }),
    });
    if (r.status !== 200 || !r.body) return res;
    const decoder = new TextDecoder();
    let buf = '';
    let last = 0;
    let sawDone = false;
    for await (const part of r.body) {
      buf += decoder.decode(part as Uint8Array, { stream: true });
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
        if (chunk.error) return res;
        const n = chunk.choices?.reduce((a, c) => a + (c.token_ids?.length ?? 0), 0) ?? 0;
        if (n === 0) continue;
        const now = performance.now();
        if (res.ttftMs === undefined) res.ttftMs = now - t0;
        else res.gapsMs.push(now - last);
        last = now;
        res.tokens += n;
      }
    }
    res.ok = sawDone;
  } catch {
    res.ok = false;
  }
  return res;
}

/**
 * Serving throughput: an in-process server on a free loopback port, `concurrency` streaming
 * clients in closed loop until `requests` are done. TTFT and inter-token latency as clients see them.
 */
export async function serveProbe(o: ServeProbeOptions): Promise<Record<string, unknown>> {
  // The probe's clients share one address: the per-client cap must let all of them in.
  const server = await startServer({ ...DEFAULT_CONFIG, model: o.model, backend: o.backend, port: 0, maxQueue: Math.max(256, o.concurrency), maxSequencesPerClient: Math.max(1, o.concurrency) });
  try {
    await server.ready;
    const model = server.state.modelName;
    // Warm-up, outside the figures.
    await oneRequest(server.url, model, -1, 2);
    const total = o.requests ?? o.concurrency;
    let next = 0;
    const results: RequestResult[] = [];
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: Math.min(o.concurrency, total) }, async () => {
        while (next < total) results.push(await oneRequest(server.url, model, next++, o.maxTokens));
      }),
    );
    const wallS = (performance.now() - t0) / 1000;
    const tokens = results.reduce((a, r) => a + r.tokens, 0);
    const ttft = results.flatMap((r) => (r.ttftMs === undefined ? [] : [r.ttftMs]));
    const itl = results.flatMap((r) => r.gapsMs);
    return {
      probe: 'serve',
      model: server.state.modelDir,
      backend: server.state.engine?.info.backendName,
      concurrency: o.concurrency,
      requests: total,
      max_tokens: o.maxTokens,
      wall_s: Math.round(wallS * 1000) / 1000,
      output_tokens: tokens,
      output_tokens_per_s: Math.round((tokens / wallS) * 100) / 100,
      requests_per_s: Math.round((results.filter((r) => r.ok).length / wallS) * 1000) / 1000,
      ttft_ms_p50: percentile(ttft, 50),
      ttft_ms_p99: percentile(ttft, 99),
      itl_ms_p50: percentile(itl, 50),
      itl_ms_p99: percentile(itl, 99),
      errors: results.filter((r) => !r.ok).length,
      notes: [...(server.state.engine?.info.notes ?? [])],
    };
  } finally {
    await server.shutdown();
  }
}
