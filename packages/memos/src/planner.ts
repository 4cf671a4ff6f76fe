import { fmt, PlanInputError, WorkingSetTooLargeError } from './errors.js';

/** One weight block as the planner sees it: a size, a place in the execution order, a priority. */
export interface PlanBlock {
  id: string;
  bytes: number;
  /**
   * Position in one forward pass (0 = used first). Blocks with `order` undefined are used every
   * pass but outside the streamed sequence (embedding, final norm, lm_head): they must be hot.
   */
  order?: number;
  /**
   * Bytes the block takes when hot, when that differs from what streams through the ring: a layer
   * whose MLP is partly computed near its host copy streams only the rest (`bytes`), while the
   * whole of it (`residentBytes`) lives in the host tier.
   */
  residentBytes?: number;
  /** Higher = keep hot first (the importance profile); ties go to earlier blocks. */
  importance?: number;
  /**
   * 'gather': each pass reads a few rows of the block (an embedding table), so when weights are
   * paged it is read in place from host memory instead of taking compute-tier memory.
   */
  access?: 'gather';
}

export interface PlanInput {
  blocks: readonly PlanBlock[];
  /** Compute-tier bytes available to weights and staging slots (the budget minus KV and activations). */
  deviceBytes: number;
  /** Host bytes for the replicas of streamed blocks; beyond this, blocks spill to disk. */
  hostBytes?: number;
  /** Staging slots in the ring (default 2: one being read by compute while the next is copied). */
  slots?: number;
  /** Whether a disk tier exists (an offload dir); without one, host overflow is an error. */
  disk?: boolean;
}

/** hot: in the compute tier; streamed: through the staging ring; mapped: read in place from host memory. */
export type Placement = 'hot' | 'streamed' | 'mapped';

export interface BlockPlacement {
  id: string;
  bytes: number;
  placement: Placement;
  /** Where the block's master copy lives: vram (hot), pinned host memory or disk (streamed). */
  home: 'vram' | 'pinned' | 'disk';
}

export interface ResidencyPlan {
  mode: 'resident' | 'paged';
  placements: ReadonlyMap<string, BlockPlacement>;
  /** Streamed block ids in execution order. */
  streamed: readonly string[];
  slots: number;
  /** Bytes of one staging slot (the largest streamed block). */
  slotBytes: number;
  hotBytes: number;
  streamedBytes: number;
  pinnedBytes: number;
  diskBytes: number;
  /** Compute-tier bytes the plan uses: hot blocks plus the staging ring. */
  deviceBytesUsed: number;
  notes: string[];
}

/**
 * Decide which weight blocks stay hot in the compute tier and which stream through a ring of
 * staging slots, from sizes, the budget and importance. Blocks without an execution order are
 * always hot. Among ordered blocks, hot picks are made by importance, then execution order, as
 * long as hot + ring fits; the streamed rest keep execution order (the ring's schedule). The math
 * is the same whichever blocks are hot: placement changes time, never results.
 */
