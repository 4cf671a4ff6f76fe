import type { BlockHash } from './block-hash.js';

/**
 * One fixed-size page of KV cache. The engine owns the K/V memory; this object is the bookkeeping
 * for block `id` (slots `id * blockSize … id * blockSize + blockSize - 1`).
 *
 * Fields other than `id` are maintained by {@link BlockPool}; treat them as read-only.
 */
export class KvBlock {
  /** Number of sequences currently holding this block. 0 means it sits in the free queue. */
  refCount = 0;
  /** Chained hash of this block when it is full and registered in the prefix cache. */
  hash: BlockHash | undefined = undefined;
  /** The block's token ids, kept while it is registered so every hit can compare them. */
  tokens: Uint32Array | undefined = undefined;
  /** Serialized extra keys (salt, LoRA id…) the block was hashed with; compared on every hit. */
  extraTag: string | undefined = undefined;
  /**
   * Registration stamp, unique per registration (0 when unregistered). Children record their
   * parent's stamp, so a hit proves the whole prefix is the same chain, not merely equal hashes.
   */
  regId = 0;
  /** `regId` of the preceding block in the chain when registered; 0 for a first block. */
  parentRegId = 0;
  /** @internal intrusive free-queue links; `null` when the block is not queued. */
  prevFree: KvBlock | null = null;
  /** @internal */
  nextFree: KvBlock | null = null;

  constructor(
    /** Physical block index into the engine's KV buffers. */
    readonly id: number,
  ) {}

  /** True while the block is linked into a {@link FreeBlockQueue}. */
  get isQueued(): boolean {
    return this.prevFree !== null;
  }
}
