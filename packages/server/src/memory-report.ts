import type { WorkerEngineStats } from '@nerva/engine';

/** The memory OS report (`@nerva/memos` MemoryReport), as the engine gives it. */
export type MemoryReport = WorkerEngineStats['memory'];

/** Milliseconds to the microsecond: enough for a report, and stable to read. */
const ms = (v: number): number => Math.round(v * 1000) / 1000;

/** One path's traffic in snake case. */
export interface PathTrafficJson {
  bytes: number;
  ms: number;
}

/** The memory OS report in the snake-case JSON of `GET /v1/memory`, `nerva run --json` and `nerva-bench offload`. */
export interface MemoryReportJson {
  mode: MemoryReport['mode'];
  fabric: MemoryReport['fabric'];
  weights: {
    total_bytes: number;
    hot_bytes: number;
    streamed_bytes: number;
    disk_bytes: number;
    hot_blocks: number;
    streamed_blocks: number;
    disk_blocks: number;
    slots: number;
  };
  moved: { h2d: PathTrafficJson; disk_read: PathTrafficJson; cpu_compute: PathTrafficJson };
  streamed_bytes_per_pass: number;
  prefetch: { hits: number; stalls: number; stall_ms: number };
  notes: string[];
}

/** One tier: its budget and what holds its bytes. */
export interface TierJson {
  tier: string;
  budget_bytes: number;
  weights_bytes: number;
  staging_bytes: number;
  kv_cache_bytes: number;
  /** KV bytes held by live or cached sequences (`GET /v1/memory` only). */
  kv_used_bytes?: number;
  other_bytes: number;
}

/** Everything but the tiers, in snake case. */
export function memoryReportJson(r: MemoryReport): MemoryReportJson {
  const w = r.weights;
  const path = (p: { bytes: number; ms: number }): PathTrafficJson => ({ bytes: p.bytes, ms: ms(p.ms) });
  return {
    mode: r.mode,
    fabric: r.fabric,
    weights: {
      total_bytes: w.totalBytes,
      hot_bytes: w.hotBytes,
      streamed_bytes: w.streamedBytes,
      disk_bytes: w.diskBytes,
      hot_blocks: w.hotBlocks,
      streamed_blocks: w.streamedBlocks,
      disk_blocks: w.diskBlocks,
      slots: w.slots,
    },
    moved: { h2d: path(r.moved.h2d), disk_read: path(r.moved.diskRead), cpu_compute: path(r.moved.cpuCompute) },
    streamed_bytes_per_pass: r.streamedBytesPerPass,
    prefetch: { hits: r.prefetch.hits, stalls: r.prefetch.stalls, stall_ms: ms(r.prefetch.stallMs) },
    notes: [...r.notes],
  };
}

/**
 * The report's tiers in snake case. With `kvUsedFraction` (KV blocks in use over all blocks), each
 * tier's KV bytes are split into used and free (`kv_used_bytes`).
 */
export function tiersJson(r: MemoryReport, kvUsedFraction?: number): TierJson[] {
  return r.tiers.map((t) => ({
    tier: t.tier,
    budget_bytes: t.budgetBytes,
    weights_bytes: t.weightBytes,
    staging_bytes: t.stagingBytes,
    kv_cache_bytes: t.kvBytes,
    ...(kvUsedFraction !== undefined ? { kv_used_bytes: Math.round(t.kvBytes * kvUsedFraction) } : {}),
    other_bytes: t.otherBytes,
  }));
}
