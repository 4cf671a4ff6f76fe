import { describe, expect, it } from 'vitest';
import { FreeBlockQueue, FreeQueueError, KvBlock } from '../src/index.js';

const mk = (n: number) => Array.from({ length: n }, (_, i) => new KvBlock(i + 1));

describe('FreeBlockQueue', () => {
  it('pops least recently used first and appends at the tail', () => {
    const bs = mk(4);
    const q = new FreeBlockQueue(bs);
    expect(q.length).toBe(4);
    expect(q.popleft().id).toBe(1);
    q.append(bs[0]);
    expect(q.ids()).toEqual([2, 3, 4, 1]);
    expect(q.popleftN(3).map((b) => b.id)).toEqual([2, 3, 4]);
    expect(q.ids()).toEqual([1]);
  });

  it('removes from the head, middle and tail in O(1) and keeps links consistent', () => {
    const bs = mk(5);
    const q = new FreeBlockQueue(bs);
    q.remove(bs[2]);
    q.remove(bs[0]);
    q.remove(bs[4]);
    expect(q.ids()).toEqual([2, 4]);
    expect(bs[2].isQueued).toBe(false);
    expect(bs[1].isQueued).toBe(true);
    const v: string[] = [];
    expect(q.audit(v).map((b) => b.id)).toEqual([2, 4]);
    expect(v).toEqual([]);
    q.append(bs[2]);
    expect(q.ids()).toEqual([2, 4, 3]);
    expect(q.peek()?.id).toBe(2);
  });

  it('rejects misuse with FreeQueueError', () => {
    const bs = mk(2);
    const q = new FreeBlockQueue([bs[0]]);
    expect(() => q.remove(bs[1])).toThrow(FreeQueueError);
    expect(() => q.append(bs[0])).toThrow(FreeQueueError);
    expect(() => q.popleftN(2)).toThrow(FreeQueueError);
    q.popleft();
    expect(() => q.popleft()).toThrow(FreeQueueError);
    expect(q.peek()).toBeUndefined();
  });

  it('audit detects a corrupted link', () => {
    const bs = mk(3);
    const q = new FreeBlockQueue(bs);
    bs[2].prevFree = bs[0]; // break the back-link of block 3
    const v: string[] = [];
    q.audit(v);
    expect(v.some((s) => s.includes('block 3'))).toBe(true);
  });
});
