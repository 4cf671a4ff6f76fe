import type { BlockHash } from './block-hash.js';
import { DoubleFreeError, KvArgumentError, KvError, KvInvariantError, OutOfBlocksError } from './errors.js';
import { FreeBlockQueue } from './free-queue.js';
import { KvBlock } from './kv-block.js';

/** Id of the reserved null block: never handed out, used by the engine to pad block tables. */
export const NULL_BLOCK_ID = 0;

/** Fields a registered (hashed) block carries; see {@link BlockPool.register}. */
export interface BlockRegistration {
  readonly hash: BlockHash;
  readonly tokens: Uint32Array;
  readonly extraTag: string;
  /** `regId` of the parent block, 0 for a first block. */
  readonly parentRegId: number;
}

/**
 * Fixed pool of KV blocks with refcounts, an LRU free queue and the hash → block prefix-cache map.
 *
 * Eviction is lazy: a freed block keeps its hash and stays findable as a prefix hit until it is
 * popped for reuse, at which point its hash entry is dropped. Block 0 is the null block.
 */
export class BlockPool {
  /** The reserved null block (id {@link NULL_BLOCK_ID}). */
  readonly nullBlock: KvBlock;
  private readonly blocks: KvBlock[];
  private readonly freeQueue: FreeBlockQueue;
  /** Several blocks may share a hash (same content registered twice, or a real collision). */
  private readonly cache = new Map<BlockHash, KvBlock[]>();
  private numCached = 0;
  private nextRegId = 1;
  private evicted = 0;
  /** Blocks with refCount >= 2 (held by several sequences: prefix hits, forks). */
  private shared = 0;

  constructor(
    /** Total blocks including the null block; at least 2. */
    readonly numBlocks: number,
    /** Tokens per block; at least 1. */
    readonly blockSize: number,
  ) {
    if (!Number.isInteger(numBlocks) || numBlocks < 2) {
      throw new KvArgumentError(`numBlocks must be an integer >= 2 (one is the null block), got ${numBlocks}`);
    }
    if (!Number.isInteger(blockSize) || blockSize < 1) {
      throw new KvArgumentError(`blockSize must be a positive integer, got ${blockSize}`);
    }
    this.blocks = Array.from({ length: numBlocks }, (_, i) => new KvBlock(i));
    this.nullBlock = this.blocks[NULL_BLOCK_ID];
    this.freeQueue = new FreeBlockQueue(this.blocks.slice(1));
  }

  /** Blocks that can be handed out now (including cached-but-free ones). */
  get numFree(): number {
    return this.freeQueue.length;
  }

  /** Fraction of usable (non-null) blocks held by sequences, in [0, 1]. */
  get usage(): number {
    return 1 - this.freeQueue.length / (this.numBlocks - 1);
  }

  /** Blocks currently registered in the prefix cache (held or free). */
  get numCachedBlocks(): number {
    return this.numCached;
  }

  /** Cached blocks whose hash was dropped because the block was reused. */
  get numEvictions(): number {
    return this.evicted;
  }

  /** Blocks held by two or more sequences at once (refCount >= 2): prefix-cache hits and forks. */
  get numSharedBlocks(): number {
    return this.shared;
  }

  /** The block with physical id `id`. */
  block(id: number): KvBlock {
    const b = this.blocks[id];
    if (!Number.isInteger(id) || b === undefined) throw new KvArgumentError(`no block with id ${id}`);
    return b;
  }

  /** Free block ids from least to most recently used (the order they will be reused in). */
  freeBlockIds(): number[] {
    return this.freeQueue.ids();
  }

