import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { DEFAULT_CONFIG } from '../src/config.js';
import { defaultModelDir } from '../src/default-model.js';
import { ConfigError } from '../src/errors.js';
import { startServer, type RunningServer } from '../src/server.js';
import { MODEL, promSeries, startTestServer } from './helpers.js';

/**
 * Tiered KV through the server: a hot KV pool of a few pages (the attention sinks and the recent
 * window), the rest of each sequence's pages warm in host memory, attended there and merged. The
 * tokens are those of the all-hot server; GET /v1/memory shows the pages by tier.
 */
const cfg = JSON.parse(readFileSync(join(defaultModelDir(), 'config.json'), 'utf8'));
/** One KV page on the CPU backend: 16 tokens of float32 K and V for every layer. */
const PB = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4 * 16;

const servers: RunningServer[] = [];
const dir = mkdtempSync(join(tmpdir(), 'nerva-kv-memory-'));
afterAll(async () => {
  for (const s of servers) await s.shutdown();
  rmSync(dir, { recursive: true, force: true });
});
const start = async (over: Parameters<typeof startTestServer>[0]) => {
  const s = await startTestServer(over);
  servers.push(s);
  return s;
};

const memory = async (s: RunningServer) => {
  const r = await fetch(`${s.url}/v1/memory?check=1`);
  expect(r.status).toBe(200);
  return (await r.json()) as Record<string, any>;
};
// 80 tokens of prompt + 12 generated: 6 pages of 16, more than a 5-page hot pool's 4.
const PROMPT = Array.from({ length: 80 }, (_, i) => 1 + ((i * 131 + 7) % 4000));
/** The server's /metrics as series (name with its labels but model_name) -> value. */
const scrape = async (s: RunningServer) => promSeries(await (await fetch(`${s.url}/metrics`)).text());
const complete = async (s: RunningServer) => {
  const r = await fetch(`${s.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt: PROMPT, max_tokens: 12, temperature: 0, ignore_eos: true, return_token_ids: true }),
  });
  expect(r.status).toBe(200);
  return ((await r.json()) as { choices: { token_ids: number[]; text: string }[] }).choices[0];
};

describe('serve with kv_vram_budget', () => {
  it('gives the all-hot tokens and GET /v1/memory shows the kv budgets and pages per tier', async () => {
    const hot = await start({});
    const want = await complete(hot);
    const m0 = await memory(hot);
    expect(m0.kv).toBeNull();
    expect(m0.kv_vram_budget_bytes).toBeNull();
    expect(m0.kv_host_budget_bytes).toBeNull();
    expect(m0.kv_offload_dir).toBeNull();

    const s = await start({ kvVramBudget: 5 * PB, kvHostBudget: 16 * PB, kvOffloadDir: dir });
    const before = await memory(s);
    expect(before.kv_vram_budget_bytes).toBe(5 * PB);
    expect(before.kv_host_budget_bytes).toBe(16 * PB);
    expect(before.kv_offload_dir).toBe(dir);
    expect(before.kv.page_bytes).toBe(PB);
    expect(before.kv.block_size).toBe(16);
    expect(before.kv.tiers.hot).toMatchObject({ capacity_pages: 4, used_pages: 0, bytes: 5 * PB });
    expect(before.kv.tiers.warm).toMatchObject({ capacity_pages: 16, used_pages: 0, bytes: 16 * PB });
    expect(before.kv.tiers.cold).toMatchObject({ capacity_pages: 4 * (5 + 16), used_pages: 0 });
    expect(before.kv.demotions).toBe(0);
    // The cold file is unlinked once open (nothing stays after a crash): the directory looks empty.
    expect(readdirSync(dir)).toEqual([]);

    const got = await complete(s);
    expect(got.token_ids).toEqual(want.token_ids);
    expect(got.text).toBe(want.text);

    const after = await memory(s);
    expect(after.kv_invariants).toBe('ok');
    const kv = after.kv;
    // The prefix cache keeps the finished sequence's pages: at most 4 hot, the rest warm.
    expect(kv.tiers.hot.used_pages).toBeLessThanOrEqual(4);
    expect(kv.tiers.warm.used_pages).toBeGreaterThan(0);
    expect(kv.tiers.hot.used_pages + kv.tiers.warm.used_pages + kv.tiers.cold.used_pages).toBeLessThanOrEqual(Math.ceil((PROMPT.length + 12) / 16));
    expect(kv.demotions).toBeGreaterThan(0);
    expect(kv.moved.d2h.bytes).toBe(kv.demotions * PB);
    expect(kv.tiered_passes).toBeGreaterThanOrEqual(11);
    // The CPU backend does not measure its host partials apart from the rest of its compute.
    expect(kv.host_attention_ms).toBeNull();
    expect(kv.preemptions).toBe(0);
    expect(after.kv_blocks_used).toBe(0);
    expect(after.num_requests_running).toBe(0);

    // /metrics carries the same figures as Prometheus series.
    const series = await scrape(s);
    for (const tier of ['hot', 'warm', 'cold'] as const) {
      expect(series.get(`nerva:kv_pages{tier="${tier}"}`), tier).toBe(kv.tiers[tier].used_pages);
      expect(series.get(`nerva:kv_pages_capacity{tier="${tier}"}`), tier).toBe(kv.tiers[tier].capacity_pages);
    }
    expect(series.get('nerva:kv_page_demotions_total')).toBe(kv.demotions);
    expect(series.get('nerva:kv_page_promotions_total') ?? 0).toBe(kv.promotions);
    expect(series.get('nerva:kv_moved_bytes_total{path="d2h"}')).toBe(kv.moved.d2h.bytes);
    expect(series.get('nerva:kv_tiered_passes_total')).toBe(kv.tiered_passes);
    // Counters only grow: a second scrape after another request is at least the first.
    await complete(s);
    const again = await scrape(s);
    expect(again.get('nerva:kv_tiered_passes_total')!).toBeGreaterThan(series.get('nerva:kv_tiered_passes_total')!);
    expect(again.get('nerva:kv_page_demotions_total')!).toBeGreaterThanOrEqual(series.get('nerva:kv_page_demotions_total')!);
    expect(again.get('nerva:kv_tiered_passes_total')).toBe((await memory(s)).kv.tiered_passes);

    await s.shutdown();
    servers.splice(servers.indexOf(s), 1);
    // Disposing the engine removes the cold tier's file.
    expect(readdirSync(dir)).toEqual([]);
  });

  it('concurrent requests whose pages together exceed the hot pool: the all-hot outputs, every page back', async () => {
    const prompts = [0, 1, 2, 3, 4, 5].map((k) => Array.from({ length: 24 + 7 * k }, (_, i) => 1 + ((i * 97 + 31 * k) % 4000)));
    const ask = async (s: RunningServer, prompt: number[]) => {
      const r = await fetch(`${s.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt, max_tokens: 10, temperature: 0, ignore_eos: true, return_token_ids: true }),
      });
      expect(r.status).toBe(200);
      return ((await r.json()) as { choices: { token_ids: number[] }[] }).choices[0].token_ids;
    };
    const hot = servers[0] ?? (await start({}));
    const want = await Promise.all(prompts.map((p) => ask(hot, p)));
    // 8 hot pages (7 usable) for six sequences of 3 to 5 pages each.
    const s = await start({ kvVramBudget: 8 * PB });
    const got = await Promise.all(prompts.map((p) => ask(s, p)));
    expect(got).toEqual(want);
    const m = await memory(s);
    expect(m.kv_invariants).toBe('ok');
    expect(m.kv_host_budget_bytes).toBeNull();
    // The warm pool defaults to 8x the hot one.
    expect(m.kv.tiers.warm.capacity_pages).toBe(64);
    expect(m.kv.demotions).toBeGreaterThan(0);
    expect(m.kv.tiered_passes).toBeGreaterThan(0);
    expect(m.kv_blocks_used).toBe(0);
    expect(m.kv_sequences).toBe(0);
    // The compute tier's KV bytes are the hot pool's, and what is used of them never exceeds it.
    const dram = m.tiers.find((t: { tier: string }) => t.tier === 'dram');
    expect(dram.kv_cache_bytes).toBe(8 * PB);
    expect(dram.kv_used_bytes).toBeLessThanOrEqual(dram.kv_cache_bytes);
  });

  it('a kv_vram_budget too small for one sequence is one clear load error; a warm budget without it is a config error', async () => {
    const s = await startServer({ ...DEFAULT_CONFIG, port: 0, backend: 'cpu', kvVramBudget: 1 });
    servers.push(s);
    const err = await s.ready.then(
      () => undefined,
      (e: Error) => e,
    );
    expect(err?.message).toMatch(/^kvVramBudget 1 bytes holds 0 KV pages of \d+ bytes; .* use at least \d+ bytes$/);
    expect(err?.message).toContain(`use at least ${5 * PB} bytes`);
    const health = await fetch(`${s.url}/health`);
    expect(health.status).toBe(503);
    expect(await health.json()).toEqual({ status: 'failed', error: err!.message });

    const bad = await startServer({ ...DEFAULT_CONFIG, port: 0, backend: 'cpu', kvHostBudget: 2 ** 30 }).catch((e: unknown) => e);
    expect(bad).toBeInstanceOf(ConfigError);
    expect((bad as ConfigError).key).toBe('kv_host_budget');
  });
});
