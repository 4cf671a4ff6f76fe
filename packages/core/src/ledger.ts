import { emptySyncCounts, SYNC_KINDS, type SyncCounts } from './sync.js';
import type { Tier } from './tiers.js';

/** What one token cost. Every field is measured, never estimated; absent means not measured. */
export interface TokenLedgerRecord {
  /** Sequence/request the token belongs to. */
  seq: number;
  /** 0 for the token produced by prefill, then 1, 2, ... */
  step: number;
  tokenId: number;
  phase: 'prefill' | 'decode';
  /** Host wall time from the previous token of this sequence (or the request start). */
  wallMs: number;
  /** Part of wallMs spent choosing the token. */
  sampleMs: number;
  /**
   * Constrained decoding: host time on the step's path for this request's grammar (part of
   * wallMs): the wait for the token's mask where grammar worker threads compute it, else the time
   * accepting the token and computing the next mask. Absent for free requests.
   */
  grammarMs?: number;
  deviceActiveMs?: number;
  /** Host CPU time computing near host-tier data for this token (its share of the step's): host MLP slices, host attention over warm KV pages. */
  cpuActiveMs?: number;
  cpuBlockedMs?: number;
  launches: number;
  graphReplays: number;
  syncs: SyncCounts;
  h2dBytes: number;
  d2hBytes: number;
  d2dBytes: number;
  /** Allocator calls during this token; after warm-up the hot path makes none. */
  allocatorCalls: number;
  hotPathAllocations: number;
  kvPages?: Partial<Record<Tier, number>>;
  kvPagesMoved?: number;
  /** Weight blocks loaded into staging slots for this token (paged weights). */
  prefetchedBlocks?: number;
  evictedBlocks?: number;
  /** Bytes read from the disk tier for this token. */
  diskReadBytes?: number;
  /** Profiling mode: time by bucket (projection, norm, attention, mlp, sampling, ...). */
  buckets?: Record<string, number>;
  /**
   * Pipeline stages that run their passes eagerly: device time of each stage's layers (and, on
   * the last stage, the head), in stage order, measured with events on each stage's own device.
   */
  stageMs?: number[];
  /**
   * The handoffs into stages 1..S-1 (entry s-1: into stage s): time the receiving stage's stream
   * spent in them, waiting for the rows and receiving them (the pipeline's bubbles and link time).
   */
  linkMs?: number[];
  /** Decisions the user must see (a fallback, a degraded path). */
  notes?: string[];
}

export interface LedgerSummary {
  tokens: number;
  prefill_tokens: number;
  decode_tokens: number;
  wall_ms_total: number;
  tokens_per_s: number;
  decode_tokens_per_s: number;
  ms_per_token_p50: number;
  ms_per_token_p99: number;
  sample_ms_total: number;
  /** Host time in the grammar of a constrained request (grammarMs), when it had one. */
  grammar_ms_total?: number;
  device_active_ms_total?: number;
  /** Host compute near data (cpuActiveMs), where the backend measures it. */
  cpu_active_ms_total?: number;
  launches: number;
  graph_replays: number;
  graph_replays_per_decode_token: number;
  syncs: SyncCounts;
  syncs_per_decode_token: SyncCounts;
  h2d_bytes: number;
  d2h_bytes: number;
  d2d_bytes: number;
  allocator_calls: number;
  /** Allocator calls made on decode steps after the first (the warm hot path). */
  hot_path_allocations: number;
  buckets_ms?: Record<string, number>;
  /** Pipeline stages: stageMs and linkMs summed over the tokens, per stage and per handoff. */
  stage_ms_total?: number[];
  link_ms_total?: number[];
  /** Paged weights: blocks loaded into staging slots, and bytes read from the disk tier. */
  prefetched_blocks?: number;
  disk_read_bytes?: number;
  notes: string[];
}

export function percentile(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return 0;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i];
}

/** Collects token records and renders a JSON summary. */
export class LedgerAggregator {
  private readonly records: TokenLedgerRecord[] = [];
  private readonly extraNotes: string[] = [];

  add(r: TokenLedgerRecord): void {
    this.records.push(r);
  }

  note(text: string): void {
    if (!this.extraNotes.includes(text)) this.extraNotes.push(text);
  }

  get size(): number {
    return this.records.length;
  }

  all(): readonly TokenLedgerRecord[] {
    return this.records;
  }

