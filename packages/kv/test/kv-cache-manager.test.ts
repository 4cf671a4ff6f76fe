import { describe, expect, it } from 'vitest';
import {
  DoubleFreeError,
  KvArgumentError,
  KvCacheManager,
  KvError,
  KvInvariantError,
  MaxBlocksPerSeqError,
  NULL_BLOCK_ID,
  SequenceExistsError,
  SlotOutOfRangeError,
  StaleComputedBlocksError,
  UnknownSequenceError,
  type BlockHashFn,
  type KvCacheManagerOptions,
  type SeqId,
} from '../src/index.js';

const mgr = (o: Partial<KvCacheManagerOptions> = {}) =>
  new KvCacheManager({ numBlocks: 16, blockSize: 4, enablePrefixCaching: true, ...o });
const range = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);

/** Admit a sequence the way the scheduler does: lookup, then allocate the rest of the prompt. */
function admit(m: KvCacheManager, id: SeqId, prompt: number[], salt?: string) {
  const c = m.getComputedBlocks(id, prompt, salt === undefined ? undefined : { cacheSalt: salt });
  const ids = m.allocateSlots(id, prompt, prompt.length - c.numComputedTokens, c);
  return { c, ids };
}

describe('KvCacheManager: allocation and tables', () => {
  it('allocates blocks for prompt and decode tokens and maps positions to slots', () => {
    const m = mgr();
    const prompt = range(100, 6);
    const { ids } = admit(m, 'a', prompt);
    expect(ids).toEqual([1, 2]);
    expect(m.blockTable('a')).toEqual([1, 2]);
    expect(m.numTokens('a')).toBe(6);
    // Decode: tokens 7 and 8 fit in block 2, token 9 needs a new block.
    const all = [...prompt];
    all.push(7);
    expect(m.allocateSlots('a', all, 1)).toEqual([]);
    all.push(8);
    expect(m.allocateSlots('a', all, 1)).toEqual([]);
    all.push(9);
    expect(m.allocateSlots('a', all, 1)).toEqual([3]);
    expect(m.slotFor('a', 0)).toBe(1 * 4 + 0);
    expect(m.slotFor('a', 5)).toBe(2 * 4 + 1);
    expect(m.slotFor('a', 8)).toBe(3 * 4 + 0);
    expect(() => m.slotFor('a', 9)).toThrow(SlotOutOfRangeError);
    expect(() => m.slotFor('a', -1)).toThrow(SlotOutOfRangeError);
    const row = new Int32Array(10).fill(-7);
    m.writeBlockTable('a', row, 2, 5);
    expect(Array.from(row)).toEqual([-7, -7, 1, 2, 3, NULL_BLOCK_ID, NULL_BLOCK_ID, -7, -7, -7]);
    expect(() => m.writeBlockTable('a', row, 0, 2)).toThrow(KvArgumentError);
    expect(() => m.writeBlockTable('a', row, 8, 5)).toThrow(KvArgumentError);
    m.checkInvariants();
  });

  it('frees tail-first so a chain tail is reused before its prefix', () => {
    const m = mgr({ numBlocks: 6 });
    admit(m, 'a', range(0, 12)); // blocks 1,2,3; free queue 4,5
    m.free('a');
    expect(m.pool.freeBlockIds()).toEqual([4, 5, 3, 2, 1]);
    expect(m.stats().cachedBlocks).toBe(3);
    // A 3-block stranger takes 4, 5 and then 3: the tail of a's chain, not its head.
    admit(m, 'b', range(1000, 12));
    expect(m.blockTable('b')).toEqual([4, 5, 3]);
    // a's first two blocks are still cached, its third was evicted.
    const c = m.getComputedBlocks('a', range(0, 13));
    expect(c.blocks.map((b) => b.id)).toEqual([1, 2]);
    m.checkInvariants();
  });

  it('reports usage and stats; free + used = total and all blocks return when everything is freed', () => {
    const m = mgr({ numBlocks: 9 });
    admit(m, 'a', range(0, 9)); // 3 blocks
    admit(m, 'b', range(50, 4)); // 1 block
    const s = m.stats();
    expect(s.totalBlocks).toBe(9);
    expect(s.freeBlocks).toBe(4);
    expect(s.usedBlocks).toBe(5);
    expect(s.sequences).toBe(2);
    expect(m.usage).toBe(0.5);
    m.free('b');
    m.free('a');
    expect(m.numFreeBlocks).toBe(8);
    expect(m.usage).toBe(0);
    m.checkInvariants();
  });

  it('leaves state intact when allocateSlots cannot get enough blocks', () => {
    const m = mgr({ numBlocks: 6 });
    admit(m, 'a', range(0, 12)); // 1,2,3
    const snapshot = () =>
      JSON.stringify({ stats: m.stats(), free: m.pool.freeBlockIds(), a: m.blockTable('a'), n: m.numTokens('a'), has: m.hasSequence('b') });
    const before = snapshot();
    expect(m.allocateSlots('b', range(500, 9), 9)).toBeNull(); // needs 3, 2 free
    expect(snapshot()).toBe(before);
    m.checkInvariants();

    // A prefix hit on free blocks must not be counted as free capacity twice.
    m.free('a'); // free queue 4,5,3,2,1; blocks 1,2,3 cached
    admit(m, 'filler', range(9000, 8)); // takes 4,5
    const prompt = [...range(0, 8), ...range(700, 9)]; // hits blocks 1,2 (both free), then needs 3 new
    const c = m.getComputedBlocks('b', prompt);
    expect(c.blocks.map((b) => b.id)).toEqual([1, 2]);
    const beforeB = JSON.stringify({ stats: m.stats(), free: m.pool.freeBlockIds() });
    expect(m.numFreeBlocks).toBe(3); // 3, 2, 1: but 2 and 1 are the hit itself
    expect(m.allocateSlots('b', prompt, prompt.length - c.numComputedTokens, c)).toBeNull();
    expect(JSON.stringify({ stats: m.stats(), free: m.pool.freeBlockIds() })).toBe(beforeB);
    expect(m.hasSequence('b')).toBe(false);
    m.checkInvariants();
    // With one block fewer needed it fits exactly.
    const shorter = prompt.slice(0, 12);
    const c2 = m.getComputedBlocks('b', shorter);
    expect(m.allocateSlots('b', shorter, 4, c2)).toEqual([3]);
    expect(m.blockTable('b')).toEqual([1, 2, 3]);
    expect(m.numFreeBlocks).toBe(0);
    m.checkInvariants();
  });

  it('keeps state intact when hashing throws mid-allocation', () => {
    let calls = 0;
    const flaky: BlockHashFn = (inp) => {
      if (++calls === 3) throw new Error('hash backend down');
      return `h${inp.tokens[0]}`;
    };
    const m = mgr({ hashFn: flaky });
    admit(m, 'a', range(0, 5)); // one full block hashed (call 1)
    const before = JSON.stringify({ s: m.stats(), f: m.pool.freeBlockIds(), t: m.blockTable('a') });
    const all = range(0, 13);
    expect(() => m.allocateSlots('a', all, 8)).toThrow('hash backend down'); // calls 2 and 3
    expect(JSON.stringify({ s: m.stats(), f: m.pool.freeBlockIds(), t: m.blockTable('a') })).toBe(before);
    expect(m.numTokens('a')).toBe(5);
    m.checkInvariants();
  });
});

