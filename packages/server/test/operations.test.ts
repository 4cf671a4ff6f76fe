import { afterAll, describe, expect, it } from 'vitest';
import { DEFAULT_CONFIG } from '../src/config.js';
import { startServer, type RunningServer } from '../src/server.js';
import { MODEL, parseSse, waitAllFree } from './helpers.js';

let server: RunningServer;
afterAll(async () => {
  await server?.shutdown();
});

const post = (path: string, body: unknown) =>
  fetch(server.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });

/** The value of one sample line of the Prometheus text, by its exact name+labels prefix. */
function sample(text: string, prefix: string): number {
  const line = text.split('\n').find((l) => l.startsWith(prefix));
  if (!line) throw new Error(`no metric line starting with ${prefix}`);
  return Number(line.slice(line.lastIndexOf(' ') + 1));
}

describe('operations', () => {
  it('/health is 503 while the model loads (the port is open first), 200 when ready', async () => {
    server = await startServer({ ...DEFAULT_CONFIG, port: 0, backend: 'cpu' });
    const early = await fetch(`${server.url}/health`);
    expect(early.status).toBe(503);
    expect(await early.json()).toEqual({ status: 'loading' });
    const gen = await post('/v1/completions', { model: MODEL, prompt: 'x' });
    expect([503, 200]).toContain(gen.status);
    await server.ready;
    expect((await fetch(`${server.url}/health`)).status).toBe(200);
  });

  it('/v1/memory reports weights and KV tiers and the memory OS report (resident without a budget)', async () => {
    const m = (await (await fetch(`${server.url}/v1/memory`)).json()) as Record<string, any>;
    expect(m.weights_bytes).toBeGreaterThan(1_000_000);
    expect(m.kv_blocks_total).toBeGreaterThan(0);
    expect(m.kv_blocks_free).toBe(m.kv_blocks_total);
    // The CPU backend computes in host memory: one tier holds the weights and the KV pages.
    const dram = m.tiers.find((t: { tier: string }) => t.tier === 'dram');
    expect(dram).toMatchObject({ tier: 'dram', weights_bytes: m.weights_bytes, kv_cache_bytes: m.kv_cache_bytes, kv_used_bytes: 0, staging_bytes: 0 });
    expect(dram.budget_bytes).toBeGreaterThanOrEqual(m.weights_bytes + m.kv_cache_bytes);
    expect(dram.other_bytes).toBeGreaterThanOrEqual(0);
    expect(m.mode).toBe('resident');
    expect(m.fabric).toBe('CoherentSharedPhysical');
    expect(m.vram_budget_bytes).toBeNull();
    expect(m.weights).toMatchObject({ total_bytes: m.weights_bytes, hot_bytes: m.weights_bytes, streamed_bytes: 0, disk_bytes: 0, streamed_blocks: 0, disk_blocks: 0, slots: 0 });
    expect(m.weights.hot_blocks).toBeGreaterThan(0);
    expect(m.streamed_bytes_per_pass).toBe(0);
    for (const path of ['h2d', 'disk_read', 'cpu_compute']) {
      expect(m.moved[path], path).toEqual({ bytes: expect.any(Number), ms: expect.any(Number) });
    }
    // Nothing streams when every weight is resident.
    expect(m.moved.h2d.bytes).toBe(0);
    expect(m.moved.disk_read.bytes).toBe(0);
    expect(m.prefetch).toEqual({ hits: 0, stalls: 0, stall_ms: 0 });
    expect(Array.isArray(m.notes)).toBe(true);
    // This machine's fabric, whatever its /sys holds (a CI container may have no PCI tree at all).
    const f = m.fabric_topology;
    expect(Object.keys(f).sort()).toEqual(
      ['classification', 'degraded', 'device_kind', 'gpus', 'iommu', 'nics', 'notes', 'numa_nodes', 'nvidia_driver', 'nvlink', 'peer_memory', 'rdma_nics', 'runtime_probe', 'source', 'summary'].sort(),
    );
    expect(['sysfs', 'unavailable']).toContain(f.source);
    expect(f.summary).toMatch(/^fabric: /);
    expect(f.device_kind).toBe('cpu');
    expect(f.runtime_probe).toBeNull();
    // No CUDA probe of NVLink exists: never claimed.
    expect(f.nvlink).toBe('unknown');
    expect(Array.isArray(f.gpus) && Array.isArray(f.notes) && Array.isArray(f.peer_memory)).toBe(true);
    // The CPU backend moves nothing between devices.
    expect(f.degraded).toEqual([]);
    // The worker reports the backend's capabilities: the CPU backend declares a coherent shared memory.
    expect(f.classification).toMatchObject({ fabric: expect.any(String), hardware_fabric: expect.any(String), backend_fabric: 'CoherentSharedPhysical', gpu_direct_pairs: 0 });
    if (f.source === 'unavailable') {
      expect(f.summary).toBe('fabric: unknown (no sysfs PCI tree)');
      expect(f.classification.hardware_fabric).toBe('unknown');
      expect(f.notes.length).toBeGreaterThan(0);
    }
  });

  it('/metrics carries the nerva: names with values that match the traffic', async () => {
    const N = 5;
    let completion = 0;
    for (let i = 0; i < N; i++) {
      const r = (await (await post('/v1/completions', { model: MODEL, prompt: `Line ${i}`, max_tokens: 4, ignore_eos: true, nerva: { ledger: true } })).json()) as any;
      completion += r.usage.completion_tokens;
      expect(r.choices[0].nerva_ledger.tokens).toBe(4);
    }
    await waitAllFree(server.url);
    const text = await (await fetch(`${server.url}/metrics`)).text();
    for (const name of [
      'num_requests_running',
      'num_requests_waiting',
      'kv_cache_usage_perc',
      'prefix_cache_queries',
      'prefix_cache_hits',
      'num_preemptions',
      'prompt_tokens',
      'generation_tokens',
      'request_success',
      'time_to_first_token_seconds',
      'inter_token_latency_seconds',
      'e2e_request_latency_seconds',
      'request_queue_time_seconds',
      'request_prefill_time_seconds',
      'request_decode_time_seconds',
      'request_prompt_tokens',
      'request_generation_tokens',
      'iteration_tokens_total',
    ]) {
      expect(text, name).toMatch(new RegExp(`^# TYPE nerva:${name}`, 'm'));
    }
    const m = `{model_name="${MODEL}"}`;
    expect(sample(text, `nerva:request_success_total{finished_reason="length",model_name="${MODEL}"}`)).toBe(N);
    expect(sample(text, `nerva:generation_tokens_total${m}`)).toBe(completion);
    expect(sample(text, `nerva:time_to_first_token_seconds_count${m}`)).toBe(N);
    expect(sample(text, `nerva:inter_token_latency_seconds_count${m}`)).toBe(N * 3);
    expect(sample(text, `nerva:request_generation_tokens_sum${m}`)).toBe(completion);
    expect(sample(text, `nerva:num_requests_running${m}`)).toBe(0);
    expect(sample(text, `nerva:kv_cache_usage_perc${m}`)).toBe(0);
    expect(sample(text, `nerva:prompt_tokens_total${m}`)).toBeGreaterThanOrEqual(N);
    const e2e = sample(text, `nerva:e2e_request_latency_seconds_sum${m}`);
    expect(e2e).toBeGreaterThan(0);
    expect(e2e).toBeLessThan(60);
    // The memory OS report as series, equal to GET /v1/memory's: every weight hot (resident).
    const mem = (await (await fetch(`${server.url}/v1/memory`)).json()) as any;
    expect(sample(text, `nerva:weight_bytes{placement="hot",model_name="${MODEL}"}`)).toBe(mem.weights.hot_bytes);
    expect(sample(text, `nerva:weight_bytes{placement="streamed",model_name="${MODEL}"}`)).toBe(0);
    for (const t of mem.tiers as { tier: string; budget_bytes: number; weights_bytes: number }[]) {
      expect(sample(text, `nerva:memory_tier_budget_bytes{tier="${t.tier}",model_name="${MODEL}"}`), t.tier).toBe(t.budget_bytes);
      expect(sample(text, `nerva:memory_tier_bytes{tier="${t.tier}",holder="weights",model_name="${MODEL}"}`), t.tier).toBe(t.weights_bytes);
    }
    // Without tiered KV there are no KV tier series with values.
    expect(text).not.toMatch(/^nerva:kv_pages\{/m);
  });

  it('shutdown drains: an in-flight stream finishes, new requests are refused, then the port closes', async () => {
    const streaming = post('/v1/completions', { model: MODEL, prompt: 'Exeunt', max_tokens: 12, ignore_eos: true, stream: true });
    // Wait until the request is admitted before shutting down.
    while (server.state.admission!.inFlight === 0) await new Promise((r) => setTimeout(r, 5));
    const res = await streaming;
    const closing = server.shutdown();
    const refused = await post('/v1/completions', { model: MODEL, prompt: 'x', max_tokens: 1 }).then(
      (r) => r.status,
      () => 'connection refused',
    );
    expect([503, 'connection refused']).toContain(refused);
    const evs = parseSse(await res.text());
    expect(evs.at(-1)).toBe('[DONE]');
    const finish = evs.flatMap((e) => (e === '[DONE]' ? [] : e.choices)).find((c: any) => c.finish_reason);
    expect(finish.finish_reason).toBe('length');
    await closing;
    await expect(fetch(`${server.url}/health`)).rejects.toThrow();
  });
});