  summary(): LedgerSummary {
    const rs = this.records;
    const decode = rs.filter((r) => r.phase === 'decode');
    const syncs = emptySyncCounts();
    const buckets: Record<string, number> = {};
    let wall = 0, sample = 0, launches = 0, replays = 0, h2d = 0, d2h = 0, d2d = 0, alloc = 0, hot = 0, decodeWall = 0;
    let device = 0;
    let hasDevice = false;
    let cpu: number | undefined;
    let grammar: number | undefined;
    let prefetched: number | undefined;
    let diskRead: number | undefined;
    let stageMs: number[] | undefined;
    let linkMs: number[] | undefined;
    const addInto = (acc: number[] | undefined, v: readonly number[]) => {
      const out = acc ?? [];
      v.forEach((x, i) => (out[i] = (out[i] ?? 0) + x));
      return out;
    };
    const notes = [...this.extraNotes];
    for (const r of rs) {
      wall += r.wallMs;
      sample += r.sampleMs;
      launches += r.launches;
      replays += r.graphReplays;
      h2d += r.h2dBytes;
      d2h += r.d2hBytes;
      d2d += r.d2dBytes;
      alloc += r.allocatorCalls;
      if (r.phase === 'decode') {
        decodeWall += r.wallMs;
        // The first decode step of a sequence is warm-up (graph capture, first launches).
        if (r.step > 1) hot += r.hotPathAllocations + r.allocatorCalls;
      }
      if (r.deviceActiveMs !== undefined) {
        hasDevice = true;
        device += r.deviceActiveMs;
      }
      if (r.cpuActiveMs !== undefined) cpu = (cpu ?? 0) + r.cpuActiveMs;
      if (r.grammarMs !== undefined) grammar = (grammar ?? 0) + r.grammarMs;
      for (const k of SYNC_KINDS) syncs[k] += r.syncs[k];
      if (r.prefetchedBlocks !== undefined) prefetched = (prefetched ?? 0) + r.prefetchedBlocks;
      if (r.diskReadBytes !== undefined) diskRead = (diskRead ?? 0) + r.diskReadBytes;
      if (r.buckets) for (const [k, v] of Object.entries(r.buckets)) buckets[k] = (buckets[k] ?? 0) + v;
      if (r.stageMs) stageMs = addInto(stageMs, r.stageMs);
      if (r.linkMs) linkMs = addInto(linkMs, r.linkMs);
      for (const n of r.notes ?? []) if (!notes.includes(n)) notes.push(n);
    }
    const perDecode = emptySyncCounts();
    const dsync = emptySyncCounts();
    for (const r of decode) for (const k of SYNC_KINDS) dsync[k] += r.syncs[k];
    for (const k of SYNC_KINDS) perDecode[k] = decode.length ? dsync[k] / decode.length : 0;
    const sorted = decode.map((r) => r.wallMs).sort((a, b) => a - b);
    const round = (x: number) => Math.round(x * 1000) / 1000;
    const s: LedgerSummary = {
      tokens: rs.length,
      prefill_tokens: rs.length - decode.length,
      decode_tokens: decode.length,
      wall_ms_total: round(wall),
      tokens_per_s: wall > 0 ? round((rs.length * 1000) / wall) : 0,
      decode_tokens_per_s: decodeWall > 0 ? round((decode.length * 1000) / decodeWall) : 0,
      ms_per_token_p50: round(percentile(sorted, 0.5)),
      ms_per_token_p99: round(percentile(sorted, 0.99)),
      sample_ms_total: round(sample),
      launches,
      graph_replays: replays,
      graph_replays_per_decode_token: decode.length ? round(decode.reduce((a, r) => a + r.graphReplays, 0) / decode.length) : 0,
      syncs,
      syncs_per_decode_token: perDecode,
      h2d_bytes: h2d,
      d2h_bytes: d2h,
      d2d_bytes: d2d,
      allocator_calls: alloc,
      hot_path_allocations: hot,
      notes,
    };
    if (hasDevice) s.device_active_ms_total = round(device);
    if (cpu !== undefined) s.cpu_active_ms_total = round(cpu);
    if (grammar !== undefined) s.grammar_ms_total = round(grammar);
    if (prefetched !== undefined) s.prefetched_blocks = round(prefetched);
    if (diskRead !== undefined) s.disk_read_bytes = Math.round(diskRead);
    if (stageMs) s.stage_ms_total = stageMs.map(round);
    if (linkMs) s.link_ms_total = linkMs.map(round);
    if (Object.keys(buckets).length) s.buckets_ms = Object.fromEntries(Object.entries(buckets).map(([k, v]) => [k, round(v)]));
    return s;
  }
}
