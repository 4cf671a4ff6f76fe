import { afterAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../src/server.js';
import { MODEL, promSeries, startTestServer } from './helpers.js';

/**
 * A VRAM budget below the weights: the memory OS keeps some layer blocks hot in the compute tier
 * and streams the rest through staging slots. On the CPU backend the compute tier is host memory;
 * the budget still applies to it, and the tokens are those of the resident engine.
 */
const KV = 2 * 2 ** 20;
let resident: RunningServer | undefined;
let paged: RunningServer | undefined;
let staged: RunningServer | undefined;
afterAll(async () => {
  await resident?.shutdown();
  await paged?.shutdown();
  await staged?.shutdown();
});

const memory = async (s: RunningServer) => (await (await fetch(`${s.url}/v1/memory`)).json()) as Record<string, any>;
const complete = async (s: RunningServer, prompt: string) => {
  const r = await fetch(`${s.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt, max_tokens: 10, temperature: 0, ignore_eos: true, return_token_ids: true }),
  });
  expect(r.status).toBe(200);
  return ((await r.json()) as { choices: { token_ids: number[]; text: string }[] }).choices[0];
};

describe('serve with vram_budget', () => {
  it('streams the weights that do not fit, reports tiers, paths and prefetch, and gives the resident tokens', async () => {
    resident = await startTestServer({ kvCacheBytes: KV });
    const r = await memory(resident);
    const dram = r.tiers.find((t: { tier: string }) => t.tier === 'dram');
    // Room for the KV cache, the activations and three quarters of the weights: some must stream.
    const budget = dram.kv_cache_bytes + dram.other_bytes + Math.floor(0.75 * r.weights.total_bytes);
    expect(budget).toBeLessThan(dram.kv_cache_bytes + dram.other_bytes + r.weights.total_bytes);
    const want = await complete(resident, 'ROMEO:');

    paged = await startTestServer({ kvCacheBytes: KV, vramBudget: budget });
    const before = await memory(paged);
    expect(before.mode).toBe('paged');
    expect(before.vram_budget_bytes).toBe(budget);
    expect(before.tiers.find((t: { tier: string }) => t.tier === 'dram').budget_bytes).toBe(budget);
    const w = before.weights;
    expect(w.total_bytes).toBe(r.weights.total_bytes);
    expect(w.hot_bytes).toBeLessThan(w.total_bytes);
    expect(w.hot_bytes + w.streamed_bytes).toBe(w.total_bytes);
    expect(w.streamed_blocks).toBeGreaterThan(0);
    expect(w.slots).toBeGreaterThan(0);
    expect(before.streamed_bytes_per_pass).toBe(w.streamed_bytes);
    expect(before.notes.length).toBeGreaterThan(0);

    const got = await complete(paged, 'ROMEO:');
    expect(got.token_ids).toEqual(want.token_ids);
    expect(got.text).toBe(want.text);

    const after = await memory(paged);
    const moved = (m: Record<string, any>) => m.moved.h2d.bytes + m.moved.disk_read.bytes + m.moved.cpu_compute.bytes;
    // Ten tokens are ten passes, each streaming every streamed block by some path.
    expect(moved(after) - moved(before)).toBeGreaterThan(0);
    expect(after.prefetch.hits + after.prefetch.stalls).toBeGreaterThan(before.prefetch.hits + before.prefetch.stalls);
    expect(after.kv_blocks_used).toBe(0);

    // /metrics: the same placement and traffic as Prometheus series.
    const series = promSeries(await (await fetch(`${paged.url}/metrics`)).text());
    const now = await memory(paged);
    expect(series.get('nerva:weight_bytes{placement="streamed"}')).toBe(now.weights.streamed_bytes);
    expect(series.get('nerva:weight_bytes{placement="hot"}')).toBe(now.weights.hot_bytes);
    // A path nothing moved by has no series yet (a labelled counter appears with its first increment).
    for (const [path, t] of Object.entries(now.moved as Record<string, { bytes: number }>))
      expect(series.get(`nerva:weight_moved_bytes_total{path="${path}"}`) ?? 0, path).toBe(t.bytes);
    expect(series.get('nerva:weight_prefetch_hits_total')).toBe(now.prefetch.hits);
    expect(series.get('nerva:weight_prefetch_stalls_total')).toBe(now.prefetch.stalls);
  });
});

describe('serve with pipeline stages under stage_vram_budgets', () => {
  it('places the layers by budget, all resident: /v1/memory lists each stage with its layers and budget, the tokens are one stage\'s', async () => {
    const one = await startTestServer({ kvCacheBytes: KV });
    let want: { token_ids: number[] };
    let weights: number;
    try {
      want = await complete(one, 'ROMEO:');
      weights = (await memory(one)).weights.total_bytes;
    } finally {
      await one.shutdown();
    }
    // A small stage 0 and a large stage 1: stage 0 takes fewer layers.
    const budgets = [Math.floor(0.5 * weights) + 8 * 2 ** 20, weights + 8 * 2 ** 20];
    staged = await startTestServer({ kvCacheBytes: KV, pipelineParallel: 2, stageVramBudgets: budgets });
    const m = await memory(staged);
    expect(m.mode).toBe('resident');
    expect(m.devices.map((d: { budget_bytes: number }) => d.budget_bytes)).toEqual(budgets);
    const [a, b] = m.devices as { layers: [number, number]; weight_bytes: number; kv_bytes: number; budget_bytes: number }[];
    expect(a.layers[0]).toBe(0);
    expect(b.layers[0]).toBe(a.layers[1]);
    expect(a.layers[1] - a.layers[0]).toBeLessThan(b.layers[1] - b.layers[0]);
    expect((await complete(staged, 'ROMEO:')).token_ids).toEqual(want.token_ids);
  });
});