  /**
   * Pops `n` least recently used free blocks, evicting their prefix-cache entries, and gives each
   * a refcount of 1. Throws {@link OutOfBlocksError} (and changes nothing) if fewer are free.
   */
  getNewBlocks(n: number): KvBlock[] {
    if (!Number.isInteger(n) || n < 0) throw new KvArgumentError(`block count must be a non-negative integer, got ${n}`);
    if (n > this.freeQueue.length) throw new OutOfBlocksError(n, this.freeQueue.length);
    const out = this.freeQueue.popleftN(n);
    for (const b of out) {
      if (b.hash !== undefined) {
        this.unregister(b);
        this.evicted++;
      }
      b.refCount = 1;
    }
    return out;
  }

  /** Takes a reference on each block (a prefix hit); a free block leaves the free queue. */
  touch(blocks: readonly KvBlock[]): void {
    for (const b of blocks) {
      if (b === this.nullBlock) throw new KvArgumentError('the null block cannot be referenced');
      if (b.refCount === 0) this.freeQueue.remove(b);
      b.refCount++;
      if (b.refCount === 2) this.shared++;
    }
  }

  /**
   * Drops one reference on each block, in the given order; a block reaching 0 joins the tail of
   * the free queue. Pass a sequence's blocks tail-first so chain tails are evicted before their
   * prefixes. Validates every block before changing anything.
   */
  free(blocks: readonly KvBlock[]): void {
    const pending = new Map<KvBlock, number>();
    for (const b of blocks) {
      if (b === this.nullBlock) throw new KvArgumentError('the null block cannot be freed');
      const n = (pending.get(b) ?? 0) + 1;
      if (n > b.refCount) throw new DoubleFreeError(`block ${b.id} (refCount ${b.refCount})`);
      pending.set(b, n);
    }
    for (const b of blocks) {
      b.refCount--;
      if (b.refCount === 1) this.shared--;
      if (b.refCount === 0) this.freeQueue.append(b);
    }
  }

  /**
   * Drops the prefix-cache entry of a free block (its K/V are about to be discarded: a tiered
   * cache evicting a page it has no room for). The block stays in the free queue. Returns whether
   * it was registered. A held block is refused: its sequences rely on its identity.
   */
  forget(id: number): boolean {
    const b = this.block(id);
    if (b.refCount !== 0) throw new KvError('KV_STATE', `block ${id} is held (refCount ${b.refCount}); only a free block can be forgotten`);
    if (b.hash === undefined) return false;
    this.unregister(b);
    this.evicted++;
    return true;
  }

  /** Blocks registered under `hash` (possibly several; callers must verify tokens). */
  lookup(hash: BlockHash): readonly KvBlock[] {
    return this.cache.get(hash) ?? EMPTY;
  }

  /**
   * Registers a full, held block in the prefix cache and stamps it with a fresh `regId`.
   * Returns the stamp.
   */
  register(block: KvBlock, reg: BlockRegistration): number {
    if (block === this.nullBlock) throw new KvArgumentError('the null block cannot be cached');
    if (block.refCount === 0) throw new KvError('KV_STATE', `block ${block.id} must be held to be registered`);
    if (block.hash !== undefined) throw new KvError('KV_STATE', `block ${block.id} is already registered`);
    if (reg.tokens.length !== this.blockSize) {
      throw new KvArgumentError(`registered block must hold ${this.blockSize} tokens, got ${reg.tokens.length}`);
    }
    block.hash = reg.hash;
    block.tokens = reg.tokens;
    block.extraTag = reg.extraTag;
    block.parentRegId = reg.parentRegId;
    block.regId = this.nextRegId++;
    const list = this.cache.get(reg.hash);
    if (list === undefined) this.cache.set(reg.hash, [block]);
    else list.push(block);
    this.numCached++;
    return block.regId;
  }

  /**
   * Forgets every cached hash. Only allowed when no block is held (otherwise held blocks would
   * lose the identity their sequences' chains rely on); returns whether it happened.
   */
  resetPrefixCache(): boolean {
    if (this.freeQueue.length !== this.numBlocks - 1) return false;
    for (const list of this.cache.values()) for (const b of list) clearRegistration(b);
    this.cache.clear();
    this.numCached = 0;
    return true;
  }

