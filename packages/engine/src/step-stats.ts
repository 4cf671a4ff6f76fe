import type { BackendStats, TokenLedgerRecord } from '@nerva/core';
import type { StepSignals } from './engine-options.js';
import type { Request } from './request.js';
import { emptySyncCounts, SYNC_KINDS } from '@nerva/core';
import type { PagerStats } from '@nerva/memos';

/** The pager's moves during one step, shared among its tokens. */
export function pagerDelta(a: PagerStats, b: PagerStats, share: number) {
  return { loads: (b.loads - a.loads) * share, h2dBytes: (b.h2dBytes - a.h2dBytes) * share, diskReadBytes: (b.diskReadBytes - a.diskReadBytes) * share };
}

/** The backend counters' moves during one step, shared among its tokens. */
export function statsDelta(a: BackendStats, b: BackendStats, share: number) {
  const syncs = emptySyncCounts();
  for (const k of SYNC_KINDS) syncs[k] = (b.syncs[k] - a.syncs[k]) * share;
  const allocs = b.allocCalls - a.allocCalls + (b.freeCalls - a.freeCalls);
  return {
    launches: (b.launches - a.launches) * share,
    graphReplays: (b.graphReplays - a.graphReplays) * share,
    syncs,
    h2dBytes: (b.h2dBytes - a.h2dBytes) * share,
    d2hBytes: (b.d2hBytes - a.d2hBytes) * share,
    d2dBytes: (b.d2dBytes - a.d2dBytes) * share,
    allocatorCalls: allocs * share,
    hotPathAllocations: (b.hotPathAllocations - a.hotPathAllocations) * share,
    // Host compute near data in the step (host MLP slices, host attention over warm KV pages).
    ...(a.hostComputeMs !== undefined && b.hostComputeMs !== undefined ? { cpuActiveMs: (b.hostComputeMs - a.hostComputeMs) * share } : {}),
  };
}

/**
 * Per-step marks of the KV blocks a step's tables read (StepSignals.sharedBlocks): blocks two or
 * more of its sequences read, and the reads of them beyond the first.
 */
export class SharedBlockReads {
  private readonly seen: Int32Array;
  private readonly twice: Int32Array;
  private stamp = 0;
  blocks = 0;
  reads = 0;

  constructor(pages: number) {
    this.seen = new Int32Array(pages);
    this.twice = new Int32Array(pages);
  }

  /** Start a step's count. */
  begin(): void {
    this.stamp++;
    this.blocks = 0;
    this.reads = 0;
  }

  /** One sequence's block table. */
  add(table: readonly number[]): void {
    const stamp = this.stamp;
    const seen = this.seen;
    const twice = this.twice;
    for (let b = 0; b < table.length; b++) {
      const id = table[b];
      if (id === 0) continue;
      if (seen[id] !== stamp) seen[id] = stamp;
      else {
        this.reads++;
        if (twice[id] !== stamp) {
          twice[id] = stamp;
          this.blocks++;
        }
      }
    }
  }
}

/** What one step measured, for the ledger records of its tokens (each gets a `share`). */
export interface StepMeasures {
  now: number;
  share: number;
  sampleMs: number;
  deviceMs: number;
  delta: ReturnType<typeof statsDelta>;
  paging?: ReturnType<typeof pagerDelta>;
  buckets?: Record<string, number>;
  /** The request's grammar time this step (constrained decoding), when it has one. */
  grammarMs?: number;
  /** Pipeline stages run eagerly: the step's device time per stage and per handoff. */
  stages?: { stageMs: number[]; linkMs: number[] };
}

/** The ledger record of token `tokenId` of `req`, sampled in a step that measured `m`. */
export function tokenRecord(req: Request, tokenId: number, m: StepMeasures): TokenLedgerRecord {
  const prev = req.times.lastToken ?? req.times.arrival;
  const record: TokenLedgerRecord = {
    seq: req.id,
    step: req.outputIds.length,
    tokenId,
    phase: req.outputIds.length === 0 ? 'prefill' : 'decode',
    wallMs: m.now - prev,
    sampleMs: m.sampleMs * m.share,
    ...(m.grammarMs !== undefined ? { grammarMs: m.grammarMs } : {}),
    deviceActiveMs: m.deviceMs * m.share,
    ...m.delta,
    ...(m.paging ? { prefetchedBlocks: m.paging.loads, evictedBlocks: m.paging.loads, diskReadBytes: m.paging.diskReadBytes } : {}),
  };
  if (m.buckets) record.buckets = Object.fromEntries(Object.entries(m.buckets).map(([k, v]) => [k, v * m.share]));
  if (m.stages) {
    record.stageMs = m.stages.stageMs.map((v) => v * m.share);
    record.linkMs = m.stages.linkMs.map((v) => v * m.share);
  }
  return record;
}

/** A step's signals for `onStep` listeners: the queue and KV state beside what the step did. */
export function stepSignals(
  time: number,
  scheduler: { readonly running: { length: number }; readonly waiting: { length: number } },
  kv: { readonly usage: number; stats(): { prefixQueries: number; prefixHits: number } },
  preemptions: number,
  step: Omit<StepSignals, 'time' | 'running' | 'waiting' | 'kvUsage' | 'prefixQueries' | 'prefixHits' | 'preemptions'>,
): StepSignals {
  const ks = kv.stats();
  return { time, running: scheduler.running.length, waiting: scheduler.waiting.length, kvUsage: kv.usage, prefixQueries: ks.prefixQueries, prefixHits: ks.prefixHits, preemptions, ...step };
}