describe('KvCacheManager: prefix caching', () => {
  it('shares full prompt blocks between sequences and counts queries and hits in tokens', () => {
    const m = mgr();
    const system = range(10, 8);
    const a = admit(m, 'a', [...system, 1, 2, 3]);
    expect(a.c.numComputedTokens).toBe(0);
    const b = admit(m, 'b', [...system, 4, 5]);
    expect(b.c.numComputedTokens).toBe(8);
    expect(m.blockTable('b').slice(0, 2)).toEqual(m.blockTable('a').slice(0, 2));
    expect(m.pool.block(m.blockTable('a')[0]).refCount).toBe(2);
    const s = m.stats();
    expect(s.prefixQueries).toBe(11 + 10);
    expect(s.prefixHits).toBe(8);
    expect(s.cachedBlocks).toBe(2); // a's 2 full blocks, shared by b; b's partial block is not full
    m.checkInvariants();
    m.free('a');
    // Shared blocks stay held by b.
    expect(m.pool.block(m.blockTable('b')[0]).refCount).toBe(1);
    m.checkInvariants();
  });

  it('registers blocks that fill up during decode, so a later prompt can hit them', () => {
    const m = mgr();
    const all = range(0, 3);
    admit(m, 'a', all);
    expect(m.stats().cachedBlocks).toBe(0);
    for (let t = 3; t < 9; t++) {
      all.push(t);
      m.allocateSlots('a', all, 1);
    }
    expect(m.stats().cachedBlocks).toBe(2);
    const c = m.getComputedBlocks('b', [...range(0, 9), 99]);
    expect(c.numComputedTokens).toBe(8);
    expect(c.blocks.map((b) => b.id)).toEqual(m.blockTable('a').slice(0, 2));
  });

  it('never covers the last prompt token', () => {
    const m = mgr();
    const prompt = range(0, 8); // exactly two blocks
    admit(m, 'a', prompt);
    const exact = m.getComputedBlocks('b', prompt);
    expect(exact.numComputedTokens).toBe(4); // the second block holds the last token
    const longer = m.getComputedBlocks('b', [...prompt, 8]);
    expect(longer.numComputedTokens).toBe(8);
    const one = m.getComputedBlocks('b', [0]);
    expect(one.numComputedTokens).toBe(0);
    expect(m.getComputedBlocks('b', []).numComputedTokens).toBe(0);
    const bs1 = mgr({ blockSize: 1 });
    admit(bs1, 'a', [5, 6, 7]);
    expect(bs1.getComputedBlocks('b', [5, 6, 7]).numComputedTokens).toBe(2);
  });

  it('keeps a freed block as a hit until it is reused (lazy eviction)', () => {
    const m = mgr({ numBlocks: 4 });
    admit(m, 'a', range(0, 5)); // blocks 1 (full, cached), 2
    m.free('a'); // queue 3, 2, 1
    expect(m.getComputedBlocks('a', range(0, 5)).blocks.map((b) => b.id)).toEqual([1]);
    admit(m, 'x', range(100, 8)); // takes 3 and 2
    expect(m.getComputedBlocks('a', range(0, 5)).numComputedTokens).toBe(4);
    admit(m, 'y', range(200, 1)); // takes 1: evicts a's cached block
    expect(m.getComputedBlocks('a', range(0, 5)).numComputedTokens).toBe(0);
    expect(m.stats().evictedBlocks).toBe(1);
    m.checkInvariants();
  });

  it('supports preempt-by-recompute: free, then re-admit through the cache', () => {
    const m = mgr();
    const all = range(0, 10);
    admit(m, 'a', all);
    all.push(42, 43);
    m.allocateSlots('a', all, 2);
    const table = [...m.blockTable('a')];
    m.free('a');
    expect(m.hasSequence('a')).toBe(false);
    const { c } = admit(m, 'a', all);
    expect(c.numComputedTokens).toBe(8); // 12 tokens: 3 full blocks, last one holds the last token
    expect(m.blockTable('a').slice(0, 2)).toEqual(table.slice(0, 2));
    expect(m.numTokens('a')).toBe(12);
    m.checkInvariants();
  });

  it('separates otherwise equal prompts by cache salt', () => {
    const m = mgr();
    const prompt = range(0, 13);
    admit(m, 'a', prompt, 'tenant-1');
    expect(admit(m, 'b', prompt, 'tenant-2').c.numComputedTokens).toBe(0);
    expect(admit(m, 'c', prompt).c.numComputedTokens).toBe(0);
    expect(admit(m, 'd', prompt, 'tenant-1').c.numComputedTokens).toBe(12);
    expect(m.blockTable('d').slice(0, 3)).toEqual(m.blockTable('a').slice(0, 3));
    // Even a hash function that ignores the salt cannot merge them: extra keys are compared too.
    const blind = mgr({ hashFn: (i) => `${i.parent}:${Array.from(i.tokens).join(',')}` });
    admit(blind, 'a', prompt, 'tenant-1');
    expect(blind.getComputedBlocks('b', prompt, { cacheSalt: 'tenant-2' }).numComputedTokens).toBe(0);
    expect(blind.getComputedBlocks('b', prompt, { cacheSalt: 'tenant-1' }).numComputedTokens).toBe(12);
    m.checkInvariants();
    blind.checkInvariants();
  });

  it('separates per-block keys such as a LoRA id, and carries them into decode-time registration', () => {
    const m = mgr();
    const all = range(0, 5);
    const c = m.getComputedBlocks('a', all, { keys: ['lora:1'] });
    m.allocateSlots('a', all, 5, c);
    all.push(5, 6, 7);
    m.allocateSlots('a', all, 3); // fills block 2 with lora:1 keys
    const probe = [...range(0, 8), 9];
    expect(m.getComputedBlocks('b', probe, { keys: ['lora:1'] }).numComputedTokens).toBe(8);
    expect(m.getComputedBlocks('b', probe, { keys: ['lora:2'] }).numComputedTokens).toBe(0);
    expect(m.getComputedBlocks('b', probe).numComputedTokens).toBe(0);
  });

  it('guards against hash collisions by comparing stored tokens', () => {
    let hashed = 0;
    const constant: BlockHashFn = () => {
      hashed++;
      return 'collide';
    };
    const m = mgr({ hashFn: constant });
    admit(m, 'a', [...range(0, 8), 99]); // two full blocks, both under 'collide'
    expect(hashed).toBe(3); // 1 in the (missing) lookup, 2 at registration
    expect(m.pool.lookup('collide')).toHaveLength(2);
    // Different first block: every candidate has the same hash, none has the same tokens.
    expect(m.getComputedBlocks('b', [...range(50, 8), 99]).numComputedTokens).toBe(0);
    // Same first block, different second: only the first is a hit.
    expect(m.getComputedBlocks('b', [...range(0, 4), ...range(60, 4), 99]).numComputedTokens).toBe(4);
    // Genuine match still hits.
    expect(m.getComputedBlocks('b', [...range(0, 8), 7]).numComputedTokens).toBe(8);
    // Tokens of a later block equal to another chain's block: parent identity decides.
    // x = [W, Y] registered; probe [W, Y, ...] must use x's Y, not a's block with the same tokens.
    admit(m, 'x', [...range(200, 4), ...range(4, 4), 1]);
    const probe = m.getComputedBlocks('p', [...range(200, 4), ...range(4, 4), 2]);
    expect(probe.blocks.map((b) => b.id)).toEqual(m.blockTable('x').slice(0, 2));
    expect(probe.blocks[1].id).not.toBe(m.blockTable('a')[1]);
    // And [V, Y] with V never cached must not pick up any Y.
    expect(m.getComputedBlocks('q', [...range(300, 4), ...range(4, 4), 2]).numComputedTokens).toBe(0);
    m.checkInvariants();
  });

  it('continues a chain through a duplicate registration of the same content', () => {
    const m = mgr();
    const prompt = [...range(0, 8), 1];
    // Both looked up before either allocated: both miss and register equal first blocks.
    const ca = m.getComputedBlocks('a', prompt);
    const cb = m.getComputedBlocks('b', range(0, 5));
    m.allocateSlots('b', range(0, 5), 5, cb);
    m.allocateSlots('a', prompt, 9, ca);
    const [b0] = m.blockTable('b');
    const [a0, a1] = m.blockTable('a');
    expect(a0).not.toBe(b0);
    // The only two-block chain goes through a's first block, even though b's was registered first.
    const c = m.getComputedBlocks('c', [...range(0, 8), 5]);
    expect(c.blocks.map((b) => b.id)).toEqual([a0, a1]);
    m.checkInvariants();
  });

  it('does nothing when prefix caching is disabled', () => {
    const m = mgr({ enablePrefixCaching: false });
    admit(m, 'a', range(0, 9));
    const c = m.getComputedBlocks('b', range(0, 9));
    expect(c.numComputedTokens).toBe(0);
    expect(m.stats()).toMatchObject({ prefixQueries: 0, prefixHits: 0, cachedBlocks: 0 });
    m.checkInvariants();
  });

  it('resets the prefix cache only when idle', () => {
    const m = mgr();
    admit(m, 'a', range(0, 9));
    expect(m.resetPrefixCache()).toBe(false);
    m.free('a');
    expect(m.getComputedBlocks('b', range(0, 9)).numComputedTokens).toBe(8);
    expect(m.resetPrefixCache()).toBe(true);
    expect(m.getComputedBlocks('b', range(0, 9)).numComputedTokens).toBe(0);
    expect(m.stats().cachedBlocks).toBe(0);
    m.checkInvariants();
  });
});

