import { DEFAULT_CONFIG, type ServerConfig } from '../src/config.js';
import { startServer, type RunningServer } from '../src/server.js';

/** A real server on loopback port 0, the default model on the CPU backend, loaded. */
export async function startTestServer(over: Partial<ServerConfig> = {}): Promise<RunningServer> {
  const s = await startServer({ ...DEFAULT_CONFIG, port: 0, backend: 'cpu', ...over });
  await s.ready;
  return s;
}

export interface Memory {
  kv_blocks_total: number;
  kv_blocks_free: number;
  kv_blocks_used: number;
  kv_sequences: number;
  kv_invariants?: string;
  server_sequences_in_flight: number;
  num_requests_running: number;
  num_requests_waiting: number;
}

/** GET /v1/memory with the KV invariant check. */
export async function memory(url: string, headers: Record<string, string> = {}): Promise<Memory> {
  const r = await fetch(`${url}/v1/memory?check=1`, { headers });
  if (r.status !== 200) throw new Error(`/v1/memory answered ${r.status}: ${await r.text()}`);
  return (await r.json()) as Memory;
}

/** Poll until every KV block is free again (aborts are processed between engine steps). */
export async function waitAllFree(url: string, headers: Record<string, string> = {}, timeoutMs = 20_000): Promise<Memory> {
  const t0 = Date.now();
  for (;;) {
    const m = await memory(url, headers);
    if ((m.kv_blocks_used === 0 && m.kv_sequences === 0 && m.server_sequences_in_flight === 0) || Date.now() - t0 > timeoutMs) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Parse an SSE body into its `data:` payloads (JSON objects, and the literal [DONE]). */
export function parseSse(body: string): (Record<string, any> | '[DONE]')[] {
  const out: (Record<string, any> | '[DONE]')[] = [];
  for (const block of body.split('\n\n')) {
    const line = block.trim();
    if (!line) continue;
    if (!line.startsWith('data: ')) throw new Error(`not an SSE data line: ${line}`);
    const data = line.slice(6);
    out.push(data === '[DONE]' ? '[DONE]' : (JSON.parse(data) as Record<string, any>));
  }
  return out;
}

export const MODEL = 'tiny-shakespeare-qwen3';

/**
 * Prometheus text as series: `name{labels}` (labels in their printed order, `model_name` left
 * out) -> value. A series without labels but model_name is keyed by its name alone.
 */
export function promSeries(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    const m = /^(nerva:[a-z_]+)(?:\{([^}]*)\})? (\S+)$/.exec(line);
    if (!m) continue;
    const labels = (m[2] ?? '')
      .split(',')
      .filter((l) => l && !l.startsWith('model_name='))
      .join(',');
    out.set(labels ? `${m[1]}{${labels}}` : m[1], Number(m[3]));
  }
  return out;
}
