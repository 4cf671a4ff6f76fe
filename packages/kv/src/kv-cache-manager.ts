import {
  blockTokens,
  checkTokenId,
  hashBlock,
  normalizeExtraKeys,
  sha256BlockHash,
  tokensEqual,
  type BlockHash,
  type BlockHashFn,
  type ExtraKeys,
  type NormalizedExtraKeys,
} from './block-hash.js';
import { BlockPool } from './block-pool.js';
import { BlockTable } from './block-table.js';
import {
  DoubleFreeError,
  KvArgumentError,
  KvInvariantError,
  MaxBlocksPerSeqError,
  SequenceExistsError,
  StaleComputedBlocksError,
  UnknownSequenceError,
  type SeqId,
} from './errors.js';
import type { KvBlock } from './kv-block.js';

/** Configuration of a {@link KvCacheManager}. */
export interface KvCacheManagerOptions {
  /** Physical blocks in the engine's KV buffers, including the reserved null block 0. */
  numBlocks: number;
  /** Tokens per block. */
  blockSize: number;
  /** Share full blocks between sequences with equal prefixes. */
  enablePrefixCaching: boolean;
  /** Cap on one sequence's block table (max model length / block size). Default: numBlocks - 1. */
  maxBlocksPerSeq?: number;
  /** Block hash function; default {@link sha256BlockHash}. Tests inject colliding ones. */
  hashFn?: BlockHashFn;
  /** How many freed sequence ids are remembered to report a second free as a double free. Default 4096. */
  freedSeqMemory?: number;
}

/** Result of {@link KvCacheManager.getComputedBlocks}; pass it unchanged to `allocateSlots`. */
export interface ComputedBlocks {
  /** The sequence the lookup was made for. */
  readonly seqId: SeqId;
  /** Cached blocks covering the longest reusable prefix, logical order. Not yet referenced. */
  readonly blocks: readonly KvBlock[];
  /** `blocks.length * blockSize`: tokens whose KV is already in the cache. */
  readonly numComputedTokens: number;
  /** Chained hashes of `blocks`. */
  readonly hashes: readonly BlockHash[];
  /** `regId` of each block at lookup time, to detect eviction before `allocateSlots`. */
  readonly stamps: readonly number[];
  /** The sequence's validated extra keys. */
  readonly extraKeys: NormalizedExtraKeys;
}

/** Counters for metrics and leak checks. */
export interface KvCacheStats {
  /** All blocks including the null block. */
  totalBlocks: number;
  /** Blocks that can be handed out (including cached-but-free ones). */
  freeBlocks: number;
  /** `totalBlocks - freeBlocks` (the null block counts as used). */
  usedBlocks: number;
  /** Prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries). */
  prefixQueries: number;
  /** Of those, tokens served from the cache (vLLM's prefix_cache_hits). */
  prefixHits: number;
  /** Blocks registered in the prefix cache, held or free. */
  cachedBlocks: number;
  /** Cached blocks whose hash was dropped because the block was reused. */
  evictedBlocks: number;
  /** Sequences currently holding blocks. */
  sequences: number;
  /** Blocks held by two or more sequences at once (prefix-cache hits, forks): each stored once. */
  sharedBlocks: number;
}

/** Result of {@link KvCacheManager.forkSequence}. */
export interface ForkedSequence {
  /** Tokens of the child that have K/V (the parent's, or only its full blocks' without a partial copy). */
  readonly numTokens: number;
  /** Blocks the child shares with the parent by reference (released leading blocks not counted). */
  readonly sharedBlocks: number;
  /**
   * The parent's partial last block and the child's fresh block that must receive a copy of its
   * K/V (every layer) before the child's next step; absent when there was nothing to copy.
   */
  readonly copy?: { readonly src: number; readonly dst: number };
}

/**
 * Paged KV-cache bookkeeping for the scheduler: per-sequence block tables over a shared
 * {@link BlockPool}, with chained-hash prefix caching of full blocks.
 *
 * Protocol per step: for a waiting (new or preempted) sequence call {@link getComputedBlocks} then
 * {@link allocateSlots} with its result; for a running one call {@link allocateSlots} with the
 * tokens it will compute. A `null` from `allocateSlots` means "not enough free blocks" and changes
 * nothing. Blocks become findable as soon as they are registered (at allocation): the engine must
 * write the K/V of every scheduled token before any attention in the same step reads them.
 */
