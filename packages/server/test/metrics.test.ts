import { describe, expect, it } from 'vitest';
import type { MemoryReport } from '../src/memory-report.js';
import { ServerMetrics } from '../src/metrics.js';
import { promSeries as series } from './helpers.js';

/** A memory report as a tiered-KV engine on a device backend gives it (cumulative figures). */
function report(t: number): MemoryReport {
  const path = (bytes: number, ms: number) => ({ bytes, ms });
  return {
    fabric: 'DiscreteExplicit',
    mode: 'paged',
    tiers: [
      { tier: 'vram', budgetBytes: 1000, weightBytes: 600, stagingBytes: 100, kvBytes: 200, otherBytes: 50 },
      { tier: 'pinned', budgetBytes: 4000, weightBytes: 400, stagingBytes: 0, kvBytes: 800, otherBytes: 0 },
    ],
    weights: { totalBytes: 1000, hotBytes: 600, streamedBytes: 400, diskBytes: 0, hotBlocks: 3, streamedBlocks: 2, diskBlocks: 0, slots: 2, slotBytes: 200, streamedIds: ['layer.3', 'layer.4'] },
    moved: { h2d: path(400 * t, 2 * t), diskRead: path(0, 0), cpuCompute: path(0, 0) },
    streamedBytesPerPass: 400,
    prefetch: { hits: 2 * t, stalls: 1, stallMs: 0.5 },
    kv: {
      blockSize: 16,
      pageBytes: 10,
      tiers: { hot: { capacity: 20, used: 5 + t, bytes: 200 }, warm: { capacity: 80, used: 3 * t, bytes: 800 }, cold: { capacity: 0, used: 0, bytes: 0 } },
      demotions: 3 * t,
      promotions: t,
      moved: { d2h: path(30 * t, t), h2d: path(10 * t, 0.5 * t), diskWrite: path(0, 0), diskRead: path(0, 0) },
      tieredPasses: 7 * t,
      hostAttentionMs: 250 * t,
      swappedOut: 0,
      preemptions: 0,
      staging: { share: 1, capacityPages: 4, bytes: 80, stagedBytes: 1000 * t },
    },
    notes: [],
  };
}

describe('ServerMetrics.setMemory', () => {
  it('gauges take the report; counters follow its cumulative figures; nothing moves backwards', async () => {
    const m = new ServerMetrics('m');
    m.setMemory(report(1));
    let s = series(await m.text());
    expect(s.get('nerva:memory_tier_bytes{tier="vram",holder="kv"}')).toBe(200);
    expect(s.get('nerva:memory_tier_budget_bytes{tier="pinned"}')).toBe(4000);
    expect(s.get('nerva:weight_bytes{placement="streamed"}')).toBe(400);
    expect(s.get('nerva:weight_moved_bytes_total{path="h2d"}')).toBe(400);
    expect(s.get('nerva:weight_move_seconds_total{path="h2d"}')).toBe(0.002);
    expect(s.get('nerva:kv_pages{tier="warm"}')).toBe(3);
    expect(s.get('nerva:kv_page_demotions_total')).toBe(3);
    expect(s.get('nerva:kv_host_attention_seconds_total')).toBe(0.25);
    expect(s.get('nerva:kv_staged_bytes_total')).toBe(1000);

    m.setMemory(report(3));
    s = series(await m.text());
    expect(s.get('nerva:kv_pages{tier="warm"}')).toBe(9);
    expect(s.get('nerva:kv_page_demotions_total')).toBe(9);
    expect(s.get('nerva:kv_page_promotions_total')).toBe(3);
    expect(s.get('nerva:kv_moved_bytes_total{path="d2h"}')).toBe(90);
    expect(s.get('nerva:kv_tiered_passes_total')).toBe(21);
    expect(s.get('nerva:kv_host_attention_seconds_total')).toBe(0.75);
    expect(s.get('nerva:weight_prefetch_hits_total')).toBe(6);
    expect(s.get('nerva:weight_prefetch_stalls_total')).toBe(1);

    // Smaller cumulative figures (an engine started anew) never decrement a counter; they are
    // the new baseline its later growth counts from.
    m.setMemory(report(2));
    s = series(await m.text());
    expect(s.get('nerva:kv_page_demotions_total')).toBe(9);
    expect(s.get('nerva:kv_pages{tier="warm"}')).toBe(6);
    m.setMemory(report(4));
    expect(series(await m.text()).get('nerva:kv_page_demotions_total')).toBe(9 + 6);
  });
});