export function planResidency(input: PlanInput): ResidencyPlan {
  const { blocks, deviceBytes } = input;
  const slots = input.slots ?? 2;
  if (!Number.isFinite(deviceBytes) || deviceBytes < 0) throw new PlanInputError(`device budget must be a non-negative number of bytes, got ${deviceBytes}`);
  if (!Number.isInteger(slots) || slots < 1) throw new PlanInputError(`slots must be a positive integer, got ${slots}`);
  const hostBytes = input.hostBytes ?? Number.POSITIVE_INFINITY;
  if (!(hostBytes >= 0)) throw new PlanInputError(`host budget must be a non-negative number of bytes, got ${hostBytes}`);
  const seen = new Set<string>();
  for (const b of blocks) {
    if (seen.has(b.id)) throw new PlanInputError(`duplicate block id ${b.id}`);
    seen.add(b.id);
    if (!Number.isFinite(b.bytes) || b.bytes < 0) throw new PlanInputError(`block ${b.id}: bad size ${b.bytes}`);
    if (b.residentBytes !== undefined && !(Number.isFinite(b.residentBytes) && b.residentBytes >= b.bytes)) {
      throw new PlanInputError(`block ${b.id}: residentBytes ${b.residentBytes} must be at least its streamed bytes ${b.bytes}`);
    }
  }
  const full = (b: PlanBlock): number => b.residentBytes ?? b.bytes;
  const placements = new Map<string, BlockPlacement>();
  const total = blocks.reduce((s, b) => s + full(b), 0);
  // Gathered blocks are read in place from host memory when the host budget has room for them.
  const gathered: PlanBlock[] = [];
  let gatheredBytes = 0;
  for (const b of blocks) {
    if (b.access === 'gather' && gatheredBytes + b.bytes <= hostBytes) {
      gathered.push(b);
      gatheredBytes += b.bytes;
    }
  }
  const isMapped = (b: PlanBlock) => gathered.includes(b);
  const pinnedOnly = blocks.filter((b) => b.order === undefined && !isMapped(b));
  const ordered = blocks.filter((b) => b.order !== undefined && !isMapped(b)).sort((a, b) => a.order! - b.order!);
  const fixedHot = pinnedOnly.reduce((s, b) => s + b.bytes, 0);

  if (total <= deviceBytes) {
    for (const b of blocks) placements.set(b.id, { id: b.id, bytes: full(b), placement: 'hot', home: 'vram' });
    return { mode: 'resident', placements, streamed: [], slots: 0, slotBytes: 0, hotBytes: total, streamedBytes: 0, pinnedBytes: 0, diskBytes: 0, deviceBytesUsed: total, notes: [] };
  }

  // One slot holds any ordered block, so its size is the largest of them; what the ring leaves
  // goes to hot blocks, best first (importance, then execution order).
  const slotBytesOf = (): number => ordered.reduce((m, b) => Math.max(m, b.bytes), 0);
  const ring = Math.min(slots, ordered.length) * slotBytesOf();
  if (fixedHot + ring > deviceBytes) {
    throw new WorkingSetTooLargeError(
      deviceBytes,
      fixedHot + ring,
      `${fmt(fixedHot)} of always-hot weights (embedding, norms, lm_head) plus a ring of ${Math.min(slots, ordered.length)} staging slot(s) of ${fmt(slotBytesOf())} each`,
    );
  }
  const byPriority = [...ordered].sort((a, b) => (b.importance ?? 0) - (a.importance ?? 0) || a.order! - b.order!);
  const hot = new Set<string>();
  let hotBytes = fixedHot;
  for (const b of byPriority) {
    if (hotBytes + full(b) + ring <= deviceBytes) {
      hot.add(b.id);
      hotBytes += full(b);
    }
  }
  const streamedBlocks = ordered.filter((b) => !hot.has(b.id));
  const slotBytes = slotBytesOf();
  let pinnedBytes = 0;
  let diskBytes = 0;
  for (const b of gathered) {
    pinnedBytes += b.bytes;
    placements.set(b.id, { id: b.id, bytes: b.bytes, placement: 'mapped', home: 'pinned' });
  }
  for (const b of blocks) {
    if (isMapped(b)) continue;
    if (b.order === undefined || hot.has(b.id)) {
      placements.set(b.id, { id: b.id, bytes: full(b), placement: 'hot', home: 'vram' });
    }
  }
  for (const b of streamedBlocks) {
    // The host copy holds the whole block: what streams and what is computed where it lies.
    if (pinnedBytes + full(b) <= hostBytes) {
      pinnedBytes += full(b);
      placements.set(b.id, { id: b.id, bytes: full(b), placement: 'streamed', home: 'pinned' });
    } else {
      if (!input.disk) {
        throw new WorkingSetTooLargeError(hostBytes, pinnedBytes + b.bytes, 'the host budget cannot hold the streamed blocks and no offload dir was given for the disk tier');
      }
      diskBytes += b.bytes;
      placements.set(b.id, { id: b.id, bytes: b.bytes, placement: 'streamed', home: 'disk' });
    }
  }
  const streamedBytes = streamedBlocks.reduce((t, b) => t + b.bytes, 0);
  const notes = [
    `paged weights: ${hot.size} of ${ordered.length} layer blocks hot (${fmt(hotBytes)}), ${streamedBlocks.length} streamed (${fmt(streamedBytes)}) through ${Math.min(slots, streamedBlocks.length)} slots of ${fmt(slotBytes)}`,
  ];
  if (diskBytes > 0) notes.push(`disk tier: ${fmt(diskBytes)} of streamed blocks beyond the host budget of ${fmt(hostBytes)} are read from the offload dir each pass`);
  return {
    mode: 'paged',
    placements,
    streamed: streamedBlocks.map((b) => b.id),
    slots: Math.min(slots, streamedBlocks.length),
    slotBytes,
    hotBytes,
    streamedBytes,
    pinnedBytes,
    diskBytes,
    deviceBytesUsed: hotBytes + Math.min(slots, streamedBlocks.length) * slotBytes,
    notes,
  };
}