describe('KvCacheManager: misuse raises typed errors', () => {
  it('unknown sequence and double free', () => {
    const m = mgr();
    expect(() => m.blockTable('nope')).toThrow(UnknownSequenceError);
    expect(() => m.slotFor('nope', 0)).toThrow(UnknownSequenceError);
    expect(() => m.free('nope')).toThrow(UnknownSequenceError);
    admit(m, 'a', range(0, 3));
    m.free('a');
    expect(() => m.free('a')).toThrow(DoubleFreeError);
    expect(() => m.free('a')).toThrow(KvError);
    // Re-admission clears the record; forgetting is bounded.
    admit(m, 'a', range(0, 3));
    m.free('a');
    const small = mgr({ freedSeqMemory: 1 });
    admit(small, 1, [1]);
    admit(small, 2, [2]);
    small.free(1);
    small.free(2);
    expect(() => small.free(2)).toThrow(DoubleFreeError);
    expect(() => small.free(1)).toThrow(UnknownSequenceError);
    m.checkInvariants();
  });

  it('maxBlocksPerSeq', () => {
    const m = mgr({ maxBlocksPerSeq: 2 });
    const all = range(0, 8);
    admit(m, 'a', all);
    all.push(8);
    const before = JSON.stringify(m.stats());
    try {
      m.allocateSlots('a', all, 1);
      expect.unreachable();
    } catch (e) {
      expect(e).toBeInstanceOf(MaxBlocksPerSeqError);
      expect((e as MaxBlocksPerSeqError).requestedBlocks).toBe(3);
    }
    expect(JSON.stringify(m.stats())).toBe(before);
    expect(() => m.allocateSlots('b', range(0, 9), 9)).toThrow(MaxBlocksPerSeqError);
    expect(m.hasSequence('b')).toBe(false);
    m.checkInvariants();
  });

  it('bad arguments', () => {
    expect(() => mgr({ numBlocks: 1 })).toThrow(KvArgumentError);
    expect(() => mgr({ blockSize: -4 })).toThrow(KvArgumentError);
    expect(() => mgr({ maxBlocksPerSeq: 0 })).toThrow(KvArgumentError);
    expect(() => mgr({ freedSeqMemory: -1 })).toThrow(KvArgumentError);
    const m = mgr();
    expect(() => m.allocateSlots('a', [1, 2], 0)).toThrow(KvArgumentError);
    expect(() => m.allocateSlots('a', [1, 2], 3)).toThrow(KvArgumentError);
    expect(() => m.allocateSlots('a', [1, -2], 2)).toThrow(KvArgumentError);
    expect(() => m.allocateSlots('a', [1, 2.5], 2)).toThrow(KvArgumentError);
    expect(() => m.getComputedBlocks('a', [1, 2, 3, 4.5, 6])).toThrow(KvArgumentError);
    expect(() => m.allocateSlots('a', null as unknown as number[], 1)).toThrow(KvArgumentError);
    expect(m.hasSequence('a')).toBe(false);
    admit(m, 'a', [1, 2]);
    expect(() => m.getComputedBlocks('a', [1, 2])).toThrow(SequenceExistsError);
    const c = m.getComputedBlocks('b', [1, 2]);
    expect(() => m.allocateSlots('a', [1, 2, 3], 1, c)).toThrow(KvArgumentError);
    expect(() => m.allocateSlots('a', [1, 2, 3], 1, undefined, { cacheSalt: 's' })).toThrow(KvArgumentError);
    expect(() => m.allocateSlots('z', [1, 2], 2, c)).toThrow(KvArgumentError);
    const cs = m.getComputedBlocks('s', [1, 2], { cacheSalt: 'x' });
    expect(() => m.allocateSlots('s', [1, 2], 2, cs, { cacheSalt: 'y' })).toThrow(KvArgumentError);
    m.checkInvariants();
  });

  it('stale computed blocks (evicted between lookup and allocation)', () => {
    const m = mgr({ numBlocks: 3 });
    admit(m, 'a', range(0, 5)); // blocks 1, 2
    m.free('a'); // queue 2, 1
    const c = m.getComputedBlocks('b', range(0, 5));
    expect(c.blocks.map((b) => b.id)).toEqual([1]);
    admit(m, 'x', range(90, 8)); // reuses 2 and 1: evicts the hit
    m.free('x');
    expect(() => m.allocateSlots('b', range(0, 5), 1, c)).toThrow(StaleComputedBlocksError);
    expect(m.hasSequence('b')).toBe(false);
    m.checkInvariants();
  });

  it('checkInvariants throws a typed error on corrupted bookkeeping', () => {
    const m = mgr();
    admit(m, 'a', range(0, 9));
    m.pool.block(m.blockTable('a')[0]).refCount++; // a leaked reference
    try {
      m.checkInvariants();
      expect.unreachable();
    } catch (e) {
      expect(e).toBeInstanceOf(KvInvariantError);
      expect((e as KvInvariantError).violations.join('\n')).toMatch(/held by 1 sequence/);
    }
  });
});

