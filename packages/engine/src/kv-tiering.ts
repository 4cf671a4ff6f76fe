import * as fs from 'node:fs';
import * as path from 'node:path';
import { randomBytes } from 'node:crypto';
import type { DeviceBackend } from '@nerva/core';
import { type BlockPool, type KvCacheManager, KvTiers, type KvPageMove, type KvStepNeed } from '@nerva/kv';
import { checkOffloadDir, type KvMemoryReport, type MemoryReport, type PathTraffic, unlinkOpen } from '@nerva/memos';
import type { ModelWeights } from './model-weights.js';
import { memoryReport, type ResidencyOptions } from './weight-residency.js';
import type { ModelRunner } from './model-runner.js';
import type { SchedulerOutput } from './scheduler.js';

/** Options of tiered KV (EngineOptions' kv* fields). */
export interface KvTierOptions {
  kvVramBudget?: number;
  kvHostBudget?: number;
  kvOffloadDir?: string;
  kvWarmLinkShare?: number;
}

/** Pages kept hot in every sequence (attention sinks, then the recent window). */
export const KV_SINK_BLOCKS = 1;
export const KV_WINDOW_BLOCKS = 2;
/** The cold tier holds this many times the hot + warm pages (prefix-cache spill and swapped-out work). */
const COLD_FACTOR = 4;

/** A KV budget that cannot hold what one step of one sequence needs. */
export class KvBudgetError extends RangeError {
  constructor(message: string) {
    super(message);
    this.name = 'KvBudgetError';
  }
}

/** Checks the options before anything loads; a bad offload dir is one clear error. */
export function validateKvTiers(o: KvTierOptions & { numerics?: string; pipelineParallel?: number; stageDevices?: number[] }): void {
  for (const [k, v] of [
    ['kvVramBudget', o.kvVramBudget],
    ['kvHostBudget', o.kvHostBudget],
  ] as const) {
    if (v !== undefined && (!Number.isSafeInteger(v) || v <= 0)) throw new RangeError(`${k} must be a positive whole number of bytes, got ${String(v)}`);
  }
  const share = o.kvWarmLinkShare;
  if (share !== undefined && !(typeof share === 'number' && share >= 0 && share <= 1)) throw new RangeError(`kvWarmLinkShare must be a number from 0 to 1, got ${String(share)}`);
  const tiered = o.kvVramBudget !== undefined;
  if (!tiered) {
    // Name only the options given: "kvHostBudget and kvOffloadDir need kvVramBudget ...".
    const given = (['kvHostBudget', 'kvOffloadDir', 'kvWarmLinkShare'] as const).filter((k) => o[k] !== undefined);
    if (given.length > 0) {
      const names = given.length === 1 ? given[0] : `${given.slice(0, -1).join(', ')} and ${given[given.length - 1]}`;
      throw new RangeError(`${names} need${given.length === 1 ? 's' : ''} kvVramBudget (the hot KV pool ${given.length === 1 ? 'it extends' : 'they extend'})`);
    }
  }
  if (!tiered) return;
  if (o.numerics === 'bf16') throw new RangeError("tiered KV (kvVramBudget) needs numerics 'exact': bf16 eager attention rounds the probabilities of the whole row, which partial attentions cannot reproduce");
  if ((o.pipelineParallel ?? 1) > 1 || (o.stageDevices?.length ?? 1) > 1) throw new RangeError('tiered KV (kvVramBudget) is not supported with pipeline stages yet');
  if (o.kvOffloadDir !== undefined) {
    if (typeof o.kvOffloadDir !== 'string' || o.kvOffloadDir === '') throw new RangeError(`kvOffloadDir must be a directory path, got ${String(o.kvOffloadDir)}`);
    checkOffloadDir(o.kvOffloadDir);
  }
}

/**
 * The leading warm slots a step stages over the link, given the highest slot its tables read
 * below linkPages (`used`, that slot + 1): rounded up to an eighth of linkPages, so a captured
 * decode graph (which keeps its copies' size) serves many steps and at most 8 spans are captured
 * per batch bucket. Warm slots are handed out lowest first, so `used` tracks the pages in use.
 */
