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
 * How a model's weights are stored: the checkpoint's format and types, and what the backend holds.
 * Block-quantized weights are not the original model: a run over them is exact with respect to
 * the dequantized weights only, so `exact` is false.
 */
export interface WeightFormat {
  /** The checkpoint's file format. */
  file: 'safetensors' | 'gguf';
  /** The checkpoint's tensors by stored type, as the file names it (GGUF: Q4_K, Q6_K, F32; safetensors: BF16, F32). */
  types: Record<string, number>;
  /** Weight bytes the backend holds by buffer dtype (q4_k, f32, ...): blocks it keeps, or their f32 fallback. */
  storedBytes: Record<string, number>;
  /** False when any tensor is block-quantized (the quantization's own error is not in the run's exactness). */
  exact: boolean;
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
    /** How the weights are stored (the engine reports it; absent from reports made without a checkpoint). */
    format?: WeightFormat;
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
  /** KV pages by tier, when the engine runs tiered KV (`kvVramBudget`). */
  kv?: KvMemoryReport;
  /**
   * Per device, when the model is split across several (tensor-parallel shards, or pipeline
   * stages, one entry a stage): what each one holds. `weights` and `tiers` then describe the engine's own device (shard 0).
   */
  devices?: DeviceResidency[];
  /**
   * The deployment mode the rule chose from the budget, the model's size and its format:
   * 'resident' or 'paged', with '+quant' where the checkpoint's weights are block-quantized (held
   * and streamed in their blocks), and the rule itself, stated.
   */
  deployment?: { mode: 'resident' | 'paged' | 'resident+quant' | 'paged+quant'; rule: string };
  /** Decisions the user must see (why a block is where it is, a degraded path). */
  notes: string[];
}

/** What one device of a split model holds. */
export interface DeviceResidency {
  /** The backend's name, and its device ordinal when it has one. */
  backend: string;
  device?: number;
  /** Weight bytes resident on it (its shard of every layer, and what every shard holds whole). */
  weightBytes: number;
  /** Its VRAM budget, where one was given (pipeline stages under `vramBudget` / `stageVramBudgets`). */
  budgetBytes?: number;
  /** The decoder layers it runs, `[first, end)`, where it runs a pipeline stage's range. */
  layers?: [number, number];
  /** KV cache bytes on it (its KV heads of every layer). */
  kvBytes: number;
}

/** Pages of one KV tier. */
export interface KvTierPages {
  /** Pages the tier can hold. */
  capacity: number;
  /** Pages holding a sequence's (or the prefix cache's) K/V now. */
  used: number;
  /** Bytes reserved for the tier's pages. */
  bytes: number;
}

/**
 * KV as virtual memory: each page (one block of tokens, K and V of every layer) lives in the hot
 * tier (the compute tier's KV pool), warm (pinned host memory) or cold (a file in the KV offload
 * dir). Attention reads hot pages on the device and warm pages where they lie (host partials,
 * merged exactly); cold pages are brought back to warm before a step needs them.
 */
export interface KvMemoryReport {
  blockSize: number;
  /** Bytes of one page: blockSize tokens of K and V for every layer. */
  pageBytes: number;
  tiers: { hot: KvTierPages; warm: KvTierPages; cold: KvTierPages };
  /** Pages moved to a lower tier (hot -> warm, warm -> cold) and back up, since start. */
  demotions: number;
  promotions: number;
  /** Bytes and time of the page moves by path, since start. */
  moved: { d2h: PathTraffic; h2d: PathTraffic; diskWrite: PathTraffic; diskRead: PathTraffic };
  /** Forward passes whose attention merged host partials over warm pages. */
  tieredPasses: number;
  /**
   * Milliseconds the host CPU spent on those partials (attention over warm pages where they lie),
   * since start; absent where the backend does not measure it apart (the CPU backend, whose
   * compute tier is host memory already).
   */
  hostAttentionMs?: number;
  /** Sequences whose pages were written to the cold tier instead of being preempted by recompute. */
  swappedOut: number;
  /** Sequences preempted by recompute (the last resort). */
  preemptions: number;
  /**
   * With a link share (kvWarmLinkShare): the share in effect (the option, or the engine's default)
   * and the VRAM staging warm pages stream through: its capacity in pages (per layer), its bytes (both buffers, K and V), and the bytes staged since start
   * (pages copied over the link, every layer; a step copies the warm slots up to the highest it reads).
   */
  staging?: { share: number; capacityPages: number; bytes: number; stagedBytes: number };
}