describe('KvCacheManager: releasing blocks behind a sliding window', () => {
  /** Decode `n` tokens one at a time, releasing what a window of `w` no longer reads before each. */
  function decode(m: KvCacheManager, id: SeqId, all: number[], n: number, w: number, from = 1000): number[] {
    const held: number[] = [];
    for (let i = 0; i < n; i++) {
      m.releaseBlocksBefore(id, m.numTokens(id) - w + 1);
      all.push(from + i);
      expect(m.allocateSlots(id, all, 1)).not.toBeNull();
      held.push(m.stats().usedBlocks - 1);
      m.checkInvariants();
    }
    return held;
  }

  it('returns blocks wholly before the window to the pool; a long generation holds a bounded number', () => {
    const m = mgr({ numBlocks: 8, maxBlocksPerSeq: 64 }); // 7 usable blocks of 4 tokens: 28 tokens without releasing
    const all = range(100, 6);
    admit(m, 'a', all);
    expect(m.releaseBlocksBefore('a', 3)).toBe(0); // block 0 still holds position 3
    expect(m.releaseBlocksBefore('a', 4)).toBe(1);
    expect(m.releaseBlocksBefore('a', 4)).toBe(0); // idempotent
    expect(m.numReleasedBlocks('a')).toBe(1);
    expect(m.blockTable('a')).toEqual([NULL_BLOCK_ID, 2]);
    expect(() => m.slotFor('a', 3)).toThrow(/released block/);
    expect(m.slotFor('a', 4)).toBe(2 * 4);
    m.checkInvariants();
    // 100 more tokens with a window of 6: never more than ceil((6 - 1) / 4) + 1 = 3 blocks held.
    const held = decode(m, 'a', all, 100, 6);
    expect(Math.max(...held)).toBeLessThanOrEqual(3);
    expect(m.numTokens('a')).toBe(106);
    expect(m.blockTable('a')).toHaveLength(27);
    const row = new Int32Array(30);
    m.writeBlockTable('a', row, 0, 30);
    expect(Array.from(row.subarray(0, 25)).every((x) => x === NULL_BLOCK_ID)).toBe(true);
    m.free('a');
    expect(m.stats().freeBlocks).toBe(7);
    m.checkInvariants();
  });

  it('never releases past the slotted tokens, and refuses a non-finite position', () => {
    const m = mgr();
    admit(m, 'a', range(1, 6));
    expect(m.releaseBlocksBefore('a', 1000)).toBe(1); // only block 0 is full
    expect(m.releaseBlocksBefore('a', -5)).toBe(0);
    expect(() => m.releaseBlocksBefore('a', Number.NaN)).toThrow(KvArgumentError);
    expect(() => m.releaseBlocksBefore('zz', 4)).toThrow(UnknownSequenceError);
    m.checkInvariants();
  });

  it('released blocks stay valid prefix-cache pages, and the chain continues past them', () => {
    const m = mgr({ numBlocks: 32 });
    const all = range(100, 5);
    admit(m, 'a', all);
    decode(m, 'a', all, 15, 5); // 20 tokens, 5 full blocks, the early ones released
    expect(m.numReleasedBlocks('a')).toBeGreaterThanOrEqual(3);
    m.checkInvariants();
    // A request with the same 20 tokens (+1) finds all 5 blocks, released ones included: their
    // K/V are intact until the pool reuses them, and later blocks chain to them by stamp.
    const again = [...all, 7];
    const c = m.getComputedBlocks('b', again);
    expect(c.numComputedTokens).toBe(20);
    m.allocateSlots('b', again, 1, c);
    m.checkInvariants();
    m.free('a');
    m.free('b');
    m.checkInvariants();
  });

  it('a released page the pool reused is a miss, never a wrong hit', () => {
    const m = mgr({ numBlocks: 5, maxBlocksPerSeq: 64 }); // 4 usable: releasing is what lets 'a' grow past 16 tokens
    const all = range(100, 4);
    admit(m, 'a', all);
    decode(m, 'a', all, 20, 4); // 24 tokens through 4 blocks: the first ones were reused
    const c = m.getComputedBlocks('b', [...all.slice(0, 8), 1]);
    expect(c.numComputedTokens).toBe(0);
    m.free('a');
    m.checkInvariants();
  });
});

