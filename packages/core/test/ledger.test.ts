import { describe, expect, it } from 'vitest';
import { emptySyncCounts, LedgerAggregator, percentile, type TokenLedgerRecord } from '../src/index.js';

const rec = (step: number, wallMs: number, extra: Partial<TokenLedgerRecord> = {}): TokenLedgerRecord => ({
  seq: 1,
  step,
  tokenId: step,
  phase: step === 0 ? 'prefill' : 'decode',
  wallMs,
  sampleMs: 0.5,
  launches: 0,
  graphReplays: step === 0 ? 0 : 1,
  syncs: { ...emptySyncCounts(), policy: 1 },
  h2dBytes: 8,
  d2hBytes: 4,
  d2dBytes: 0,
  allocatorCalls: 0,
  hotPathAllocations: 0,
  ...extra,
});

describe('LedgerAggregator', () => {
  it('summarises tokens, percentiles, syncs by kind and the warm hot path', () => {
    const l = new LedgerAggregator();
    l.add(rec(0, 50, { allocatorCalls: 3 }));
    for (let i = 1; i <= 100; i++) l.add(rec(i, i, i === 1 ? { allocatorCalls: 2 } : {}));
    l.note('backend fallback: cuda -> cpu');
    const s = l.summary();
    expect(s.tokens).toBe(101);
    expect(s.prefill_tokens).toBe(1);
    expect(s.decode_tokens).toBe(100);
    expect(s.ms_per_token_p50).toBe(50);
    expect(s.ms_per_token_p99).toBe(99);
    expect(s.graph_replays_per_decode_token).toBe(1);
    expect(s.syncs.policy).toBe(101);
    expect(s.syncs_per_decode_token.policy).toBe(1);
    expect(s.allocator_calls).toBe(5);
    // Allocations at prefill and on the first decode step are warm-up, not hot path.
    expect(s.hot_path_allocations).toBe(0);
    l.add(rec(101, 1, { allocatorCalls: 1 }));
    expect(l.summary().hot_path_allocations).toBe(1);
    expect(s.notes).toEqual(['backend fallback: cuda -> cpu']);
    expect(JSON.parse(JSON.stringify(s))).toEqual(s);
  });

  it('sums host compute near data (cpuActiveMs) where measured, and leaves it out where not', () => {
    const l = new LedgerAggregator();
    l.add(rec(0, 5));
    expect(l.summary().cpu_active_ms_total).toBeUndefined();
    l.add(rec(1, 5, { cpuActiveMs: 1.25 }));
    l.add(rec(2, 5, { cpuActiveMs: 0.5, deviceActiveMs: 2 }));
    const s = l.summary();
    expect(s.cpu_active_ms_total).toBe(1.75);
    expect(s.device_active_ms_total).toBe(2);
  });

  it('percentile of an empty list is 0 and of one value is that value', () => {
    expect(percentile([], 0.5)).toBe(0);
    expect(percentile([7], 0.99)).toBe(7);
  });
});
