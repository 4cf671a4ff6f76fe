import { CudaOutOfMemoryError } from './errors.js';

/** Every sub-allocation starts on this boundary (coalesced and vector loads, cuBLAS alignment). */
export const ARENA_ALIGN = 256;

const alignUp = (x: number, a: number): number => Math.ceil(x / a) * a;

/**
 * First-fit sub-allocator over one reserved range (offsets only; the memory itself was reserved
 * once by the addon). Free ranges are kept sorted and coalesced, so fragmentation stays bounded
 * by the buffers' own layout. No CUDA call happens here.
 */
export class Arena {
  /** Sorted, non-adjacent free ranges [offset, offset + size). */
  private readonly freeList: Array<{ offset: number; size: number }>;
  private used = 0;

  constructor(
    readonly tier: string,
    readonly capacity: number,
  ) {
    this.freeList = capacity > 0 ? [{ offset: 0, size: capacity }] : [];
  }

  get usedBytes(): number {
    return this.used;
  }

  /** Reserves `bytes` (rounded up to the alignment); returns the offset. */
  alloc(bytes: number): { offset: number; size: number } {
    const size = alignUp(Math.max(bytes, 1), ARENA_ALIGN);
    for (let i = 0; i < this.freeList.length; i++) {
      const f = this.freeList[i];
      if (f.size < size) continue;
      const offset = f.offset;
      if (f.size === size) this.freeList.splice(i, 1);
      else {
        f.offset += size;
        f.size -= size;
      }
      this.used += size;
      return { offset, size };
    }
    throw new CudaOutOfMemoryError(this.tier, bytes, `arena of ${this.capacity} bytes has ${this.capacity - this.used} free, no contiguous range large enough`);
  }

  free(offset: number, size: number): void {
    const list = this.freeList;
    let i = 0;
    while (i < list.length && list[i].offset < offset) i++;
    list.splice(i, 0, { offset, size });
    this.used -= size;
    // Merge with the next, then with the previous neighbour.
    if (i + 1 < list.length && list[i].offset + list[i].size === list[i + 1].offset) {
      list[i].size += list[i + 1].size;
      list.splice(i + 1, 1);
    }
    if (i > 0 && list[i - 1].offset + list[i - 1].size === list[i].offset) {
      list[i - 1].size += list[i].size;
      list.splice(i, 1);
    }
  }

  /** Largest contiguous free range, for diagnostics. */
  largestFree(): number {
    return this.freeList.reduce((m, f) => Math.max(m, f.size), 0);
  }
}
