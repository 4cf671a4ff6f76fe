import { KvCacheManager } from '@nerva/kv';
import { describe, expect, it } from 'vitest';
import { Request, resolveSamplingParams, Scheduler } from '../src/index.js';

const params = resolveSamplingParams({ temperature: 0, maxTokens: 64, seed: 1 }, { maxTokens: 1000, vocabSize: 100 });
let nextId = 1;
const req = (len: number, priority = 0, t = nextId) => new Request(nextId++, Array.from({ length: len }, (_, i) => (i * 7 + t) % 100), params, priority, undefined, t);

/** Simulate the engine finishing a step: computed counts advance; requests that reached their end sample a token. */
function finishStep(plan: ReturnType<Scheduler['schedule']>): void {
  for (const { req: r, numTokens } of plan.scheduled) {
    r.numComputedTokens += numTokens;
    if (r.numComputedTokens === r.numTokens) r.appendToken(1);
  }
}

describe('Scheduler', () => {
  it('chunks long prompts under the token budget and serves running requests first', () => {
    const kv = new KvCacheManager({ numBlocks: 64, blockSize: 4, enablePrefixCaching: false });
    const s = new Scheduler({ maxNumBatchedTokens: 10, maxNumSeqs: 4 }, kv);
    const a = req(25);
    const b = req(3);
    s.add(a);
    s.add(b);
    let p = s.schedule();
    expect(p.scheduled.map((x) => [x.req.id, x.numTokens])).toEqual([[a.id, 10]]);
    finishStep(p);
    p = s.schedule();
    expect(p.scheduled.map((x) => [x.req.id, x.numTokens])).toEqual([[a.id, 10]]);
    finishStep(p);
    p = s.schedule();
    // a's last 5 prompt tokens first, then b is admitted into the rest of the budget.
    expect(p.scheduled.map((x) => [x.req.id, x.numTokens])).toEqual([
      [a.id, 5],
      [b.id, 3],
    ]);
    finishStep(p);
    p = s.schedule();
    expect(p.scheduled.map((x) => x.numTokens)).toEqual([1, 1]);
    expect(p.numScheduledTokens).toBe(2);
  });

  it('long prompts arriving while requests decode never stall them: every step serves each decode row, prompts take what is left of the budget', () => {
    const kv = new KvCacheManager({ numBlocks: 256, blockSize: 4, enablePrefixCaching: false });
    const s = new Scheduler({ maxNumBatchedTokens: 16, maxNumSeqs: 8 }, kv);
    const decoders = [req(3), req(2), req(4)];
    for (const d of decoders) s.add(d);
    finishStep(s.schedule());
    // Two long prompts (60 and 45 tokens) arrive while the three decode.
    const long = [req(60), req(45)];
    for (const l of long) s.add(l);
    let steps = 0;
    while (long.some((l) => l.outputIds.length === 0)) {
      const p = s.schedule();
      const rows = new Map(p.scheduled.map((x) => [x.req, x.numTokens]));
      for (const d of decoders) expect(rows.get(d)).toBe(1);
      const prompt = long.reduce((n, l) => n + (rows.get(l) ?? 0), 0);
      expect(prompt).toBeLessThanOrEqual(16 - decoders.length);
      expect(p.numScheduledTokens).toBe(decoders.length + prompt);
      finishStep(p);
      steps++;
    }
    // The prompts went through at the budget's pace: 105 tokens at 13 a step.
    expect(steps).toBe(Math.ceil(105 / 13));
  });

  it('admits by priority, then arrival, and never beyond maxNumSeqs', () => {
    const kv = new KvCacheManager({ numBlocks: 64, blockSize: 4, enablePrefixCaching: false });
    const s = new Scheduler({ maxNumBatchedTokens: 100, maxNumSeqs: 2 }, kv);
    const low = req(4, 5);
    const high = req(4, -1);
    const mid = req(4, 0);
    s.add(low);
    s.add(high);
    s.add(mid);
    const p = s.schedule();
    expect(p.scheduled.map((x) => x.req.id)).toEqual([high.id, mid.id]);
    expect(s.waiting.map((r) => r.id)).toEqual([low.id]);
  });

  it('preempts the lowest-priority youngest request when blocks run out, and admits nothing that step', () => {
    // 6 usable blocks of 4 tokens.
    const kv = new KvCacheManager({ numBlocks: 7, blockSize: 4, enablePrefixCaching: false });
    const s = new Scheduler({ maxNumBatchedTokens: 100, maxNumSeqs: 8 }, kv);
    const old = req(8, 0, 1);
    const young = req(8, 0, 2);
    s.add(old);
    s.add(young);
    finishStep(s.schedule()); // both hold 2 blocks, 9 tokens each after sampling
    const waiting = req(2, 0, 3);
    s.add(waiting);
    // Each needs a third block for token 9; only 2 are free, so both fit...
    let p = s.schedule();
    expect(p.preempted).toHaveLength(0);
    finishStep(p);
    // ...and the waiting one took the last ones. Advance until blocks run out.
    let preempted: Request[] = [];
    for (let i = 0; i < 8 && preempted.length === 0; i++) {
      p = s.schedule();
      preempted = [...p.preempted];
      if (preempted.length === 0) finishStep(p);
    }
    expect(preempted.length).toBeGreaterThan(0);
    expect(preempted[0]).not.toBe(old);
    expect(preempted[0].status).toBe('PREEMPTED');
    expect(preempted[0].numComputedTokens).toBe(0);
    expect(s.waiting[0]).toBe(preempted[0]);
    // Nothing was admitted in the step that preempted.
    expect(p.scheduled.every((x) => x.req.status === 'RUNNING')).toBe(true);
    kv.checkInvariants();
  });

  it('remove() frees the blocks of a running request at once', () => {
    const kv = new KvCacheManager({ numBlocks: 16, blockSize: 4, enablePrefixCaching: true });
    const s = new Scheduler({ maxNumBatchedTokens: 100, maxNumSeqs: 8 }, kv);
    const a = req(9);
    s.add(a);
    finishStep(s.schedule());
    expect(kv.stats().sequences).toBe(1);
    s.remove(a);
    expect(kv.stats().sequences).toBe(0);
    expect(kv.stats().freeBlocks).toBe(15);
    expect(s.hasWork).toBe(false);
  });

  describe('with kvReadWindow (every layer slides)', () => {
    it('frees the blocks behind the window before each step; a long sequence holds a bounded number', () => {
      const kv = new KvCacheManager({ numBlocks: 5, blockSize: 4, enablePrefixCaching: true, maxBlocksPerSeq: 64 });
      const s = new Scheduler({ maxNumBatchedTokens: 8, maxNumSeqs: 2, kvReadWindow: 6 }, kv);
      const a = req(10);
      s.add(a);
      let freed = 0;
      for (let step = 0; step < 60; step++) {
        const p = s.schedule();
        expect(p.preempted).toEqual([]);
        freed += p.freedBlocks;
        // Positions p - 5 .. p (+ this step's rows) span at most 3 blocks of 4.
        expect(kv.stats().usedBlocks - 1).toBeLessThanOrEqual(3);
        finishStep(p);
        kv.checkInvariants();
      }
      expect(a.numTokens).toBe(10 + 59);
      expect(freed).toBe(kv.numReleasedBlocks(a.id));
      expect(freed).toBeGreaterThan(10);
    });

    it('a cached prefix that cannot be held beside the chunk is dropped: the request computes from scratch instead of waiting forever', () => {
      // 5 usable blocks; a 21-token prompt whose first 20 tokens sit in 5 cached (free) blocks.
      const kv = new KvCacheManager({ numBlocks: 6, blockSize: 4, enablePrefixCaching: true, maxBlocksPerSeq: 64 });
      const a = req(21);
      const warm = kv.getComputedBlocks('warm', a.allIds);
      kv.allocateSlots('warm', a.allIds, 20, warm);
      kv.free('warm');
      expect(kv.getComputedBlocks(a.id, a.allIds).numComputedTokens).toBe(20);
      const s = new Scheduler({ maxNumBatchedTokens: 8, maxNumSeqs: 2, kvReadWindow: 6 }, kv);
      s.add(a);
      const p = s.schedule();
      expect(p.scheduled.map((x) => [x.req.id, x.numTokens])).toEqual([[a.id, 8]]);
      expect(a.numCachedTokens).toBe(0);
      // Without a window the same request must wait: its prefix + chunk is more than the pool.
      const kv2 = new KvCacheManager({ numBlocks: 6, blockSize: 4, enablePrefixCaching: true, maxBlocksPerSeq: 64 });
      kv2.allocateSlots('warm', a.allIds, 20, kv2.getComputedBlocks('warm', a.allIds));
      kv2.free('warm');
      const b = req(21, 0, a.times.arrival);
      b.allIds.splice(0, b.allIds.length, ...a.allIds);
      const s2 = new Scheduler({ maxNumBatchedTokens: 8, maxNumSeqs: 2 }, kv2);
      s2.add(b);
      expect(s2.schedule().scheduled).toEqual([]);
    });

    it('a cached prefix longer than the window is released behind the first computed row at admission', () => {
      const kv = new KvCacheManager({ numBlocks: 16, blockSize: 4, enablePrefixCaching: true, maxBlocksPerSeq: 64 });
      const a = req(21);
      kv.allocateSlots('warm', a.allIds, 20, kv.getComputedBlocks('warm', a.allIds));
      kv.free('warm');
      const s = new Scheduler({ maxNumBatchedTokens: 8, maxNumSeqs: 2, kvReadWindow: 6 }, kv);
      s.add(a);
      const p = s.schedule();
      expect(p.scheduled.map((x) => [x.req.id, x.numTokens])).toEqual([[a.id, 1]]);
      expect(a.numCachedTokens).toBe(20);
      // Position 20 reads 15..20: blocks 0-2 (positions 0-11) went back.
      expect(p.freedBlocks).toBe(3);
      expect(kv.blockTable(a.id).slice(0, 3)).toEqual([0, 0, 0]);
      kv.checkInvariants();
    });
  });

  describe('batchInvariant: decode-only steps and prompt chunks each whole as alone', () => {
    it("gives every request the prompt chunks it gets alone, several prompts a step within the budget", () => {
      // Deterministic lengths from 1 to 40 around a budget of 16 (and a chunk cap of 12): short
      // prompts share steps, long ones are chunked.
      const lens = Array.from({ length: 24 }, (_, i) => 1 + ((i * 37 + 11) % 40));
      const run = (ls: number[], cap?: number) => {
        const kv = new KvCacheManager({ numBlocks: 4096, blockSize: 4, enablePrefixCaching: false });
        const s = new Scheduler({ maxNumBatchedTokens: 16, maxNumSeqs: 64, batchInvariant: true, ...(cap ? { longPrefillTokenThreshold: cap } : {}) }, kv);
        const rs = ls.map((l) => req(l));
        for (const r of rs) s.add(r);
        const chunks = new Map<Request, number[]>(rs.map((r) => [r, []]));
        let multi = 0;
        for (let i = 0; i < 400 && rs.some((r) => r.outputIds.length === 0); i++) {
          const p = s.schedule();
          // Rows still in their prompt (a last chunk of one token runs with the decode rows, as alone).
          const prompt = p.scheduled.filter((x) => x.req.outputIds.length === 0);
          expect(p.numScheduledTokens).toBeLessThanOrEqual(16);
          if (p.scheduled.some((x) => x.numTokens > 1)) {
            // A step with a chunk of several tokens holds no decode row.
            expect(p.scheduled.every((x) => x.req.outputIds.length === 0)).toBe(true);
            if (prompt.length > 1) multi++;
          }
          for (const x of prompt) chunks.get(x.req)!.push(x.numTokens);
          finishStep(p);
        }
        return { rs, chunks, multi };
      };
      for (const cap of [undefined, 12]) {
        const together = run(lens, cap);
        expect(together.multi).toBeGreaterThan(0);
        together.rs.forEach((r, i) => {
          expect(r.outputIds.length).toBeGreaterThan(0);
          const alone = run([lens[i]], cap);
          expect(together.chunks.get(r)).toEqual(alone.chunks.get(alone.rs[0]));
        });
      }
    });

    it('never mixes prompt rows with decode rows, chunks a prompt as alone, and paces prompts by the token budget', () => {
      const kv = new KvCacheManager({ numBlocks: 64, blockSize: 4, enablePrefixCaching: false });
      const s = new Scheduler({ maxNumBatchedTokens: 10, maxNumSeqs: 4, batchInvariant: true }, kv);
      const a = req(6);
      const b = req(13);
      const c = req(3);
      const d = req(2);
      s.add(c);
      s.add(b);
      s.add(a);
      const steps: Array<Array<[number, number]>> = [];
      for (let i = 0; i < 12; i++) {
        if (i === 6) s.add(d);
        const p = s.schedule();
        steps.push(p.scheduled.map((x) => [x.req.id, x.numTokens]));
        finishStep(p);
      }
      for (const st of steps) {
        // A step is prompt chunks only, or only rows of one token each.
        if (st.some(([, n]) => n > 1)) expect(st.every(([, n]) => n > 1)).toBe(true);
      }
      expect(steps.slice(0, 8)).toEqual([
        [[a.id, 6]], // a's prompt: 6 of the budget's 10; b's chunk alone (10) does not fit the 4 left
        [[b.id, 10]], // b's first chunk, the whole budget, as alone (16 >= 10: a decode step is due)
        [[a.id, 1]], // a decodes
        [
          [b.id, 3], // b's last chunk, as alone
          [c.id, 3], // c's whole prompt fits beside it: one step for both
        ],
        [
          [a.id, 1],
          [b.id, 1],
          [c.id, 1],
        ],
        [
          [a.id, 1],
          [b.id, 1],
          [c.id, 1],
        ],
        [[d.id, 2]], // d arrives: its prompt alone
        [
          [a.id, 1],
          [b.id, 1],
          [c.id, 1],
          [d.id, 1],
        ],
      ]);
    });
  });
});