export class KvCacheManager {
  /** The underlying pool (read-only use; mutating it directly breaks the manager's invariants). */
  readonly pool: BlockPool;
  readonly blockSize: number;
  readonly enablePrefixCaching: boolean;
  readonly maxBlocksPerSeq: number;
  private readonly hashFn: BlockHashFn;
  private readonly seqs = new Map<SeqId, BlockTable>();
  /** Insertion-ordered, bounded memory of freed ids (oldest first). */
  private readonly recentlyFreed = new Map<SeqId, true>();
  private readonly freedSeqMemory: number;
  private queries = 0;
  private hits = 0;

  constructor(opts: KvCacheManagerOptions) {
    if (opts === null || typeof opts !== 'object') throw new KvArgumentError('KvCacheManager needs an options object');
    this.pool = new BlockPool(opts.numBlocks, opts.blockSize);
    this.blockSize = opts.blockSize;
    this.enablePrefixCaching = Boolean(opts.enablePrefixCaching);
    const max = opts.maxBlocksPerSeq ?? opts.numBlocks - 1;
    if (!Number.isInteger(max) || max < 1) {
      throw new KvArgumentError(`maxBlocksPerSeq must be a positive integer, got ${max}`);
    }
    this.maxBlocksPerSeq = max;
    this.hashFn = opts.hashFn ?? sha256BlockHash;
    if (typeof this.hashFn !== 'function') throw new KvArgumentError('hashFn must be a function');
    const mem = opts.freedSeqMemory ?? 4096;
    if (!Number.isInteger(mem) || mem < 0) throw new KvArgumentError(`freedSeqMemory must be a non-negative integer, got ${mem}`);
    this.freedSeqMemory = mem;
  }

  /** Free blocks (cached-but-free ones included). */
  get numFreeBlocks(): number {
    return this.pool.numFree;
  }

  /** Fraction of usable blocks in use, in [0, 1]. */
  get usage(): number {
    return this.pool.usage;
  }

  /** Whether `seqId` currently holds blocks. */
  hasSequence(seqId: SeqId): boolean {
    return this.seqs.has(seqId);
  }

  /** Token positions of `seqId` that have a slot. */
  numTokens(seqId: SeqId): number {
    return this.table(seqId).numTokens;
  }

  /**
   * Finds the longest cached prefix of `tokens` for a sequence being (re-)admitted. Only full
   * blocks are reused and never the block holding the last token, which must be computed to
   * produce logits: at most `floor((tokens.length - 1) / blockSize)` blocks. Every candidate is
   * checked against its stored tokens, extra keys and parent, so a hash collision is a miss.
   * Counts `tokens.length` queries and the hit tokens (only when prefix caching is on).
   * Takes no references: pass the result to {@link allocateSlots} before any other allocation.
   */
  getComputedBlocks(seqId: SeqId, tokens: ArrayLike<number>, extraKeys?: ExtraKeys): ComputedBlocks {
    if (this.seqs.has(seqId)) throw new SequenceExistsError(seqId);
    checkTokens(tokens);
    const extra = normalizeExtraKeys(extraKeys);
    if (!this.enablePrefixCaching) {
      return { seqId, blocks: [], numComputedTokens: 0, hashes: [], stamps: [], extraKeys: extra };
    }
    const bs = this.blockSize;
    const maxBlocks = tokens.length === 0 ? 0 : Math.min(Math.floor((tokens.length - 1) / bs), this.maxBlocksPerSeq);
    // levels[i] = every cached block that can stand at logical position i of this prompt. Usually
    // one; several when equal content was registered twice, and the chain may continue through
    // any of them, so keep all until the walk ends.
    const levels: KvBlock[][] = [];
    const hashes: BlockHash[] = [];
    let parent: BlockHash | null = null;
    for (let i = 0; i < maxBlocks; i++) {
      const tok = blockTokens(tokens, i, bs);
      const hash = hashBlock(this.hashFn, parent, tok, i, extra);
      const tag = i === 0 ? extra.firstTag : extra.restTag;
      const prev = i === 0 ? undefined : levels[i - 1];
      const matched: KvBlock[] = [];
      for (const c of this.pool.lookup(hash)) {
        if (c.extraTag !== tag || c.tokens === undefined || !tokensEqual(c.tokens, tok)) continue;
        const parentOk = prev === undefined ? c.parentRegId === 0 : prev.some((p) => p.regId === c.parentRegId);
        if (parentOk) matched.push(c);
      }
      if (matched.length === 0) break;
      levels.push(matched);
      hashes.push(hash);
      parent = hash;
    }
    const blocks = new Array<KvBlock>(levels.length);
    if (levels.length > 0) {
      let cur = levels[levels.length - 1][0];
      for (let i = levels.length - 1; i >= 0; i--) {
        blocks[i] = cur;
        if (i > 0) cur = levels[i - 1].find((p) => p.regId === cur.parentRegId) as KvBlock;
      }
    }
    const numComputedTokens = blocks.length * bs;
    this.queries += tokens.length;
    this.hits += numComputedTokens;
    return { seqId, blocks, numComputedTokens, hashes, stamps: blocks.map((b) => b.regId), extraKeys: extra };
  }

