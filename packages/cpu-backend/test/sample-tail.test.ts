import type { DeviceBuffer, OpArgs } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import { CpuBackend, OpArgumentError } from '../src/index.js';
import { randn, rng, upload, zeros } from './helpers.js';

// Op sample's push and advance (capabilities.opFields: sample takes push and advance): a decode step's tail in one op.

const VOCAB = 97;
const BLOCK = 4;
const MAX_BLOCKS = 4;

interface Tail {
  sample: OpArgs<'sample'>;
  push: NonNullable<OpArgs<'sample'>['push']>;
  advance: NonNullable<OpArgs<'sample'>['advance']>;
  bufs: DeviceBuffer[];
}

/** Three rows (one greedy, two sampled) at positions that cross a block boundary, over fresh buffers. */
function build(be: CpuBackend, seed: number): Tail {
  const r = rng(seed);
  const rows = 3;
  const logits = upload(be, randn(r, rows * VOCAB, 3));
  const params = upload(be, Float32Array.from([0, 0, 1, 0, 0.8, 20, 0.9, 0, 1.2, 0, 1, 0.01]));
  const rngState = upload(be, Int32Array.from([5, 0, 77, 3, -9, 12]));
  const out = upload(be, new Int32Array(rows).fill(-1));
  const ring = upload(be, new Int32Array(5).fill(-2));
  const cursor = upload(be, Int32Array.from([3]));
  const positions = upload(be, Int32Array.from([3, 6, 0]));
  const slots = upload(be, new Int32Array(rows).fill(-3));
  const blockTables = upload(be, Int32Array.from(r.perm(rows * MAX_BLOCKS)));
  const rowSeq = upload(be, Int32Array.from([2, 0, 1]));
  const push = { ring, cursor, capacity: 5 };
  const advance = { positions, slots, blockTables, rowSeq, blockSize: BLOCK, maxBlocksPerSeq: MAX_BLOCKS };
  return {
    sample: { logits, params, rng: rngState, out, rows, vocab: VOCAB },
    push,
    advance,
    bufs: [out, rngState, ring, cursor, positions, slots],
  };
}

const state = (be: CpuBackend, t: Tail) => t.bufs.map((b) => Array.from(be.read(b)));

describe('op sample with push and advance', () => {
  it('is op sample, then ring_push of its out, then advance_positions, bit for bit', () => {
    const be = new CpuBackend();
    expect(be.capabilities.opFields?.sample).toEqual(['push', 'advance', 'mask']);
    const fused = build(be, 3);
    const hand = build(be, 3);
    for (let step = 0; step < 3; step++) {
      be.run('sample', { ...fused.sample, push: fused.push, advance: fused.advance });
      be.run('sample', hand.sample);
      be.run('ring_push', { ...hand.push, src: hand.sample.out, rows: hand.sample.rows });
      be.run('advance_positions', { ...hand.advance, rows: hand.sample.rows });
      expect(state(be, fused)).toEqual(state(be, hand));
    }
    // Three steps moved the cursor by 9 and every position by 3.
    const [, , , cursor, positions] = state(be, fused);
    expect(cursor).toEqual([12]);
    expect(positions).toEqual([6, 9, 3]);
  });

  it('push alone and advance alone are the ops they name', () => {
    const be = new CpuBackend();
    const a = build(be, 5);
    const b = build(be, 5);
    be.run('sample', { ...a.sample, push: a.push });
    be.run('sample', b.sample);
    be.run('ring_push', { ...b.push, src: b.sample.out, rows: 3 });
    expect(state(be, a)).toEqual(state(be, b));
    be.run('sample', { ...a.sample, advance: a.advance });
    be.run('sample', b.sample);
    be.run('advance_positions', { ...b.advance, rows: 3 });
    expect(state(be, a)).toEqual(state(be, b));
  });

  it('a bad push or advance is refused before anything is written', () => {
    const be = new CpuBackend();
    const t = build(be, 7);
    const before = state(be, t);
    // A block table entry that is not preallocated (-1) for a row's next position.
    be.write(t.advance.blockTables, Int32Array.from([-1]), 2 * MAX_BLOCKS + 1);
    expect(() => be.run('sample', { ...t.sample, push: t.push, advance: t.advance })).toThrow(/blockTables: sequence 2 has no block for position 4/);
    expect(state(be, t)).toEqual(before);
    // A ring smaller than the rows, a push that is not an object, the ring as the out buffer.
    expect(() => be.run('sample', { ...t.sample, push: { ...t.push, ring: zeros(be, 2, 'i32'), capacity: 2 } })).toThrow(/3 rows exceed the ring capacity 2/);
    expect(() => be.run('sample', { ...t.sample, push: 7 as unknown as Tail['push'] })).toThrow(OpArgumentError);
    expect(() => be.run('sample', { ...t.sample, push: { ...t.push, ring: t.sample.out } })).toThrow(OpArgumentError);
    expect(state(be, t)).toEqual(before);
  });
});
