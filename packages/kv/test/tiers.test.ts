import { describe, expect, it } from 'vitest';
import { KvCacheManager, KvTierPressureError, KvTiers, type KvPageMove } from '../src/index.js';

/** Tier memories of a simulated engine: what each slot holds (a page's content tag). */
class Memory {
  readonly mem: Record<'hot' | 'warm' | 'cold', Int32Array>;
  constructor(t: KvTiers) {
    this.mem = { hot: new Int32Array(t.hotSlots).fill(-1), warm: new Int32Array(t.warmSlots).fill(-1), cold: new Int32Array(t.coldSlots).fill(-1) };
  }
  apply(moves: readonly KvPageMove[]): void {
    for (const m of moves) {
      const v = this.mem[m.from][m.fromSlot];
      this.mem[m.from][m.fromSlot] = -1;
      if (m.to !== 'none') this.mem[m.to][m.toSlot] = v;
    }
  }
  read(t: KvTiers, page: number): number {
    const tier = t.tierOf(page);
    if (tier === undefined) return -2;
    return this.mem[tier][t.slotOf(page)];
  }
  write(t: KvTiers, page: number, tag: number): void {
    expect(t.tierOf(page)).toBe('hot');
    this.mem.hot[t.slotOf(page)] = tag;
  }
}

function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    return ((z ^ (z >>> 16)) >>> 0) / 4294967296;
  };
}