describe('KvCacheManager: shared-prefix forks', () => {
  it('shares the full blocks by reference and copies the partial last block', () => {
    const m = mgr();
    const prompt = range(100, 10); // blocks of 4: two full, one partial (2 tokens)
    admit(m, 'p', prompt);
    const [b0, b1, b2] = m.blockTable('p');
    const f = m.forkSequence('p', 'c1');
    expect(f).not.toBeNull();
    expect(f!.numTokens).toBe(10);
    expect(f!.sharedBlocks).toBe(2);
    expect(f!.copy?.src).toBe(b2);
    const mine = f!.copy!.dst;
    expect([b0, b1, b2]).not.toContain(mine);
    expect(m.blockTable('c1')).toEqual([b0, b1, mine]);
    expect(m.numTokens('c1')).toBe(10);
    expect(m.pool.block(b0).refCount).toBe(2);
    expect(m.pool.block(b2).refCount).toBe(1);
    expect(m.stats().sharedBlocks).toBe(2);
    m.forkSequence('p', 'c2');
    expect(m.pool.block(b1).refCount).toBe(3);
    // Three sequences of 10 tokens in 2 + 3 blocks instead of 9.
    expect(m.stats().usedBlocks - 1).toBe(5);
    expect(m.stats().sequences).toBe(3);
    m.checkInvariants();
    // Each fork decodes into its own blocks; a block that fills is registered under its own chain.
    const c1 = [...prompt, 1, 2];
    expect(m.allocateSlots('c1', c1, 2)).toEqual([]);
    expect(m.allocateSlots('c1', [...c1, 3], 1)).toHaveLength(1);
    m.checkInvariants();
    // Freeing the parent first leaves the forks intact; the last holder returns the shared blocks.
    m.free('p');
    expect(m.pool.block(b0).refCount).toBe(2);
    m.free('c1');
    expect(m.stats().sharedBlocks).toBe(0);
    m.free('c2');
    expect(m.stats().freeBlocks).toBe(15);
    expect(m.stats().sharedBlocks).toBe(0);
    m.checkInvariants();
  });

  it('a block-aligned parent shares every block and copies nothing; a fork of a fork shares too', () => {
    const m = mgr({ enablePrefixCaching: false });
    admit(m, 'p', range(1, 8));
    const f = m.forkSequence('p', 'c');
    expect(f).toEqual({ numTokens: 8, sharedBlocks: 2 });
    expect(m.blockTable('c')).toEqual(m.blockTable('p'));
    m.forkSequence('c', 'g');
    expect(m.pool.block(m.blockTable('p')[0]).refCount).toBe(3);
    m.checkInvariants();
    for (const id of ['p', 'c', 'g']) m.free(id);
    expect(m.stats().freeBlocks).toBe(15);
  });

  it('without a copy the child stops at the last full block (the caller recomputes the tail)', () => {
    const m = mgr();
    admit(m, 'p', range(1, 7));
    const f = m.forkSequence('p', 'c', false);
    expect(f).toEqual({ numTokens: 4, sharedBlocks: 1 });
    expect(m.blockTable('c')).toEqual([m.blockTable('p')[0]]);
    expect(m.allocateSlots('c', range(1, 7), 3)).toHaveLength(1);
    m.checkInvariants();
    admit(m, 'q', range(50, 3));
    expect(() => m.forkSequence('q', 'r', false)).toThrow(/no full block to share/);
    expect(m.hasSequence('r')).toBe(false);
  });

  it('returns null and changes nothing when no block is free for the copy; misuse is a typed error', () => {
    const m = mgr({ numBlocks: 4 }); // 3 usable blocks
    admit(m, 'p', range(1, 10)); // all three
    const before = JSON.stringify(m.stats());
    expect(m.forkSequence('p', 'c')).toBeNull();
    expect(JSON.stringify(m.stats())).toBe(before);
    expect(m.hasSequence('c')).toBe(false);
    // Without the copy it still forks (full blocks only).
    expect(m.forkSequence('p', 'c', false)).toEqual({ numTokens: 8, sharedBlocks: 2 });
    expect(() => m.forkSequence('p', 'c')).toThrow(SequenceExistsError);
    expect(() => m.forkSequence('nope', 'd')).toThrow(UnknownSequenceError);
    m.checkInvariants();
  });

  it('carries released leading blocks (sliding window) as null entries', () => {
    const m = mgr();
    admit(m, 'p', range(1, 10));
    expect(m.releaseBlocksBefore('p', 4)).toBe(1);
    const f = m.forkSequence('p', 'c');
    expect(f!.sharedBlocks).toBe(1);
    expect(m.numReleasedBlocks('c')).toBe(1);
    expect(m.blockTable('c')[0]).toBe(NULL_BLOCK_ID);
    m.checkInvariants();
    m.free('p');
    m.free('c');
    m.checkInvariants();
  });
});

