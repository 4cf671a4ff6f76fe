import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  KvCacheManager,
  KvError,
  MaxBlocksPerSeqError,
  NULL_BLOCK_ID,
  type BlockHashFn,
  type ComputedBlocks,
} from '../src/index.js';

/**
 * Random schedules against a simulated KV memory. Each slot stores the identity of the context it
 * was computed for (salt + every token up to and including that position), which is what real
 * K/V depends on. After every operation, each live sequence must still read its own context from
 * every one of its slots: that fails if a held block is ever reused, a prefix hit returns the
 * wrong block, or a cache salt leaks.
 */

const SEQS = 5;
const SALTS = [undefined, 'tenant-a', 'tenant-b'] as const;
// Shared prefixes make prefix hits (and partial hits) frequent.
const PREFIXES = [
  [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3],
  [1, 2, 3, 1, 0, 0, 0, 0, 3, 3, 3, 3],
  [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2],
];

type Op =
  | { t: 'admit'; s: number; prefix: number; cut: number; suffix: number[]; salt: number }
  | { t: 'append'; s: number; toks: number[] }
  | { t: 'free'; s: number }
  | { t: 'preempt'; s: number }
  /** Sliding-window release: give back the blocks wholly before numTokens - keep. */
  | { t: 'release'; s: number; keep: number }
  /** Shared-prefix fork of sequence `from` into `s`: full blocks shared, the partial one copied (or recomputed). */
  | { t: 'fork'; s: number; from: number; copy: boolean }
  /** Blocks held ahead of their tokens (run-ahead decode): up to numTokens + extra positions. */
  | { t: 'reserve'; s: number; extra: number };

const tok = fc.integer({ min: 0, max: 3 });
const seq = fc.integer({ min: 0, max: SEQS - 1 });
const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({
      t: fc.constant('admit' as const),
      s: seq,
      prefix: fc.integer({ min: 0, max: PREFIXES.length - 1 }),
      cut: fc.integer({ min: 0, max: 12 }),
      suffix: fc.array(tok, { minLength: 1, maxLength: 6 }),
      salt: fc.integer({ min: 0, max: SALTS.length - 1 }),
    }),
  },
  { weight: 4, arbitrary: fc.record({ t: fc.constant('append' as const), s: seq, toks: fc.array(tok, { minLength: 1, maxLength: 3 }) }) },
  { weight: 2, arbitrary: fc.record({ t: fc.constant('free' as const), s: seq }) },
  { weight: 1, arbitrary: fc.record({ t: fc.constant('preempt' as const), s: seq }) },
  { weight: 2, arbitrary: fc.record({ t: fc.constant('release' as const), s: seq, keep: fc.integer({ min: 0, max: 8 }) }) },
  { weight: 2, arbitrary: fc.record({ t: fc.constant('fork' as const), s: seq, from: seq, copy: fc.boolean() }) },
  { weight: 2, arbitrary: fc.record({ t: fc.constant('reserve' as const), s: seq, extra: fc.integer({ min: 1, max: 16 }) }) },
);

const HASHES: Record<string, BlockHashFn | undefined> = {
  sha256: undefined,
  // Collides constantly: correctness must come from the token / key / parent guard alone.
  colliding: (i) => `c${i.tokens[0] % 2}`,
};

interface Config {
  numBlocks: number;
  blockSize: number;
  enablePrefixCaching: boolean;
  hash: 'sha256' | 'colliding';
  maxBlocksPerSeq: number | undefined;
}

const configArb: fc.Arbitrary<Config> = fc.record({
  numBlocks: fc.integer({ min: 2, max: 20 }),
  blockSize: fc.integer({ min: 1, max: 4 }),
  enablePrefixCaching: fc.boolean(),
  hash: fc.constantFrom('sha256' as const, 'colliding' as const),
  maxBlocksPerSeq: fc.option(fc.integer({ min: 1, max: 12 }), { nil: undefined }),
});

const REFUSED_RESERVE_CFG: Config = { numBlocks: 4, blockSize: 1, enablePrefixCaching: false, hash: 'sha256', maxBlocksPerSeq: undefined };
const REFUSED_RESERVE_OPS: Op[] = [
  { t: 'admit', s: 0, prefix: 2, cut: 1, suffix: [2], salt: 0 },
  { t: 'admit', s: 1, prefix: 0, cut: 0, suffix: [1], salt: 0 },
  { t: 'reserve', s: 1, extra: 1 },
];

/** Cheap assertion for per-slot loops (vitest's expect is too slow to call millions of times). */
function ensure(cond: boolean, what: () => string): void {
  if (!cond) throw new Error(`property violated: ${what()}`);
}

