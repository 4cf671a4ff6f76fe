import { describe, expect, it } from 'vitest';
import { Arena, ARENA_ALIGN, CudaOutOfMemoryError } from '../src/index.js';

describe('Arena', () => {
  it('aligns every sub-allocation to 256 bytes', () => {
    const a = new Arena('vram', 4096);
    const x = a.alloc(1);
    const y = a.alloc(300);
    const z = a.alloc(0);
    expect([x.offset, y.offset, z.offset]).toEqual([0, 256, 768]);
    expect(y.size).toBe(512);
    for (const r of [x, y, z]) expect(r.offset % ARENA_ALIGN).toBe(0);
    expect(a.usedBytes).toBe(1024);
  });

  it('throws a typed OOM beyond the arena, without corrupting it', () => {
    const a = new Arena('pinned', 1024);
    a.alloc(512);
    expect(() => a.alloc(600)).toThrow(CudaOutOfMemoryError);
    expect(() => a.alloc(600)).toThrow(/pinned: cannot allocate 600 bytes/);
    expect(a.alloc(512).offset).toBe(512);
  });

  it('coalesces freed neighbours so a large block fits again', () => {
    const a = new Arena('vram', 1024);
    const r = [a.alloc(256), a.alloc(256), a.alloc(256), a.alloc(256)];
    a.free(r[1].offset, r[1].size);
    a.free(r[3].offset, r[3].size);
    expect(a.largestFree()).toBe(256);
    a.free(r[2].offset, r[2].size);
    expect(a.largestFree()).toBe(768);
    a.free(r[0].offset, r[0].size);
    expect(a.largestFree()).toBe(1024);
    expect(a.usedBytes).toBe(0);
    expect(a.alloc(1024).offset).toBe(0);
  });
});
