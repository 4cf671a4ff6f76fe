import { sampleRow, uniformFromSeed } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import { CpuBackend, OpArgumentError } from '../src/index.js';
import { randn, rng, upload } from './helpers.js';

// Op sample's mask (capabilities.opFields sample: mask): constrained decoding's token masks.

const VOCAB = 301;
const WORDS = Math.ceil(VOCAB / 32);

function allowed(bits: Int32Array, k: number, t: number): boolean {
  return ((bits[k * WORDS + (t >>> 5)] >>> (t & 31)) & 1) === 1;
}

describe('op sample with a token mask (CPU)', () => {
  it('masked rows sample the rule over their allowed ids alone; free rows as without a mask', () => {
    const be = new CpuBackend();
    expect(be.capabilities.opFields?.sample).toContain('mask');
    const r = rng(11);
    const rows = 4;
    const logits = randn(r, rows * VOCAB, 3);
    const params = Float32Array.from([0, 0, 1, 0, 1, 0, 1, 0, 0.8, 30, 0.9, 0.02, 0.9, 0, 1, 0]);
    const seeds = Int32Array.from([3, 0, -17, 5, 99, 2, 41, 7]);
    // Two masks; rows 0 and 2 share mask 1, row 1 takes mask 0, row 3 is free.
    const bits = new Int32Array(2 * WORDS);
    for (let k = 0; k < 2; k++) for (let t = 0; t < VOCAB; t++) if ((t * 7 + k) % 5 === 0) bits[k * WORDS + (t >>> 5)] |= 1 << (t & 31);
    const index = Int32Array.from([1, 0, 1, -1]);
    const out = upload(be, new Int32Array(rows).fill(-1));
    const rngBuf = upload(be, seeds);
    be.run('sample', {
      logits: upload(be, logits),
      params: upload(be, params),
      rng: rngBuf,
      out,
      rows,
      vocab: VOCAB,
      mask: { bits: upload(be, bits), index: upload(be, index), words: WORDS },
    });
    const got = be.read(out, 0, rows) as Int32Array;
    for (let row = 0; row < rows; row++) {
      const row32 = logits.slice(row * VOCAB, (row + 1) * VOCAB);
      if (index[row] >= 0) for (let t = 0; t < VOCAB; t++) if (!allowed(bits, index[row], t)) row32[t] = -Infinity;
      const p = { temperature: params[row * 4], topK: params[row * 4 + 1], topP: params[row * 4 + 2], minP: params[row * 4 + 3] };
      const want = sampleRow(row32, 0, VOCAB, p, uniformFromSeed(seeds[row * 2], seeds[row * 2 + 1]));
      expect(got[row]).toBe(want);
      if (index[row] >= 0) expect(allowed(bits, index[row], got[row])).toBe(true);
    }
    // The greedy masked row did not take its unmasked argmax (which mask 1 forbids here).
    let top = 0;
    for (let t = 1; t < VOCAB; t++) if (logits[t] > logits[top]) top = t;
    if (!allowed(bits, 1, top)) expect(got[0]).not.toBe(top);
    // The counters advanced for every row.
    expect(Array.from(be.read(rngBuf, 0, rows * 2) as Int32Array).filter((_, i) => i % 2 === 1)).toEqual([1, 6, 3, 8]);
    // The logits are not modified.
    be.dispose();
  });

  it('refuses a mask that allows nothing, too few words, or an index past the bits', () => {
    const be = new CpuBackend();
    const logits = upload(be, new Float32Array(2 * 64).fill(0.5));
    const base = { logits, params: upload(be, new Float32Array(8)), rng: upload(be, new Int32Array(4)), out: upload(be, new Int32Array(2)), rows: 2, vocab: 64 };
    const empty = upload(be, new Int32Array(2));
    const idx = upload(be, Int32Array.from([0, -1]));
    expect(() => be.run('sample', { ...base, mask: { bits: empty, index: idx, words: 2 } })).toThrow(/allows no id below 64/);
    expect(() => be.run('sample', { ...base, mask: { bits: empty, index: idx, words: 1 } })).toThrow(OpArgumentError);
    const far = upload(be, Int32Array.from([5, -1]));
    expect(() => be.run('sample', { ...base, mask: { bits: upload(be, Int32Array.from([1, 0])), index: far, words: 2 } })).toThrow(OpArgumentError);
    // An allowed id past `limit` does not count: the row allows nothing below it.
    expect(() => be.run('sample', { ...base, limit: 32, mask: { bits: upload(be, Int32Array.from([0, 1])), index: idx, words: 2 } })).toThrow(/allows no id below 32/);
    be.dispose();
  });
});