describe('KvCacheManager: blocks reserved ahead of their tokens (run-ahead decode)', () => {
  it('holds the next block before its position is slotted; allocateSlots then takes it instead of a new one', () => {
    const m = mgr();
    const all = range(100, 8); // two full blocks of 4
    admit(m, 'a', all);
    expect(m.blockTable('a')).toEqual([1, 2]);
    // A step enqueued ahead will write position 8: the table gets its block now, no slot yet.
    expect(m.reserveBlocks('a', 9)).toEqual([3]);
    expect(m.blockTable('a')).toEqual([1, 2, 3]);
    expect(m.numTokens('a')).toBe(8);
    expect(() => m.slotFor('a', 8)).toThrow(SlotOutOfRangeError);
    m.checkInvariants();
    // Already held: nothing more to take.
    expect(m.reserveBlocks('a', 9)).toEqual([]);
    expect(m.reserveBlocks('a', 3)).toEqual([]);
    // The scheduler's next step slots position 8 in the reserved block.
    all.push(7);
    expect(m.allocateSlots('a', all, 1)).toEqual([]);
    expect(m.blockTable('a')).toEqual([1, 2, 3]);
    expect(m.slotFor('a', 8)).toBe(3 * 4);
    m.checkInvariants();
    // Freed with the sequence.
    m.free('a');
    expect(m.stats().freeBlocks).toBe(15);
    m.checkInvariants();
  });

  it('registers a reserved block in the prefix cache only once its tokens fill it', () => {
    const m = mgr();
    const all = range(1, 4);
    admit(m, 'a', all);
    m.reserveBlocks('a', 8);
    for (let t = 0; t < 4; t++) {
      all.push(50 + t);
      m.allocateSlots('a', all, 1);
    }
    m.checkInvariants();
    m.free('a');
    // A later prompt with the same first 8 tokens (+1) hits both blocks, the reserved one included.
    const c = m.getComputedBlocks('b', [...all, 9]);
    expect(c.numComputedTokens).toBe(8);
  });

  it('a fork of a parent with a reserved block shares only the blocks of its tokens', () => {
    const m = mgr({ enablePrefixCaching: false });
    admit(m, 'p', range(1, 8));
    m.reserveBlocks('p', 9);
    const f = m.forkSequence('p', 'c');
    expect(f).toEqual({ numTokens: 8, sharedBlocks: 2 });
    expect(m.blockTable('c')).toEqual(m.blockTable('p').slice(0, 2));
    m.checkInvariants();
  });

  it('returns null and changes nothing when the pool is short; misuse is a typed error', () => {
    const m = mgr({ numBlocks: 4 }); // 3 usable blocks
    admit(m, 'a', range(1, 8));
    admit(m, 'b', range(20, 4));
    const before = m.stats();
    expect(m.reserveBlocks('a', 9)).toBeNull();
    expect(m.blockTable('a')).toEqual([1, 2]);
    expect(m.stats()).toEqual(before);
    expect(() => m.reserveBlocks('nope', 1)).toThrow(UnknownSequenceError);
    expect(() => m.reserveBlocks('a', 0)).toThrow(KvArgumentError);
    expect(() => m.reserveBlocks('a', 2.5)).toThrow(KvArgumentError);
    expect(() => m.reserveBlocks('a', 1e9)).toThrow(MaxBlocksPerSeqError);
    m.checkInvariants();
  });
});
