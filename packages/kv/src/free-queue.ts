import { FreeQueueError } from './errors.js';
import { KvBlock } from './kv-block.js';

/**
 * Intrusive doubly-linked list of free blocks, least recently used at the head.
 *
 * The links live in the blocks themselves so that taking a block back on a prefix-cache hit
 * (removal from the middle) is O(1) without a side index. Two sentinels remove every edge case
 * from the link updates.
 */
export class FreeBlockQueue {
  private readonly head = new KvBlock(-1);
  private readonly tail = new KvBlock(-2);
  private count = 0;

  /** Builds a queue holding `blocks` in order (first = least recently used). */
  constructor(blocks: Iterable<KvBlock> = []) {
    this.head.nextFree = this.tail;
    this.tail.prevFree = this.head;
    for (const b of blocks) this.append(b);
  }

  /** Number of queued blocks. */
  get length(): number {
    return this.count;
  }

  /** The least recently used block, without removing it. */
  peek(): KvBlock | undefined {
    return this.count === 0 ? undefined : (this.head.nextFree as KvBlock);
  }

  /** Removes and returns the least recently used block. */
  popleft(): KvBlock {
    if (this.count === 0) throw new FreeQueueError('popleft on an empty free queue');
    const b = this.head.nextFree as KvBlock;
    this.unlink(b);
    return b;
  }

  /** Removes and returns the `n` least recently used blocks, head first. */
  popleftN(n: number): KvBlock[] {
    if (!Number.isInteger(n) || n < 0) throw new FreeQueueError(`popleftN: bad count ${n}`);
    if (n > this.count) throw new FreeQueueError(`popleftN(${n}) with only ${this.count} queued`);
    const out = new Array<KvBlock>(n);
    for (let i = 0; i < n; i++) out[i] = this.popleft();
    return out;
  }

  /** Appends `block` as the most recently used one. */
  append(block: KvBlock): void {
    if (block.prevFree !== null || block.nextFree !== null) {
      throw new FreeQueueError(`block ${block.id} is already in the free queue`);
    }
    const last = this.tail.prevFree as KvBlock;
    last.nextFree = block;
    block.prevFree = last;
    block.nextFree = this.tail;
    this.tail.prevFree = block;
    this.count++;
  }

  /** Removes `block` from wherever it sits in the queue (O(1)). */
  remove(block: KvBlock): void {
    if (block.prevFree === null || block.nextFree === null) {
      throw new FreeQueueError(`block ${block.id} is not in the free queue`);
    }
    this.unlink(block);
  }

  /** Iterates from least to most recently used. */
  *[Symbol.iterator](): IterableIterator<KvBlock> {
    for (let b = this.head.nextFree; b !== null && b !== this.tail; b = b.nextFree) yield b;
  }

  /** Block ids from least to most recently used (diagnostics and tests). */
  ids(): number[] {
    const out: number[] = [];
    for (const b of this) out.push(b.id);
    return out;
  }

  /**
   * Walks the links and reports every inconsistency (broken back-links, count mismatch, cycles).
   * Returns the blocks seen so callers can check per-block rules.
   */
  audit(violations: string[]): KvBlock[] {
    const seen: KvBlock[] = [];
    let prev = this.head;
    let b = this.head.nextFree;
    // Bound the walk so a corrupted (cyclic) list cannot hang the check.
    while (b !== null && b !== this.tail && seen.length <= this.count) {
      if (b.prevFree !== prev) violations.push(`free queue: block ${b.id} has a broken back-link`);
      seen.push(b);
      prev = b;
      b = b.nextFree;
    }
    if (b !== this.tail) violations.push('free queue: walk did not reach the tail (cycle or broken link)');
    else if (this.tail.prevFree !== prev) violations.push('free queue: tail back-link is broken');
    if (seen.length !== this.count) {
      violations.push(`free queue: counted ${this.count} blocks, walked ${seen.length}`);
    }
    return seen;
  }

  private unlink(b: KvBlock): void {
    const p = b.prevFree as KvBlock;
    const n = b.nextFree as KvBlock;
    p.nextFree = n;
    n.prevFree = p;
    b.prevFree = null;
    b.nextFree = null;
    this.count--;
  }
}
