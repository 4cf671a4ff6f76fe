import type { BlockHash, NormalizedExtraKeys } from './block-hash.js';
import { NULL_BLOCK_ID } from './block-pool.js';
import { KvArgumentError, SlotOutOfRangeError, type SeqId } from './errors.js';
import type { KvBlock } from './kv-block.js';

/**
 * One sequence's logical → physical block map: logical block `i` (token positions
 * `i * blockSize … (i + 1) * blockSize - 1`) lives in physical block `ids[i]`.
 */
export class BlockTable {
  /** Held blocks, logical order. */
  readonly blocks: KvBlock[] = [];
  /** `blocks[i].id`, kept as a plain array the engine can read without mapping. */
  readonly ids: number[] = [];
  /** Chained hashes of the first `hashes.length` (full, registered) blocks. */
  readonly hashes: BlockHash[] = [];
  /** Token positions that have a slot (computed from cache or scheduled for compute). */
  numTokens = 0;
  /**
   * Leading blocks given back to the pool because no attention can read them again (sliding-window
   * attention, {@link KvCacheManager.releaseBlocksBefore}): their entries hold the null block and
   * their positions have no slot. The table keeps its logical length.
   */
  numReleased = 0;
  /** `regId` the last released block had when it was released: the parent stamp of the next registration. */
  releasedRegId = 0;

  constructor(
    readonly seqId: SeqId,
    readonly blockSize: number,
    /** Extra keys the sequence's blocks are hashed with. */
    readonly extra: NormalizedExtraKeys,
  ) {}

  /** Number of leading blocks registered in the prefix cache. */
  get numHashed(): number {
    return this.hashes.length;
  }

  /** Appends held blocks in logical order. */
  push(blocks: readonly KvBlock[]): void {
    for (const b of blocks) {
      this.blocks.push(b);
      this.ids.push(b.id);
    }
  }

  /** Held (not released) blocks, logical order. */
  get liveBlocks(): KvBlock[] {
    return this.blocks.slice(this.numReleased);
  }

  /** `regId` of logical block i as a registration's parent stamp (released blocks: their stamp at release). */
  parentStamp(i: number): number {
    if (i >= this.numReleased) return this.blocks[i].regId;
    if (i === this.numReleased - 1) return this.releasedRegId;
    throw new KvArgumentError(`block ${i} of ${String(this.seqId)} was released before its successor was registered`);
  }

  /** Physical slot of token `position`: `ids[position / blockSize] * blockSize + position % blockSize`. */
  slotFor(position: number): number {
    if (!Number.isInteger(position) || position < 0 || position >= this.numTokens) {
      throw new SlotOutOfRangeError(this.seqId, position, this.numTokens);
    }
    const bs = this.blockSize;
    if (position < this.numReleased * bs) {
      throw new KvArgumentError(`sequence ${String(this.seqId)}: position ${position} is in a released block (positions below ${this.numReleased * bs} have no slot)`);
    }
    return this.ids[Math.floor(position / bs)] * bs + (position % bs);
  }

  /**
   * Writes the block ids into `out[offset … offset + width)` and pads the rest with the null
   * block, the layout paged-attention kernels take (released leading blocks read as the null block). Allocation-free, so it may run on the hot path.
   */
  writeTo(out: Int32Array, offset: number, width: number): void {
    if (!Number.isInteger(width) || width < this.ids.length) {
      throw new KvArgumentError(`block table of ${String(this.seqId)} has ${this.ids.length} blocks, width is ${width}`);
    }
    if (!Number.isInteger(offset) || offset < 0 || offset + width > out.length) {
      throw new KvArgumentError(`row [${offset}, ${offset + width}) does not fit an array of ${out.length}`);
    }
    const n = this.ids.length;
    for (let i = 0; i < n; i++) out[offset + i] = this.ids[i];
    out.fill(NULL_BLOCK_ID, offset + n, offset + width);
  }
}