describe('KvTiers', () => {
  it('validates its options', () => {
    const kv = new KvCacheManager({ numBlocks: 8, blockSize: 4, enablePrefixCaching: true });
    expect(() => new KvTiers(kv.pool, { hotSlots: 1, warmSlots: 2, coldSlots: 0 })).toThrow(/hotSlots must be an integer >= 2/);
    expect(() => new KvTiers(kv.pool, { hotSlots: 4, warmSlots: -1, coldSlots: 0 })).toThrow(/warmSlots/);
    expect(() => new KvTiers(kv.pool, { hotSlots: 4, warmSlots: 2, coldSlots: 0, windowBlocks: 0 })).toThrow(/windowBlocks/);
  });

  it('keeps sinks and the recent window hot, demotes the middle to warm, and never loses K/V', () => {
    const bs = 4;
    const kv = new KvCacheManager({ numBlocks: 1 + 4 + 12, blockSize: bs, enablePrefixCaching: true });
    const t = new KvTiers(kv.pool, { hotSlots: 5, warmSlots: 12, coldSlots: 0, sinkBlocks: 1, windowBlocks: 2 });
    const mem = new Memory(t);
    const ids: number[] = [];
    for (let pos = 0; pos < 40; pos++) {
      ids.push(pos % 97);
      expect(kv.allocateSlots(1, ids, 1, pos === 0 ? kv.getComputedBlocks(1, ids) : undefined)).not.toBeNull();
      const pages = kv.blockTable(1);
      const written = Math.floor(pos / bs);
      mem.apply(t.prepare([{ pages, firstWritten: written }]));
      mem.write(t, pages[written], pages[written] * 1000 + (pos % bs));
      t.checkInvariants();
      // Every page still holds what was last written to it.
      for (let b = 0; b < pages.length; b++) expect(mem.read(t, pages[b])).toBe(pages[b] * 1000 + (b === written ? pos % bs : bs - 1));
    }
    const pages = kv.blockTable(1);
    expect(pages.length).toBe(10);
    expect(t.tierOf(pages[0])).toBe('hot'); // sink
    expect(t.tierOf(pages[9])).toBe('hot'); // written
    expect(t.tierOf(pages[8])).toBe('hot'); // window
    expect(pages.slice(1, 8).filter((p) => t.tierOf(p) === 'warm').length).toBeGreaterThanOrEqual(6);
    expect(t.stats().demotions).toBeGreaterThan(0);
  });

  it('spills free cached pages to cold, promotes them back on a prefix hit, and drops what has no room', () => {
    const bs = 2;
    const kv = new KvCacheManager({ numBlocks: 1 + 4 + 2 + 4, blockSize: bs, enablePrefixCaching: true });
    const t = new KvTiers(kv.pool, { hotSlots: 5, warmSlots: 2, coldSlots: 4, sinkBlocks: 0, windowBlocks: 1 });
    const mem = new Memory(t);
    const prompt = [5, 6, 7, 8, 9, 10, 11, 12];
    const run = (seq: number, tokens: number[]) => {
      const hit = kv.getComputedBlocks(seq, tokens);
      expect(kv.allocateSlots(seq, tokens, tokens.length - hit.numComputedTokens, hit)).not.toBeNull();
      const pages = kv.blockTable(seq);
      const first = Math.floor(hit.numComputedTokens / bs);
      mem.apply(t.prepare([{ pages, firstWritten: first, firstFresh: first }]));
      for (let b = first; b < pages.length; b++) mem.write(t, pages[b], 7000 + b);
      for (let b = 0; b < pages.length; b++) expect(mem.read(t, pages[b])).toBe(7000 + b);
      t.checkInvariants();
      return hit.numComputedTokens;
    };
    expect(run(1, prompt)).toBe(0);
    kv.free(1);
    // Other work pushes the cached pages down.
    expect(run(2, [40, 41, 42, 43, 44, 45])).toBe(0);
    kv.free(2);
    expect(run(3, [50, 51, 52, 53, 54, 55])).toBe(0);
    kv.free(3);
    const st = t.stats();
    expect(st.cold.used).toBeGreaterThan(0);
    // The first prompt comes back: its surviving pages are hits wherever they live.
    const before = t.stats().promotions;
    const computed = run(4, prompt);
    expect(computed).toBeGreaterThan(0);
    expect(t.stats().promotions).toBeGreaterThan(before);
  });

  it('refuses a step that writes more pages than the hot pool holds, and says so in fits()', () => {
    const kv = new KvCacheManager({ numBlocks: 12, blockSize: 2, enablePrefixCaching: false });
    const t = new KvTiers(kv.pool, { hotSlots: 3, warmSlots: 8, coldSlots: 0 });
    const ids = Array.from({ length: 10 }, (_, i) => i);
    kv.allocateSlots(1, ids, 10, kv.getComputedBlocks(1, ids));
    expect(t.fits(5, 5)).toBe(false);
    expect(t.fits(10, 2)).toBe(true);
    expect(t.fits(11, 2)).toBe(false);
    expect(() => t.prepare([{ pages: kv.blockTable(1), firstWritten: 0 }])).toThrow(KvTierPressureError);
  });

  it('random workloads: invariants hold, written pages are hot, read pages hot or warm, contents survive', () => {
    for (let trial = 0; trial < 30; trial++) {
      const r = rng(trial * 7919 + 1);
      const bs = 1 + Math.floor(r() * 4);
      const hot = 3 + Math.floor(r() * 6);
      const warm = Math.floor(r() * 10);
      const cold = Math.floor(r() * 6);
      const kv = new KvCacheManager({ numBlocks: hot + warm + cold, blockSize: bs, enablePrefixCaching: r() < 0.7 });
      const t = new KvTiers(kv.pool, { hotSlots: hot, warmSlots: warm, coldSlots: cold, sinkBlocks: Math.floor(r() * 2), windowBlocks: 1 + Math.floor(r() * 2) });
      const mem = new Memory(t);
      const tag = new Map<number, number>(); // page -> content tag the simulation expects
      const seqs = new Map<number, number[]>();
      let next = 1;
      for (let step = 0; step < 120; step++) {
        if (seqs.size < 3 && r() < 0.3) {
          const len = 1 + Math.floor(r() * 3 * bs);
          const toks = Array.from({ length: len }, () => Math.floor(r() * 3));
          seqs.set(next++, toks);
        }
        const needs = [];
        const writes: Array<[number, number]> = [];
        let held = 0;
        let writtenPages = 0;
        for (const [id, toks] of [...seqs]) {
          const isNew = !kv.hasSequence(id);
          const hit = isNew ? kv.getComputedBlocks(id, toks) : undefined;
          const done = isNew ? hit!.numComputedTokens : kv.numTokens(id);
          const n = isNew ? toks.length - done : 1;
          if (!isNew) toks.push(Math.floor(r() * 3));
          const firstWritten = Math.floor(done / bs);
          const pagesAfter = Math.ceil((done + n) / bs);
          if (!t.fits(held + pagesAfter, writtenPages + pagesAfter - firstWritten) || kv.allocateSlots(id, toks, n, hit) === null) {
            if (!isNew) kv.free(id);
            seqs.delete(id);
            continue;
          }
          held += pagesAfter;
          writtenPages += pagesAfter - firstWritten;
          const pages = kv.blockTable(id);
          needs.push({ pages, firstWritten, firstFresh: Math.ceil(done / bs) });
          for (let b = firstWritten; b < pages.length; b++) writes.push([pages[b], id * 100000 + step * 100 + b]);
        }
        mem.apply(t.prepare(needs));
        t.checkInvariants();
        // A page another sequence writes this step may already be a prefix hit (the engine writes
        // K/V before attention reads them): its content is checked after the writes.
        const writtenNow = new Set(writes.map(([p]) => p));
        for (const n of needs) {
          for (let b = 0; b < n.pages.length; b++) {
            const p = n.pages[b];
            const tier = t.tierOf(p);
            if (b >= n.firstWritten || writtenNow.has(p)) expect(tier).toBe('hot');
            else {
              expect(tier === 'hot' || tier === 'warm').toBe(true);
              expect(mem.read(t, p)).toBe(tag.get(p));
            }
          }
        }
        for (const [p, v] of writes) {
          mem.write(t, p, v);
          tag.set(p, v);
        }
        // Cached pages anywhere still hold their content.
        for (let p = 1; p < kv.pool.numBlocks; p++) {
          const b = kv.pool.block(p);
          if (b.hash !== undefined && b.refCount === 0) expect(mem.read(t, p)).toBe(tag.get(p));
        }
        for (const id of [...seqs.keys()]) {
          if (r() < 0.15) {
            kv.free(id);
            seqs.delete(id);
          }
        }
        if (r() < 0.2) t.reclaim();
      }
    }
  });
});