  /**
   * Makes room for `numNewTokens` more tokens of `seqId` and returns the ids of the newly
   * allocated blocks (possibly none), or `null` when the pool lacks free blocks, in which case
   * nothing changed.
   *
   * For a sequence not yet admitted, `computedBlocks` (from {@link getComputedBlocks}) are
   * referenced and the new tokens start after them; `extraKeys` may be given instead when there
   * was no lookup. For an admitted sequence the new tokens follow the ones already slotted.
   * `allTokens` is the sequence's full known token list (prompt and generated) and must cover
   * every slotted token; blocks that become full are hashed and registered from it.
   */
  allocateSlots(
    seqId: SeqId,
    allTokens: ArrayLike<number>,
    numNewTokens: number,
    computedBlocks?: ComputedBlocks,
    extraKeys?: ExtraKeys,
  ): number[] | null {
    if (!Number.isInteger(numNewTokens) || numNewTokens < 1) {
      throw new KvArgumentError(`numNewTokens must be a positive integer, got ${numNewTokens}`);
    }
    checkTokens(allTokens);
    const existing = this.seqs.get(seqId);
    if (existing !== undefined && (computedBlocks !== undefined || extraKeys !== undefined)) {
      throw new KvArgumentError(
        `sequence ${String(seqId)} is already admitted; computed blocks and extra keys apply at admission only`,
      );
    }
    const computed = existing === undefined ? (computedBlocks ?? null) : null;
    let extra: NormalizedExtraKeys;
    if (existing !== undefined) extra = existing.extra;
    else if (computed !== null) {
      this.checkComputed(seqId, computed);
      extra = computed.extraKeys;
      if (extraKeys !== undefined && normalizeExtraKeys(extraKeys).firstTag !== extra.firstTag) {
        throw new KvArgumentError('extraKeys differ from the ones used for getComputedBlocks');
      }
    } else extra = normalizeExtraKeys(extraKeys);

    const bs = this.blockSize;
    const numComputed = existing?.numTokens ?? computed?.numComputedTokens ?? 0;
    const total = numComputed + numNewTokens;
    if (allTokens.length < total) {
      throw new KvArgumentError(
        `allTokens has ${allTokens.length} tokens, fewer than the ${total} that would have slots`,
      );
    }
    for (let p = numComputed; p < total; p++) checkTokenId(allTokens[p], p);

    const neededBlocks = Math.ceil(total / bs);
    if (neededBlocks > this.maxBlocksPerSeq) throw new MaxBlocksPerSeqError(seqId, neededBlocks, this.maxBlocksPerSeq);
    const heldBlocks = existing?.blocks.length ?? computed?.blocks.length ?? 0;
    const numNewBlocks = Math.max(0, neededBlocks - heldBlocks);
    // Touching a free computed block takes it out of the free queue, so it cannot also serve
    // as a new block.
    let evictableComputed = 0;
    if (computed !== null) for (const b of computed.blocks) if (b.refCount === 0) evictableComputed++;
    if (numNewBlocks > this.pool.numFree - evictableComputed) return null;

    // Hash before committing so a throwing hash function or bad token leaves the state intact.
    const firstToHash = existing?.numHashed ?? computed?.blocks.length ?? 0;
    const fullBlocks = this.enablePrefixCaching ? Math.floor(total / bs) : firstToHash;
    const pending: { hash: BlockHash; tokens: Uint32Array }[] = [];
    let parent: BlockHash | null =
      firstToHash === 0 ? null : (existing?.hashes[firstToHash - 1] ?? (computed as ComputedBlocks).hashes[firstToHash - 1]);
    for (let i = firstToHash; i < fullBlocks; i++) {
      const tokens = blockTokens(allTokens, i, bs);
      const hash = hashBlock(this.hashFn, parent, tokens, i, extra);
      pending.push({ hash, tokens });
      parent = hash;
    }

    // Commit.
    let table = existing;
    if (table === undefined) {
      table = new BlockTable(seqId, bs, extra);
      if (computed !== null) {
        this.pool.touch(computed.blocks);
        table.push(computed.blocks);
        table.hashes.push(...computed.hashes);
      }
      this.seqs.set(seqId, table);
      this.recentlyFreed.delete(seqId);
    }
    const fresh = this.pool.getNewBlocks(numNewBlocks);
    table.push(fresh);
    table.numTokens = total;
    for (let k = 0; k < pending.length; k++) {
      const i = firstToHash + k;
      this.pool.register(table.blocks[i], {
        hash: pending[k].hash,
        tokens: pending[k].tokens,
        extraTag: i === 0 ? extra.firstTag : extra.restTag,
        parentRegId: i === 0 ? 0 : table.parentStamp(i - 1),
      });
      table.hashes.push(pending[k].hash);
    }
    return fresh.map((b) => b.id);
  }

