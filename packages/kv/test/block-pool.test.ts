import { describe, expect, it } from 'vitest';
import {
  BlockPool,
  DoubleFreeError,
  KvArgumentError,
  KvError,
  KvInvariantError,
  NULL_BLOCK_ID,
  OutOfBlocksError,
} from '../src/index.js';

const reg = (hash: string, bs: number, parentRegId = 0) => ({
  hash,
  tokens: new Uint32Array(bs),
  extraTag: '[]',
  parentRegId,
});

describe('BlockPool', () => {
  it('never hands out the null block and tracks usage', () => {
    const pool = new BlockPool(5, 4);
    expect(pool.numFree).toBe(4);
    expect(pool.usage).toBe(0);
    const got = pool.getNewBlocks(4);
    expect(got.map((b) => b.id)).toEqual([1, 2, 3, 4]);
    expect(got.every((b) => b.refCount === 1)).toBe(true);
    expect(pool.usage).toBe(1);
    expect(() => pool.getNewBlocks(1)).toThrow(OutOfBlocksError);
    expect(pool.nullBlock.id).toBe(NULL_BLOCK_ID);
    expect(() => pool.touch([pool.nullBlock])).toThrow(KvArgumentError);
    expect(() => pool.free([pool.nullBlock])).toThrow(KvArgumentError);
    pool.free(got.slice(0, 2));
    expect(pool.usage).toBe(0.5);
    pool.checkInvariants();
  });

  it('reuses blocks in LRU order: freed blocks go to the tail', () => {
    const pool = new BlockPool(6, 2);
    const [a, b, c] = pool.getNewBlocks(3); // ids 1,2,3; free queue: 4,5
    pool.free([c, a, b]);
    expect(pool.freeBlockIds()).toEqual([4, 5, 3, 1, 2]);
    expect(pool.getNewBlocks(3).map((x) => x.id)).toEqual([4, 5, 3]);
  });

  it('evicts lazily: a freed cached block stays findable until it is reused', () => {
    const pool = new BlockPool(3, 2);
    const [a] = pool.getNewBlocks(1);
    pool.register(a, reg('h1', 2));
    pool.free([a]);
    expect(pool.lookup('h1')).toEqual([a]);
    expect(pool.numCachedBlocks).toBe(1);
    // A hit takes it back out of the middle of the free queue.
    pool.touch([a]);
    expect(a.refCount).toBe(1);
    expect(pool.freeBlockIds()).toEqual([2]);
    pool.free([a]);
    expect(pool.freeBlockIds()).toEqual([2, 1]);
    const [x] = pool.getNewBlocks(1);
    expect(x.id).toBe(2);
    expect(pool.lookup('h1')).toEqual([a]);
    const [y] = pool.getNewBlocks(1);
    expect(y).toBe(a);
    expect(pool.lookup('h1')).toEqual([]);
    expect(a.hash).toBeUndefined();
    expect(a.tokens).toBeUndefined();
    expect(pool.numCachedBlocks).toBe(0);
    expect(pool.numEvictions).toBe(1);
    pool.checkInvariants();
  });

  it('keeps several blocks under one hash and removes only the evicted one', () => {
    const pool = new BlockPool(4, 1);
    const [a, b] = pool.getNewBlocks(2);
    pool.register(a, reg('same', 1));
    pool.register(b, reg('same', 1));
    expect(pool.lookup('same')).toEqual([a, b]);
    pool.free([a, b]);
    pool.getNewBlocks(2); // pops block 3 and then a
    expect(pool.lookup('same')).toEqual([b]);
    pool.checkInvariants();
  });

  it('rejects double frees without changing anything', () => {
    const pool = new BlockPool(4, 2);
    const [a, b] = pool.getNewBlocks(2);
    pool.free([a]);
    expect(() => pool.free([b, a])).toThrow(DoubleFreeError);
    expect(b.refCount).toBe(1);
    expect(() => pool.free([b, b])).toThrow(DoubleFreeError);
    expect(b.refCount).toBe(1);
    pool.checkInvariants();
  });

  it('refuses to register free, null or already registered blocks', () => {
    const pool = new BlockPool(4, 2);
    const [a] = pool.getNewBlocks(1);
    expect(() => pool.register(pool.block(2), reg('x', 2))).toThrow(KvError);
    expect(() => pool.register(pool.nullBlock, reg('x', 2))).toThrow(KvArgumentError);
    expect(() => pool.register(a, { ...reg('x', 2), tokens: new Uint32Array(3) })).toThrow(KvArgumentError);
    pool.register(a, reg('x', 2));
    expect(() => pool.register(a, reg('y', 2))).toThrow(KvError);
  });

  it('resets the prefix cache only when nothing is held', () => {
    const pool = new BlockPool(4, 2);
    const [a] = pool.getNewBlocks(1);
    pool.register(a, reg('h', 2));
    expect(pool.resetPrefixCache()).toBe(false);
    expect(pool.lookup('h')).toEqual([a]);
    pool.free([a]);
    expect(pool.resetPrefixCache()).toBe(true);
    expect(pool.lookup('h')).toEqual([]);
    expect(a.hash).toBeUndefined();
    pool.checkInvariants();
  });

  it('validates its configuration', () => {
    expect(() => new BlockPool(1, 16)).toThrow(KvArgumentError);
    expect(() => new BlockPool(8, 0)).toThrow(KvArgumentError);
    expect(() => new BlockPool(8.5, 16)).toThrow(KvArgumentError);
    expect(() => new BlockPool(8, 16).block(8)).toThrow(KvArgumentError);
  });

  it('checkInvariants reports corrupted state', () => {
    const pool = new BlockPool(4, 2);
    const [a] = pool.getNewBlocks(1);
    a.refCount = -1;
    expect(() => pool.checkInvariants()).toThrow(KvInvariantError);
    a.refCount = 1;
    pool.checkInvariants();
    // A holder map that disagrees with the refcount is a leak.
    expect(() => pool.checkInvariants(new Map())).toThrow(KvInvariantError);
    pool.checkInvariants(new Map([[a.id, 1]]));
    pool.register(a, reg('h', 2));
    a.hash = 'other'; // stale entry: map key no longer matches the block
    try {
      pool.checkInvariants();
      expect.unreachable();
    } catch (e) {
      expect(e).toBeInstanceOf(KvInvariantError);
      expect((e as KvInvariantError).violations.some((s) => s.includes('stale'))).toBe(true);
    }
  });
});