describe('Scheduler with a prompt budget', () => {
  it('a burst of prompts arriving while requests decode takes the prompt budget a step, every decode row served; with no decode row, the whole budget', () => {
    const kv = new KvCacheManager({ numBlocks: 512, blockSize: 4, enablePrefixCaching: false });
    const s = new Scheduler({ maxNumBatchedTokens: 64, maxNumSeqs: 16, decodePromptBudget: 10 }, kv);
    // Four prompts of 12 arrive together: nothing decodes, so the first step takes 48 tokens.
    const first = [req(12), req(12), req(12), req(12)];
    for (const r of first) s.add(r);
    let p = s.schedule();
    expect(p.numScheduledTokens).toBe(48);
    finishStep(p);
    // A burst of six prompts of 7 while the four decode: at most 10 prompt tokens a step.
    const burst = Array.from({ length: 6 }, () => req(7));
    for (const r of burst) s.add(r);
    let steps = 0;
    while (burst.some((r) => r.outputIds.length === 0)) {
      p = s.schedule();
      const rows = new Map(p.scheduled.map((x) => [x.req, x.numTokens]));
      for (const d of first) expect(rows.get(d)).toBe(1);
      const prompt = p.scheduled.filter((x) => x.req.numTokens - x.req.numComputedTokens > 1).reduce((n, x) => n + x.numTokens, 0);
      expect(prompt).toBeLessThanOrEqual(10);
      finishStep(p);
      steps++;
    }
    // 42 prompt tokens at 10 a step: 5 steps (the last prompt's final token shares a step).
    expect(steps).toBe(5);
    // Once nothing decodes, prompts take the whole budget again.
    for (const r of [...first, ...burst]) s.remove(r);
    const next = [req(40), req(40)];
    for (const r of next) s.add(r);
    expect(s.schedule().numScheduledTokens).toBe(64);
  });

  it('batch-invariant steps keep their own pace: a prompt chunk alone takes the whole budget while others decode', () => {
    const kv = new KvCacheManager({ numBlocks: 256, blockSize: 4, enablePrefixCaching: false });
    const s = new Scheduler({ maxNumBatchedTokens: 32, maxNumSeqs: 8, batchInvariant: true, decodePromptBudget: 4 }, kv);
    const d = req(3);
    s.add(d);
    finishStep(s.schedule());
    const a = req(20);
    s.add(a);
    const p = s.schedule();
    expect(p.scheduled.map((x) => [x.req.id, x.numTokens])).toEqual([[a.id, 20]]);
  });
});