export function stageSpan(used: number, linkPages: number): number {
  if (used <= 0 || linkPages <= 0) return 0;
  const unit = Math.ceil(linkPages / 8);
  return Math.min(linkPages, Math.ceil(used / unit) * unit);
}

/** Pool sizes of tiered KV, in pages (hot includes the null page). */
export interface KvTierPlan {
  hotSlots: number;
  warmSlots: number;
  coldSlots: number;
  pageBytes: number;
  /** The link share in effect (kvWarmLinkShare, or the default; see planKvTiers). */
  linkShare: number;
  /** Leading warm slots the device stages and attends over itself (0: none, the host takes every warm page). */
  linkPages: number;
}

/**
 * The default link share's VRAM: its staging (two buffers of K and V, one layer each) may take at
 * most this fraction of kvVramBudget on top of it, so a large warm pool does not silently grow
 * the VRAM the KV uses (8B at 4096 tokens, KV 4x the hot budget: the whole warm pool fits).
 */
export const DEFAULT_STAGING_FRACTION = 0.25;

/** The ledger's note on a tier plan: pages per tier and where warm attention runs. */
export function tierPlanNote(plan: KvTierPlan, blockSize: number): string {
  return (
    `tiered KV: ${plan.hotSlots - 1} hot pages, ${plan.warmSlots} warm (pinned host), ${plan.coldSlots} cold (disk) of ${blockSize} tokens; attention over warm pages runs on the host and is merged exactly` +
    (plan.linkShare > 0 ? ` (the device reads ${+plan.linkShare.toFixed(3)} of the warm pool itself over the link)` : '')
  );
}

/**
 * Pages per tier for the budgets. The hot pool must hold the sinks, the recent window and a page
 * written past it (what one decode step of one sequence touches); a smaller budget is refused
 * with the smallest that works.
 *
 * The link share: kvWarmLinkShare when given. Else, with `link` (the compute tier is VRAM, so the
 * device can stage warm pages over a link; `numLayers` sizes a layer's page), as much of the warm
 * pool as a staging of DEFAULT_STAGING_FRACTION of kvVramBudget holds, all of it when it fits;
 * without `link`, 0 (the host attends over every warm page).
 */
export function planKvTiers(o: KvTierOptions, pageBytes: number, link?: { numLayers: number }): KvTierPlan {
  const hotSlots = Math.floor(o.kvVramBudget! / pageBytes);
  const minHot = KV_SINK_BLOCKS + KV_WINDOW_BLOCKS + 1 + 1;
  if (hotSlots < minHot) {
    throw new KvBudgetError(
      `kvVramBudget ${o.kvVramBudget} bytes holds ${hotSlots} KV pages of ${pageBytes} bytes; one sequence's window needs ${minHot} ` +
        `(${KV_SINK_BLOCKS} sink, ${KV_WINDOW_BLOCKS} recent, the page being written and the null page): use at least ${minHot * pageBytes} bytes`,
    );
  }
  const warmSlots = Math.floor((o.kvHostBudget ?? 8 * hotSlots * pageBytes) / pageBytes);
  const coldSlots = o.kvOffloadDir !== undefined ? COLD_FACTOR * (hotSlots + warmSlots) : 0;
  let linkShare = 0;
  let linkPages = 0;
  if (o.kvWarmLinkShare !== undefined) {
    linkShare = o.kvWarmLinkShare;
    linkPages = linkShare > 0 ? Math.max(1, Math.ceil(linkShare * Math.max(1, warmSlots))) : 0;
  } else if (link && warmSlots > 0) {
    // Staging bytes = 4 buffers x linkPages x (pageBytes / (2 x numLayers)) per layer page.
    const fits = Math.floor((DEFAULT_STAGING_FRACTION * o.kvVramBudget! * link.numLayers) / (2 * pageBytes));
    linkPages = Math.min(warmSlots, Math.max(1, fits));
    linkShare = linkPages / warmSlots;
  }
  return { hotSlots, warmSlots, coldSlots, pageBytes, linkShare, linkPages };
}