interface SeqModel {
  tokens: number[];
  salt: string | undefined;
  live: boolean;
  /** ctxIds[p]: interned identity of (salt, tokens[0..p]), extended as tokens are appended. */
  ctxIds: number[];
  /** Blocks held by reserveBlocks (the table holds at least this many). */
  reserved: number;
}

/** Counts of interesting events across all runs, to assert the generator reaches every path. */
const tally = { hits: 0, refusals: 0, tooLong: 0, readmitHits: 0, collidingHits: 0, doubleFrees: 0, releases: 0, forks: 0, forkCopies: 0, reserved: 0, reserveRefusals: 0 };

function run(cfg: Config, ops: Op[]): void {
  const bs = cfg.blockSize;
  const m = new KvCacheManager({
    numBlocks: cfg.numBlocks,
    blockSize: bs,
    enablePrefixCaching: cfg.enablePrefixCaching,
    maxBlocksPerSeq: cfg.maxBlocksPerSeq,
    hashFn: HASHES[cfg.hash],
  });
  const maxPerSeq = cfg.maxBlocksPerSeq ?? cfg.numBlocks - 1;
  const kv: (number | undefined)[] = new Array(cfg.numBlocks * bs).fill(undefined);
  const model: SeqModel[] = Array.from({ length: SEQS }, () => ({ tokens: [], salt: undefined, live: false, ctxIds: [], reserved: 0 }));
  let queries = 0;
  let hits = 0;
  const id = (s: number) => `seq-${s}`;
  // Interning keeps context identities O(1) to build and compare: equal contexts, equal ids.
  const intern = new Map<string, number>();
  const ctx = (sm: SeqModel, pos: number): number => {
    for (let p = sm.ctxIds.length; p <= pos; p++) {
      const key = p === 0 ? `${sm.salt ?? ''}|${sm.tokens[0]}` : `${sm.ctxIds[p - 1]},${sm.tokens[p]}`;
      let v = intern.get(key);
      if (v === undefined) intern.set(key, (v = intern.size));
      sm.ctxIds.push(v);
    }
    return sm.ctxIds[pos];
  };

  const snapshot = () =>
    JSON.stringify({
      stats: m.stats(),
      free: m.pool.freeBlockIds(),
      tables: model.map((_, s) => (m.hasSequence(id(s)) ? [m.blockTable(id(s)), m.numTokens(id(s))] : null)),
    });

  /** Allocates and, on success, "runs the step": writes the context identity of each new token. */
  function allocate(s: number, numNew: number, computed?: ComputedBlocks): boolean {
    const sm = model[s];
    const live = m.hasSequence(id(s));
    const start = live ? m.numTokens(id(s)) : (computed?.numComputedTokens ?? 0);
    const needed = Math.ceil((start + numNew) / bs);
    const held = live ? m.blockTable(id(s)).length : (computed?.blocks.length ?? 0);
    const evictable = computed?.blocks.filter((b) => b.refCount === 0).length ?? 0;
    const freeBefore = m.numFreeBlocks;
    const before = snapshot();
    if (needed > maxPerSeq) {
      expect(() => m.allocateSlots(id(s), sm.tokens, numNew, computed)).toThrow(MaxBlocksPerSeqError);
      tally.tooLong++;
      expect(snapshot()).toBe(before);
      return false;
    }
    const got = m.allocateSlots(id(s), sm.tokens, numNew, computed);
    const shouldFail = needed - held > freeBefore - evictable;
    expect(got === null).toBe(shouldFail);
    if (got === null) {
      tally.refusals++;
      expect(snapshot()).toBe(before);
      return false;
    }
    expect(got).toHaveLength(Math.max(0, needed - held));
    for (let p = start; p < start + numNew; p++) kv[m.slotFor(id(s), p)] = ctx(sm, p);
    return true;
  }

  function admit(s: number, readmit = false): void {
    const sm = model[s];
    const before = m.stats();
    const c = m.getComputedBlocks(id(s), sm.tokens, sm.salt === undefined ? undefined : { cacheSalt: sm.salt });
    // Never the last prompt token, only whole blocks.
    expect(c.numComputedTokens % bs).toBe(0);
    expect(c.numComputedTokens).toBeLessThanOrEqual(Math.max(0, sm.tokens.length - 1));
    if (cfg.enablePrefixCaching) {
      queries += sm.tokens.length;
      hits += c.numComputedTokens;
      if (c.numComputedTokens > 0) {
        tally.hits++;
        if (readmit) tally.readmitHits++;
        if (cfg.hash === 'colliding') tally.collidingHits++;
      }
      // Every hit slot must hold exactly this prompt's context.
      for (let p = 0; p < c.numComputedTokens; p++) {
        const slot = c.blocks[Math.floor(p / bs)].id * bs + (p % bs);
        ensure(kv[slot] === ctx(sm, p), () => `prefix hit for ${id(s)} position ${p} reads foreign KV`);
      }
      // Lower bound: full blocks a live sequence shares with this prompt are held, hence cached.
      for (let o = 0; o < SEQS; o++) {
        const om = model[o];
        if (o === s || !om.live || om.salt !== sm.salt) continue;
        // A sliding-window release gives leading blocks back to the pool: still cached, but
        // evictable, so a sequence with released blocks guarantees no prefix hit.
        if (m.numReleasedBlocks(id(o)) > 0) continue;
        let common = 0;
        const lim = Math.min(m.numTokens(id(o)), sm.tokens.length - 1);
        while (common < lim && om.tokens[common] === sm.tokens[common]) common++;
        const sharable = Math.min(Math.floor(common / bs), maxPerSeq) * bs;
        expect(c.numComputedTokens).toBeGreaterThanOrEqual(sharable);
      }
    } else {
      expect(m.stats()).toEqual(before);
    }
    sm.live = allocate(s, sm.tokens.length - c.numComputedTokens, c);
  }

  function freeSeq(s: number): void {
    const sm = model[s];
    if (!sm.live) {
      const before = snapshot();
      expect(() => m.free(id(s))).toThrow(KvError);
      tally.doubleFrees++;
      expect(snapshot()).toBe(before);
      return;
    }
    m.free(id(s));
    sm.live = false;
    sm.reserved = 0;
  }

  function check(): void {
    m.checkInvariants();
    const st = m.stats();
    expect(st.freeBlocks + st.usedBlocks).toBe(st.totalBlocks);
    expect(st.prefixQueries).toBe(queries);
    expect(st.prefixHits).toBe(hits);
    // Independent refcount model: references = number of live tables holding the block.
    const refs = new Map<number, number>();
    for (let s = 0; s < SEQS; s++) {
      expect(m.hasSequence(id(s))).toBe(model[s].live);
      if (!model[s].live) continue;
      const table = m.blockTable(id(s));
      // Released leading entries are the null block; the rest are distinct held blocks.
      const rel = m.numReleasedBlocks(id(s));
      const held = table.slice(rel);
      expect(table.slice(0, rel).every((b) => b === NULL_BLOCK_ID)).toBe(true);
      expect(new Set(held).size).toBe(held.length);
      expect(held).not.toContain(NULL_BLOCK_ID);
      expect(table.length).toBe(Math.max(Math.ceil(model[s].tokens.length / bs), model[s].reserved));
      for (const b of held) refs.set(b, (refs.get(b) ?? 0) + 1);
      for (let p = rel * bs; p < model[s].tokens.length; p++) {
        ensure(kv[m.slotFor(id(s), p)] === ctx(model[s], p), () => `${id(s)} position ${p} lost its KV`);
      }
    }
    let used = 1;
    for (let b = 1; b < cfg.numBlocks; b++) {
      const rc = m.pool.block(b).refCount;
      ensure(rc >= 0 && rc === (refs.get(b) ?? 0), () => `block ${b}: refCount ${rc}, ${refs.get(b) ?? 0} holders`);
      if (rc > 0) used++;
    }
    expect(st.usedBlocks).toBe(used);
  }

  for (const op of ops) {
    const sm = model[op.s];
    switch (op.t) {
      case 'admit':
        if (sm.live) {
          expect(() => m.getComputedBlocks(id(op.s), [1])).toThrow(KvError);
          break;
        }
        sm.tokens = [...PREFIXES[op.prefix].slice(0, op.cut), ...op.suffix];
        sm.salt = SALTS[op.salt];
        sm.ctxIds = [];
        sm.reserved = 0;
        admit(op.s);
        break;
      case 'append': {
        if (!sm.live) break;
        const n = sm.tokens.length;
        sm.tokens.push(...op.toks);
        if (!allocate(op.s, op.toks.length)) {
          sm.tokens.length = n; // not scheduled: nothing happened
          sm.ctxIds.length = Math.min(sm.ctxIds.length, n);
        }
        break;
      }
      case 'free':
        freeSeq(op.s);
        break;
      case 'release':
        if (!sm.live) break;
        if (m.releaseBlocksBefore(id(op.s), m.numTokens(id(op.s)) - op.keep) > 0) tally.releases++;
        break;
      case 'fork': {
        const src = model[op.from];
        if (!src.live || op.s === op.from) break;
        if (sm.live) {
          expect(() => m.forkSequence(id(op.from), id(op.s), op.copy)).toThrow(KvError);
          break;
        }
        const n = m.numTokens(id(op.from));
        const full = Math.floor(n / bs);
        const partial = n % bs !== 0;
        const before = snapshot();
        if (!op.copy && full === 0) {
          expect(() => m.forkSequence(id(op.from), id(op.s), false)).toThrow(KvError);
          expect(snapshot()).toBe(before);
          break;
        }
        const freeBefore = m.numFreeBlocks;
        const f = m.forkSequence(id(op.from), id(op.s), op.copy);
        if (f === null) {
          expect(op.copy && partial && freeBefore === 0).toBe(true);
          expect(snapshot()).toBe(before);
          break;
        }
        const keep = partial && !op.copy ? full * bs : n;
        expect(f.numTokens).toBe(keep);
        expect(f.sharedBlocks).toBe(full - m.numReleasedBlocks(id(op.from)));
        expect(f.copy !== undefined).toBe(partial && op.copy);
        // The child continues the parent's context; the copy gives it the partial block's K/V.
        sm.tokens = src.tokens.slice(0, keep);
        sm.salt = src.salt;
        sm.ctxIds = src.ctxIds.slice(0, keep);
        sm.reserved = 0;
        sm.live = true;
        if (f.copy) {
          for (let o = 0; o < bs; o++) kv[f.copy.dst * bs + o] = kv[f.copy.src * bs + o];
          tally.forkCopies++;
        }
        tally.forks++;
        break;
      }
      case 'reserve': {
        if (!sm.live) break;
        const n = m.numTokens(id(op.s));
        const needed = Math.ceil((n + op.extra) / bs);
        const held = m.blockTable(id(op.s)).length;
        const freeBefore = m.numFreeBlocks;
        const before = snapshot();
        if (needed > maxPerSeq) {
          expect(() => m.reserveBlocks(id(op.s), n + op.extra)).toThrow(MaxBlocksPerSeqError);
          expect(snapshot()).toBe(before);
          break;
        }
        const got = m.reserveBlocks(id(op.s), n + op.extra);
        expect(got === null).toBe(needed - held > freeBefore);
        if (got === null) {
          tally.reserveRefusals++;
          expect(snapshot()).toBe(before);
          break;
        }
        expect(got).toHaveLength(Math.max(0, needed - held));
        // The tokens (and their slots) are as they were.
        expect(m.numTokens(id(op.s))).toBe(n);
        sm.reserved = Math.max(held, needed);
        if (got.length > 0) tally.reserved++;
        break;
      }
      case 'preempt':
        if (!sm.live) break;
        m.free(id(op.s));
        sm.live = false;
        sm.reserved = 0;
        check();
        admit(op.s, true); // recompute: the sequence's own full blocks may still be cached
        break;
    }
    check();
  }

  for (let s = 0; s < SEQS; s++) if (model[s].live) freeSeq(s);
  check();
  expect(m.numFreeBlocks).toBe(cfg.numBlocks - 1);
  expect(m.usage).toBe(0);
  expect(m.resetPrefixCache()).toBe(true);
  expect(m.stats().cachedBlocks).toBe(0);
  m.checkInvariants();
}

