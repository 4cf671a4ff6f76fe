/**
 * `@nerva/kv`: the KV cache as virtual memory, bookkeeping side. A fixed pool of KV blocks with
 * refcounts and an LRU free queue, per-sequence block tables, and chained-hash prefix caching of
 * full blocks with a collision guard and lazy eviction. The engine owns the K/V buffers and
 * addresses them with the block ids and slot numbers handed out here.
 *
 * @packageDocumentation
 */
export { KvBlock } from './kv-block.js';
export { FreeBlockQueue } from './free-queue.js';
export { BlockPool, NULL_BLOCK_ID, type BlockRegistration } from './block-pool.js';
export {
  sha256BlockHash,
  hashBlock,
  blockTokens,
  tokensEqual,
  checkTokenId,
  normalizeExtraKeys,
  MAX_TOKEN_ID,
  type BlockHash,
  type BlockHashFn,
  type BlockHashInput,
  type ExtraKey,
  type ExtraKeys,
  type NormalizedExtraKeys,
} from './block-hash.js';
export { BlockTable } from './block-table.js';
export { KvTiers, KvTierPressureError, type KvTier, type KvPageMove, type KvTiersOptions, type KvStepNeed, type KvTierStats } from './tiers.js';
export {
  KvCacheManager,
  type KvCacheManagerOptions,
  type ComputedBlocks,
  type KvCacheStats,
  type ForkedSequence,
} from './kv-cache-manager.js';
export {
  KvError,
  KvArgumentError,
  UnknownSequenceError,
  SequenceExistsError,
  DoubleFreeError,
  MaxBlocksPerSeqError,
  OutOfBlocksError,
  StaleComputedBlocksError,
  SlotOutOfRangeError,
  FreeQueueError,
  KvInvariantError,
  type SeqId,
} from './errors.js';