const traffic = (): PathTraffic => ({ bytes: 0, ms: 0 });

/**
 * The engine's side of tiered KV: the page policy (@nerva/kv KvTiers), the page moves it orders
 * (hot <-> warm copies on the compute stream, warm <-> cold through a file in the offload dir),
 * and the block tables the two attention partials read.
 */
export class TieredKv {
  readonly tiers: KvTiers;
  private readonly coldFile: string | undefined;
  private coldFd: number | undefined;
  private readonly moved = { d2h: traffic(), h2d: traffic(), diskWrite: traffic(), diskRead: traffic() };
  swappedOut = 0;

  constructor(
    pool: BlockPool,
    readonly plan: KvTierPlan,
    private readonly backend: DeviceBackend,
    offloadDir: string | undefined,
  ) {
    this.tiers = new KvTiers(pool, { hotSlots: plan.hotSlots, warmSlots: plan.warmSlots, coldSlots: plan.coldSlots, sinkBlocks: KV_SINK_BLOCKS, windowBlocks: KV_WINDOW_BLOCKS });
    if (offloadDir !== undefined && plan.coldSlots > 0) {
      // A new name created exclusively and private, unlinked once open: no symlink is followed, no
      // other user reads the pages, and nothing stays on disk after a crash.
      this.coldFile = path.join(offloadDir, `nerva-kv-${process.pid}-${randomBytes(6).toString('hex')}.bin`);
      const need = plan.coldSlots * this.coldPageBytes;
      const free = freeBytes(offloadDir);
      if (free !== undefined && free < need) throw new KvBudgetError(`kvOffloadDir ${offloadDir} has ${free} bytes free; the cold KV tier needs ${need}`);
      try {
        this.coldFd = fs.openSync(this.coldFile, 'wx+', 0o600);
      } catch (e) {
        throw new KvBudgetError(`kvOffloadDir ${offloadDir}: cannot create ${this.coldFile} (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
      }
      unlinkOpen(this.coldFile);
    }
  }

  /** Bytes of one page on disk: float32 K and V of every layer. */
  private get coldPageBytes(): number {
    // pageBytes counts the cache dtype; the file holds float32 (bf16 pages read back exactly).
    return this.plan.pageBytes * (this.backendKvBytes === 2 ? 2 : 1);
  }

  private get backendKvBytes(): number {
    return this.backend.capabilities.numerics === 'bf16' ? 2 : 4;
  }

  /**
   * Before a step: its sequences' pages addressable, the moves executed (preempted requests
   * counted as swapped out). True where a page moved tier: staged tables changed.
   */
  prepareStep(plan: SchedulerOutput, kv: KvCacheManager, runner: ModelRunner): boolean {
    const epoch = this.tiers.epoch;
    const bs = kv.blockSize;
    this.swappedOut += plan.preempted.length;
    this.prepare(
      plan.scheduled.map(({ req }) => ({ pages: kv.blockTable(req.id), firstWritten: Math.floor(req.numComputedTokens / bs), firstFresh: Math.ceil(req.numComputedTokens / bs) })),
      runner,
    );
    return this.tiers.epoch !== epoch;
  }

  /** Make the step's pages addressable and execute the moves, in order. */
  prepare(needs: readonly KvStepNeed[], runner: ModelRunner): void {
    const moves = this.tiers.prepare(needs);
    for (const m of moves) this.execute(m, runner);
  }

  private execute(m: KvPageMove, runner: ModelRunner): void {
    if (m.to === 'none') return;
    const t0 = performance.now();
    if (m.from === 'cold' || m.to === 'cold') {
      if (this.coldFd === undefined) throw new Error('a cold KV page move without an offload dir');
      const bytes = this.coldPageBytes;
      if (m.to === 'cold') {
        const data = runner.readWarmPage(m.fromSlot);
        fs.writeSync(this.coldFd, new Uint8Array(data.buffer, data.byteOffset, data.byteLength), 0, data.byteLength, m.toSlot * bytes);
        this.moved.diskWrite.bytes += data.byteLength;
        this.moved.diskWrite.ms += performance.now() - t0;
      } else {
        const data = new Float32Array(bytes / 4);
        const n = fs.readSync(this.coldFd, new Uint8Array(data.buffer), 0, bytes, m.fromSlot * bytes);
        if (n !== bytes) throw new Error(`cold KV page ${m.page}: read ${n} of ${bytes} bytes from ${this.coldFile}`);
        runner.writeWarmPage(m.toSlot, data);
        this.moved.diskRead.bytes += bytes;
        this.moved.diskRead.ms += performance.now() - t0;
      }
      return;
    }
    runner.copyKvPage({ from: m.from, fromSlot: m.fromSlot, to: m.to, toSlot: m.toSlot });
    // Stream-ordered copies: their time is device time, accounted in the step's.
    (m.to === 'warm' ? this.moved.d2h : this.moved.h2d).bytes += this.plan.pageBytes;
  }

  /** Bytes staged into VRAM over the link since start (see noteStaged). */
  private stagedBytes = 0;

  /** A tiered step stages `pages` warm pages (every layer's K and V) for the device's own partial. */
  noteStaged(pages: number): void {
    this.stagedBytes += pages * this.plan.pageBytes;
  }

  /** Whether a pass needs host partials: some page is warm. */
  get tiered(): boolean {
    return this.tiers.warmPages > 0;
  }

  report(runner: ModelRunner, preemptions: number, blockSize: number, hostAttentionMs?: number): KvMemoryReport {
    this.tiers.reclaim();
    const s = this.tiers.stats();
    const pb = this.plan.pageBytes;
    return {
      blockSize,
      pageBytes: pb,
      tiers: {
        hot: { capacity: s.hot.capacity, used: s.hot.used, bytes: runner.kvBytes },
        warm: { capacity: s.warm.capacity, used: s.warm.used, bytes: runner.warmKvBytes },
        cold: { capacity: s.cold.capacity, used: s.cold.used, bytes: s.cold.capacity * this.coldPageBytes },
      },
      demotions: s.demotions,
      promotions: s.promotions,
      moved: structuredClone(this.moved),
      tieredPasses: runner.tieredPasses,
      ...(hostAttentionMs !== undefined ? { hostAttentionMs } : {}),
      swappedOut: this.swappedOut,
      preemptions,
      ...(runner.limits.linkPages ? { staging: { share: this.plan.linkShare, capacityPages: runner.limits.linkPages, bytes: runner.stageBytes, stagedBytes: this.stagedBytes } } : {}),
    };
  }

  dispose(): void {
    if (this.coldFd !== undefined) {
      fs.closeSync(this.coldFd);
      this.coldFd = undefined;
      fs.rmSync(this.coldFile!, { force: true });
    }
  }
}

function freeBytes(dir: string): number | undefined {
  try {
    const s = fs.statfsSync(dir);
    return s.bavail * s.bsize;
  } catch {
    return undefined;
  }
}

/**
 * A context's memory OS report: its model's weights and its KV cache, and with tiered KV the
 * pages of each tier (tiered KV runs on one ModelRunner, whose backend measured the host partials).
 */
export function contextMemoryReport(
  backend: DeviceBackend,
  model: { readonly weights: ModelWeights; readonly budgets: ResidencyOptions },
  runner: { readonly kvBytes: number; readonly hostComputeBytes: number; readonly hostReadBytes: number },
  kvTiers: TieredKv | undefined,
  preemptions: number,
  blockSize: number,
): MemoryReport {
  const r = memoryReport(backend, model.weights, runner.kvBytes, model.budgets, { computeBytes: runner.hostComputeBytes, readBytes: runner.hostReadBytes });
  if (kvTiers) r.kv = kvTiers.report(runner as ModelRunner, preemptions, blockSize, backend.stats().hostComputeMsByOp?.attention);
  return r;
}