  /**
   * Makes `seqId` hold blocks for its first `numTokens` positions without giving the new positions
   * slots: blocks a step enqueued ahead of the host will write (run-ahead decode, where the device
   * finds the next position's slot in the block table itself). The positions get their slots, and
   * full blocks their prefix-cache registration, from {@link allocateSlots} as usual, which uses
   * the held blocks before taking new ones. Returns the ids of the blocks taken now (possibly
   * none), or `null`, changing nothing, when the pool lacks free blocks.
   */
  reserveBlocks(seqId: SeqId, numTokens: number): number[] | null {
    const t = this.table(seqId);
    if (!Number.isInteger(numTokens) || numTokens < 1) {
      throw new KvArgumentError(`numTokens must be a positive integer, got ${numTokens}`);
    }
    const needed = Math.ceil(numTokens / this.blockSize);
    if (needed > this.maxBlocksPerSeq) throw new MaxBlocksPerSeqError(seqId, needed, this.maxBlocksPerSeq);
    const n = needed - t.blocks.length;
    if (n <= 0) return [];
    if (n > this.pool.numFree) return null;
    const fresh = this.pool.getNewBlocks(n);
    t.push(fresh);
    return fresh.map((b) => b.id);
  }

  /**
   * Sliding-window attention: gives back to the pool every block of `seqId` whose positions are all
   * below `position` (when every layer's window is W and the sequence next computes position p,
   * `position` = p - W + 1: no attention reads those blocks again). Only blocks whose K/V were
   * written may be released (`position` at most the computed tokens); the caller guarantees it.
   * Released blocks keep their prefix-cache registration (their K/V stay valid for a request with
   * the same prefix) and are reused in LRU order like any freed block. The table keeps its logical
   * length; released entries read as the null block. Returns the number of blocks released now.
   */
  releaseBlocksBefore(seqId: SeqId, position: number): number {
    const t = this.table(seqId);
    if (!Number.isFinite(position)) throw new KvArgumentError(`position must be a finite number, got ${position}`);
    const upTo = Math.min(Math.floor(Math.max(0, position) / this.blockSize), t.blocks.length, Math.floor(t.numTokens / this.blockSize));
    if (upTo <= t.numReleased) return 0;
    const released = t.blocks.slice(t.numReleased, upTo);
    // Tail-first, as in free(): a chain's tail is evicted before its prefix.
    this.pool.free(released.slice().reverse());
    t.releasedRegId = released[released.length - 1].regId;
    const nb = this.pool.nullBlock;
    for (let i = t.numReleased; i < upTo; i++) {
      t.blocks[i] = nb;
      t.ids[i] = nb.id;
    }
    const n = upTo - t.numReleased;
    t.numReleased = upTo;
    return n;
  }