describe('KvCacheManager properties', () => {
  it('keeps every invariant and every sequence\'s KV intact under random schedules', () => {
    fc.assert(
      fc.property(configArb, fc.array(opArb, { minLength: 1, maxLength: 60 }), (cfg, ops) => run(cfg, ops)),
      // Besides the random schedules, one that always reaches a reservation refused for want of
      // free blocks (three usable blocks all held); random ones reach it only sometimes (one CI run
      // saw none, failing the tally below).
      { numRuns: 400, examples: [[REFUSED_RESERVE_CFG, REFUSED_RESERVE_OPS]] },
    );
  });

  it('with a large pool and heavy sharing, never leaks a block', () => {
    fc.assert(
      fc.property(
        fc.record({
          numBlocks: fc.constant(64),
          blockSize: fc.integer({ min: 1, max: 3 }),
          enablePrefixCaching: fc.constant(true),
          hash: fc.constantFrom('sha256' as const, 'colliding' as const),
          maxBlocksPerSeq: fc.constant(undefined),
        }),
        fc.array(opArb, { minLength: 20, maxLength: 120 }),
        (cfg, ops) => run(cfg, ops),
      ),
      { numRuns: 100 },
    );
  });

  it('exercised hits, refusals, length limits, cached re-admission, double frees, window releases, forks and reservations', () => {
    // Runs after the properties above (vitest runs a file's tests in order).
    for (const [k, v] of Object.entries(tally)) expect(v, k).toBeGreaterThan(0);
  });
});
