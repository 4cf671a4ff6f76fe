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

  /** Physical slot of token `position`: `ids[position / blockSize] * blockSize + position % blockSize`. */
  slotFor(position: number): number {
    if (!Number.isInteger(position) || position < 0 || position >= this.numTokens) {
      throw new SlotOutOfRangeError(this.seqId, position, this.numTokens);
    }
    const bs = this.blockSize;
    return this.ids[Math.floor(position / bs)] * bs + (position % bs);
  }

  /**
   * Writes the block ids into `out[offset … offset + width)` and pads the rest with the null
   * block, the layout paged-attention kernels take. Allocation-free, so it may run on the hot path.
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