  /**
   * Shared-prefix fork: a new sequence `childId` continues from `parentId`'s tokens. The parent's
   * full blocks are shared by reference (refcount + 1 each, nothing copied; the child keeps the
   * parent's prefix-cache chain and released leading blocks). The partial last block, which both
   * would write next, is copy-on-write:
   *
   * - `copyPartial` true: the child gets a fresh block for it and the result names the copy the
   *   caller must make (`copy.src` -> `copy.dst`, the K/V of every layer); the child then has the
   *   parent's `numTokens`. Returns `null`, changing nothing, when no block is free for it.
   * - `copyPartial` false: the child takes only the full blocks, its `numTokens` stops at the last
   *   full block and the caller recomputes the tail (e.g. where K/V pages cannot be copied in
   *   place). Throws when the parent has no full block to share.
   *
   * A parent without a partial block shares everything and copies nothing. Freeing either side
   * later only drops its references; the shared blocks return to the pool with the last holder.
   */
  forkSequence(parentId: SeqId, childId: SeqId, copyPartial = true): ForkedSequence | null {
    const p = this.table(parentId);
    if (this.seqs.has(childId)) throw new SequenceExistsError(childId);
    const bs = this.blockSize;
    const full = Math.floor(p.numTokens / bs);
    // (Blocks held past the tokens, reserveBlocks, stay the parent's.)
    const partial = p.numTokens % bs !== 0;
    if (!copyPartial && full === 0) {
      throw new KvArgumentError(`sequence ${String(parentId)} has no full block to share (${p.numTokens} tokens, block size ${bs})`);
    }
    if (copyPartial && partial && this.pool.numFree < 1) return null;
    const shared = p.blocks.slice(p.numReleased, full);
    const t = new BlockTable(childId, bs, p.extra);
    t.numReleased = p.numReleased;
    t.releasedRegId = p.releasedRegId;
    this.pool.touch(shared);
    t.push(p.blocks.slice(0, full));
    t.hashes.push(...p.hashes.slice(0, full));
    let copy: { src: number; dst: number } | undefined;
    if (partial && copyPartial) {
      const [fresh] = this.pool.getNewBlocks(1);
      t.push([fresh]);
      copy = { src: p.blocks[full].id, dst: fresh.id };
    }
    t.numTokens = partial && !copyPartial ? full * bs : p.numTokens;
    this.seqs.set(childId, t);
    this.recentlyFreed.delete(childId);
    return copy ? { numTokens: t.numTokens, sharedBlocks: shared.length, copy } : { numTokens: t.numTokens, sharedBlocks: shared.length };
  }

  /** Leading blocks of `seqId` released by {@link releaseBlocksBefore}. */
  numReleasedBlocks(seqId: SeqId): number {
    return this.table(seqId).numReleased;
  }

  /** The physical block ids of `seqId`, logical order. A live view: do not mutate. */
  blockTable(seqId: SeqId): readonly number[] {
    return this.table(seqId).ids;
  }

  /** Physical KV slot of token `position` of `seqId`. */
  slotFor(seqId: SeqId, position: number): number {
    return this.table(seqId).slotFor(position);
  }

  /**
   * Writes `seqId`'s block ids into `out[offset … offset + width)` padded with the null block id;
   * allocation-free for use while building a decode batch.
   */
  writeBlockTable(seqId: SeqId, out: Int32Array, offset: number, width: number): void {
    this.table(seqId).writeTo(out, offset, width);
  }

  /**
   * Releases every block of `seqId`, tail-first so that the end of a chain is evicted before its
   * prefix. Also the first half of preempt-by-recompute: re-admit later through
   * {@link getComputedBlocks}, which may still find the sequence's full blocks.
   */
  free(seqId: SeqId): void {
    const table = this.seqs.get(seqId);
    if (table === undefined) {
      if (this.recentlyFreed.has(seqId)) throw new DoubleFreeError(`sequence ${String(seqId)}`);
      throw new UnknownSequenceError(seqId);
    }
    const reversed = table.liveBlocks.reverse();
    this.pool.free(reversed);
    this.seqs.delete(seqId);
    if (this.freedSeqMemory > 0) {
      this.recentlyFreed.set(seqId, true);
      if (this.recentlyFreed.size > this.freedSeqMemory) {
        this.recentlyFreed.delete(this.recentlyFreed.keys().next().value as SeqId);
      }
    }
  }

  /** Drops every cached hash; only when no sequence holds blocks. Returns whether it happened. */
  resetPrefixCache(): boolean {
    return this.pool.resetPrefixCache();
  }

