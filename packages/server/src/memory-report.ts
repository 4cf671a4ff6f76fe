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
  /** The deployment mode ('resident', 'paged', each '+quant' for block-quantized weights) and the rule that chose it. */
  deployment?: MemoryReport['deployment'];
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
    /**
     * How the weights are stored: the checkpoint's file and tensor types, the bytes the backend
     * holds by dtype, and exact false for block-quantized weights (exact with respect to the
     * dequantized weights only).
     */
    format?: { file: 'safetensors' | 'gguf'; types: Record<string, number>; stored_bytes: Record<string, number>; exact: boolean };
  };
  moved: { h2d: PathTrafficJson; disk_read: PathTrafficJson; cpu_compute: PathTrafficJson };
  streamed_bytes_per_pass: number;
  prefetch: { hits: number; stalls: number; stall_ms: number };
  /** KV pages by tier, present when the engine runs tiered KV (`kv_vram_budget`). */
  kv?: KvReportJson;
  /** Per device of a split model (tensor-parallel shards, or pipeline stages with their layers and any budget): its backend (and ordinal), weight and KV bytes. */
  devices?: { backend: string; device?: number; layers?: [number, number]; weight_bytes: number; kv_bytes: number; budget_bytes?: number }[];
  notes: string[];
}

/** One KV tier's pages: how many it can hold, how many hold K/V now, and its reserved bytes. */
export interface KvTierPagesJson {
  capacity_pages: number;
  used_pages: number;
  bytes: number;
}

/** The engine's tiered-KV report (`@nerva/memos` KvMemoryReport) in snake case. */
export interface KvReportJson {
  block_size: number;
  /** Bytes of one page: block_size tokens of K and V for every layer. */
  page_bytes: number;
  /** hot: the compute tier's KV pool; warm: pinned host memory; cold: a file in kv_offload_dir. */
  tiers: { hot: KvTierPagesJson; warm: KvTierPagesJson; cold: KvTierPagesJson };
  /** Pages moved down a tier (hot -> warm, warm -> cold) and back up, since start. */
  demotions: number;
  promotions: number;
  /** Page moves by path since start: device to host, host to device, and the cold file. */
  moved: { d2h: PathTrafficJson; h2d: PathTrafficJson; disk_write: PathTrafficJson; disk_read: PathTrafficJson };
  /** Forward passes whose attention merged host partials over warm pages. */
  tiered_passes: number;
  /** Host CPU milliseconds spent on those partials (attention over warm pages), since start; null where not measured apart (CPU backend). */
  host_attention_ms: number | null;
  /** Sequences swapped out to the cold tier instead of preempted by recompute. */
  swapped_out: number;
  /** Sequences preempted by recompute. */
  preemptions: number;
  /** With a link share (kv_warm_link_share, or the engine's default on a GPU): the share, the VRAM staging warm pages stream through (pages per layer, bytes) and the bytes staged since start. */
  staging: { share: number; capacity_pages: number; bytes: number; staged_bytes: number } | null;
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
    ...(r.deployment ? { deployment: { ...r.deployment } } : {}),
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
      ...(w.format ? { format: { file: w.format.file, types: { ...w.format.types }, stored_bytes: { ...w.format.storedBytes }, exact: w.format.exact } } : {}),
    },
    moved: { h2d: path(r.moved.h2d), disk_read: path(r.moved.diskRead), cpu_compute: path(r.moved.cpuCompute) },
    streamed_bytes_per_pass: r.streamedBytesPerPass,
    prefetch: { hits: r.prefetch.hits, stalls: r.prefetch.stalls, stall_ms: ms(r.prefetch.stallMs) },
    ...(r.kv ? { kv: kvReportJson(r.kv) } : {}),
    ...(r.devices
      ? {
          devices: r.devices.map((d) => ({
            backend: d.backend,
            ...(d.device !== undefined ? { device: d.device } : {}),
            ...(d.layers ? { layers: d.layers } : {}),
            weight_bytes: d.weightBytes,
            kv_bytes: d.kvBytes,
            ...(d.budgetBytes !== undefined ? { budget_bytes: d.budgetBytes } : {}),
          })),
        }
      : {}),
    notes: [...r.notes],
  };
}

/** The tiered-KV section of the memory report in snake case. */
export function kvReportJson(kv: NonNullable<MemoryReport['kv']>): KvReportJson {
  const path = (p: { bytes: number; ms: number }): PathTrafficJson => ({ bytes: p.bytes, ms: ms(p.ms) });
  const tier = (t: { capacity: number; used: number; bytes: number }): KvTierPagesJson => ({ capacity_pages: t.capacity, used_pages: t.used, bytes: t.bytes });
  return {
    block_size: kv.blockSize,
    page_bytes: kv.pageBytes,
    tiers: { hot: tier(kv.tiers.hot), warm: tier(kv.tiers.warm), cold: tier(kv.tiers.cold) },
    demotions: kv.demotions,
    promotions: kv.promotions,
    moved: { d2h: path(kv.moved.d2h), h2d: path(kv.moved.h2d), disk_write: path(kv.moved.diskWrite), disk_read: path(kv.moved.diskRead) },
    tiered_passes: kv.tieredPasses,
    host_attention_ms: kv.hostAttentionMs === undefined ? null : ms(kv.hostAttentionMs),
    swapped_out: kv.swappedOut,
    preemptions: kv.preemptions,
    staging: kv.staging ? { share: kv.staging.share, capacity_pages: kv.staging.capacityPages, bytes: kv.staging.bytes, staged_bytes: kv.staging.stagedBytes } : null,
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