  /**
   * Checks the pool's invariants and throws {@link KvInvariantError} listing every violation.
   * `holders`, when given, maps block id → number of sequence references; each block's refcount
   * must equal it exactly.
   */
  checkInvariants(holders?: ReadonlyMap<number, number>): void {
    const v: string[] = [];
    this.collectViolations(v, holders);
    if (v.length > 0) throw new KvInvariantError(v);
  }

  /** @internal Same checks as {@link checkInvariants}, appending to `v`. */
  collectViolations(v: string[], holders?: ReadonlyMap<number, number>): void {
    const queued = new Set(this.freeQueue.audit(v));
    const nb = this.nullBlock;
    if (nb.refCount !== 0 || queued.has(nb) || nb.hash !== undefined) {
      v.push('null block must stay unreferenced, unqueued and unhashed');
    }
    let held = 0;
    let hashed = 0;
    let shared = 0;
    for (let i = 1; i < this.blocks.length; i++) {
      const b = this.blocks[i];
      if (!Number.isInteger(b.refCount) || b.refCount < 0) v.push(`block ${b.id}: refCount ${b.refCount}`);
      if (b.refCount > 0) held++;
      if (b.refCount > 1) shared++;
      const inQueue = queued.has(b);
      if (inQueue !== (b.refCount === 0)) {
        v.push(`block ${b.id}: refCount ${b.refCount} but ${inQueue ? 'in' : 'not in'} the free queue`);
      }
      if (holders !== undefined && (holders.get(b.id) ?? 0) !== b.refCount) {
        v.push(`block ${b.id}: refCount ${b.refCount} but held by ${holders.get(b.id) ?? 0} sequence(s)`);
      }
      if (b.hash !== undefined) {
        hashed++;
        if (b.tokens?.length !== this.blockSize || b.regId <= 0 || b.extraTag === undefined) {
          v.push(`block ${b.id}: registered without tokens, tag or stamp`);
        }
        if (!this.cache.get(b.hash)?.includes(b)) v.push(`block ${b.id}: hash ${b.hash} missing from the cache map`);
      } else if (b.tokens !== undefined || b.regId !== 0) {
        v.push(`block ${b.id}: unregistered but keeps tokens or a stamp`);
      }
    }
    if (shared !== this.shared) v.push(`${shared} blocks have refCount >= 2, the shared counter says ${this.shared}`);
    if (held + 1 + this.freeQueue.length !== this.numBlocks) {
      v.push(`free (${this.freeQueue.length}) + used (${held + 1}) != total (${this.numBlocks})`);
    }
    let entries = 0;
    for (const [hash, list] of this.cache) {
      if (list.length === 0) v.push(`hash ${hash}: empty entry`);
      if (new Set(list).size !== list.length) v.push(`hash ${hash}: block listed twice`);
      for (const b of list) {
        entries++;
        if (b.hash !== hash) v.push(`hash ${hash}: stale entry for block ${b.id} (now ${String(b.hash)})`);
        if (b === nb) v.push(`hash ${hash}: points at the null block`);
      }
    }
    if (entries !== hashed || entries !== this.numCached) {
      v.push(`cache map has ${entries} entries, ${hashed} blocks are hashed, counter says ${this.numCached}`);
    }
  }

  private unregister(b: KvBlock): void {
    const hash = b.hash as BlockHash;
    const list = this.cache.get(hash);
    const i = list === undefined ? -1 : list.indexOf(b);
    if (list === undefined || i < 0) throw new KvInvariantError([`block ${b.id}: hash ${hash} not in the cache map`]);
    if (list.length === 1) this.cache.delete(hash);
    else list.splice(i, 1);
    this.numCached--;
    clearRegistration(b);
  }
}

const EMPTY: readonly KvBlock[] = Object.freeze([]);

function clearRegistration(b: KvBlock): void {
  b.hash = undefined;
  b.tokens = undefined;
  b.extraTag = undefined;
  b.regId = 0;
  b.parentRegId = 0;
}