  /** Current counters. */
  stats(): KvCacheStats {
    const free = this.pool.numFree;
    return {
      totalBlocks: this.pool.numBlocks,
      freeBlocks: free,
      usedBlocks: this.pool.numBlocks - free,
      prefixQueries: this.queries,
      prefixHits: this.hits,
      cachedBlocks: this.pool.numCachedBlocks,
      evictedBlocks: this.pool.numEvictions,
      sequences: this.seqs.size,
      sharedBlocks: this.pool.numSharedBlocks,
    };
  }

  /**
   * Verifies every bookkeeping invariant and throws {@link KvInvariantError} listing each broken
   * one: refcounts non-negative and equal to the number of sequences holding the block, free +
   * used = total, free queue = exactly the unreferenced blocks, no stale or missing hash entries,
   * no duplicates inside one table, tables sized to their tokens, hashed prefixes chained.
   */
  checkInvariants(): void {
    const v: string[] = [];
    const holders = new Map<number, number>();
    const bs = this.blockSize;
    for (const [id, t] of this.seqs) {
      const name = `sequence ${String(id)}`;
      const seen = new Set<number>();
      for (const b of t.liveBlocks) {
        if (seen.has(b.id)) v.push(`${name}: block ${b.id} appears twice in one table`);
        seen.add(b.id);
        holders.set(b.id, (holders.get(b.id) ?? 0) + 1);
      }
      for (let i = 0; i < t.numReleased; i++) if (t.blocks[i] !== this.pool.nullBlock) v.push(`${name}: released entry ${i} is not the null block`);
      if (t.numReleased * bs > t.numTokens) v.push(`${name}: ${t.numReleased} released blocks but only ${t.numTokens} tokens`);
      // Blocks past the tokens are allowed: reserveBlocks.
      if (t.numTokens < 1 || t.blocks.length < Math.ceil(t.numTokens / bs)) {
        v.push(`${name}: ${t.blocks.length} blocks for ${t.numTokens} tokens`);
      }
      if (t.blocks.length > this.maxBlocksPerSeq) v.push(`${name}: ${t.blocks.length} blocks > maxBlocksPerSeq`);
      if (t.ids.length !== t.blocks.length || t.blocks.some((b, i) => t.ids[i] !== b.id)) {
        v.push(`${name}: id list out of sync with its blocks`);
      }
      if (seen.has(this.pool.nullBlock.id)) v.push(`${name}: holds the null block`);
      const expectHashed = this.enablePrefixCaching ? Math.floor(t.numTokens / bs) : 0;
      if (t.numHashed !== expectHashed) v.push(`${name}: ${t.numHashed} hashed blocks, expected ${expectHashed}`);
      for (let i = t.numReleased; i < Math.min(t.numHashed, t.blocks.length); i++) {
        const b = t.blocks[i];
        if (b.hash !== t.hashes[i]) v.push(`${name}: block ${b.id} hash ${String(b.hash)} != table hash ${t.hashes[i]}`);
        const parentReg = i === 0 ? 0 : t.parentStamp(i - 1);
        if (b.parentRegId !== parentReg) v.push(`${name}: block ${b.id} is not chained to its predecessor`);
      }
    }
    if (this.hits > this.queries || this.hits < 0) v.push(`prefix hits ${this.hits} > queries ${this.queries}`);
    this.pool.collectViolations(v, holders);
    if (v.length > 0) throw new KvInvariantError(v);
  }

  private table(seqId: SeqId): BlockTable {
    const t = this.seqs.get(seqId);
    if (t === undefined) throw new UnknownSequenceError(seqId);
    return t;
  }

  private checkComputed(seqId: SeqId, c: ComputedBlocks): void {
    if (c.seqId !== seqId) {
      throw new KvArgumentError(`computed blocks were looked up for ${String(c.seqId)}, not ${String(seqId)}`);
    }
    if (c.blocks.length !== c.stamps.length || c.blocks.length !== c.hashes.length || c.numComputedTokens !== c.blocks.length * this.blockSize) {
      throw new KvArgumentError('computed blocks result is malformed');
    }
    for (let i = 0; i < c.blocks.length; i++) {
      const b = c.blocks[i];
      if (b.regId !== c.stamps[i] || b.hash !== c.hashes[i]) {
        throw new StaleComputedBlocksError(seqId, `block ${b.id} was evicted after the prefix lookup`);
      }
    }
  }
}

function checkTokens(tokens: ArrayLike<number>): void {
  if (tokens === null || typeof tokens !== 'object' || typeof tokens.length !== 'number') {
    throw new KvArgumentError('tokens must be an array of token ids');
  }
}
