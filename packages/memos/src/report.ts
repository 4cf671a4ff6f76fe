import type { FabricKind, Tier } from '@nerva/core';

/** Bytes held in one tier, by what holds them. */
export interface TierUsage {
  tier: Tier;
  /** What the tier may hold for this engine (the budget), or its capacity when unbudgeted. */
  budgetBytes: number;
  /** Resident model weights (hot blocks in vram; host replicas of streamed blocks elsewhere). */
  weightBytes: number;
  /** VRAM staging slots that streamed weight blocks pass through. */
  stagingBytes: number;
  /** KV cache pages. */
  kvBytes: number;
  /** Activations, meta buffers, workspaces. */
  otherBytes: number;
}

/** Bytes moved by one path, and the time the moves cost, since the engine started. */
export interface PathTraffic {
  bytes: number;
  /** Device or host milliseconds spent moving them (measured). */
  ms: number;
}

/**
 * What the memory OS reports: tiers, where each weight block lives, what moved and what it
 * cost. `GET /v1/memory` and `nerva-bench offload` print it.
 */
export interface MemoryReport {
  fabric: FabricKind;
  /** 'resident' when every weight is in the compute tier, 'paged' when blocks stream. */
  mode: 'resident' | 'paged';
  tiers: TierUsage[];
  weights: {
    totalBytes: number;
    hotBytes: number;
    streamedBytes: number;
    diskBytes: number;
    hotBlocks: number;
    streamedBlocks: number;
    diskBlocks: number;
    /** VRAM staging slots of the ring streamed blocks pass through (0 when resident). */
    slots: number;
    /** Bytes of one staging slot. */
    slotBytes: number;
    /** Ids of the streamed blocks in execution order (layer.N); the other layers are hot. */
    streamedIds: string[];
  };
  /** Cumulative traffic by path. */
  moved: { h2d: PathTraffic; diskRead: PathTraffic; cpuCompute: PathTraffic };
  /** Bytes streamed per forward pass (the same every pass in a steady decode). */
  streamedBytesPerPass: number;
  prefetch: {
    /** Blocks whose copy had been issued before the layer that needs them was enqueued. */
    hits: number;
    /** Blocks whose copy had to be issued at the point of use (cold start of a pass chain). */
    stalls: number;
    /** Device time the compute stream waited for copies, where measured. */
    stallMs: number;
  };
  /** Decisions the user must see (why a block is where it is, a degraded path). */
  notes: string[];
}
