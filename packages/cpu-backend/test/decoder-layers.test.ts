import type { DecoderLayerWeights, DeviceBuffer, OpArgs } from '@nerva/core';
import { NervaError } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import { CpuBackend, OpArgumentError } from '../src/index.js';
import { randn, rng, upload, zeros } from './helpers.js';

interface Shape {
  layers: number;
  hidden: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  intermediate: number;
  blockSize: number;
  /** Context length of each sequence (its decode row sits at the last position). */
  seqLens: number[];
  /** Row order: rowSeq[r] is the sequence of row r. */
  rowSeq: number[];
  qkNorm: boolean;
  bias: boolean;
}

const GQA: Shape = { layers: 2, hidden: 32, numHeads: 4, numKvHeads: 2, headDim: 8, intermediate: 40, blockSize: 4, seqLens: [6, 1, 11], rowSeq: [2, 0, 1], qkNorm: true, bias: true };

/** A decode step through a random dense stack: op arguments over freshly uploaded buffers (same seed, same values). */
function build(be: CpuBackend, s: Shape, seed: number): OpArgs<'decoder_layers'> {
  const r = rng(seed);
  const { hidden: H, numHeads: nq, numKvHeads: nkv, headDim: hd, intermediate: I, blockSize } = s;
  const qkvOut = (nq + 2 * nkv) * hd;
  const kvw = nkv * hd;
  const rows = s.rowSeq.length;
  const maxBlocks = Math.ceil(Math.max(...s.seqLens) / blockSize) + 1;
  const numBlocks = s.seqLens.length * maxBlocks;
  // Sequence q owns table row q; blocks are handed out in a shuffled order.
  const tables = Int32Array.from(r.perm(numBlocks));
  const slotOf = (q: number, p: number) => tables[q * maxBlocks + Math.floor(p / blockSize)] * blockSize + (p % blockSize);
  const positions = s.rowSeq.map((q) => s.seqLens[q] - 1);
  const slots = s.rowSeq.map((q) => slotOf(q, s.seqLens[q] - 1));
  const nSlots = numBlocks * blockSize;
  const layers: DecoderLayerWeights[] = [];
  const norm = (n: number) => upload(be, randn(r, n, 0.2).map((v) => 1 + v));
  for (let l = 0; l < s.layers; l++) {
    layers.push({
      attnNorm: norm(H),
      qkv: upload(be, randn(r, qkvOut * H, 1 / Math.sqrt(H))),
      ...(s.bias ? { qkvBias: upload(be, randn(r, qkvOut, 0.5)) } : {}),
      ...(s.qkNorm ? { qNorm: norm(hd), kNorm: norm(hd) } : {}),
      o: upload(be, randn(r, H * nq * hd, 1 / Math.sqrt(nq * hd))),
      ...(s.bias ? { oBias: upload(be, randn(r, H, 0.1)) } : {}),
      mlpNorm: norm(H),
      gateUp: upload(be, randn(r, 2 * I * H, 1 / Math.sqrt(H))),
      down: upload(be, randn(r, H * I, 1 / Math.sqrt(I))),
      kCache: upload(be, randn(r, nSlots * kvw)),
      vCache: upload(be, randn(r, nSlots * kvw)),
    });
  }
  return {
    x: upload(be, randn(r, rows * H)),
    qkv: zeros(be, rows * qkvOut),
    attn: zeros(be, rows * nq * hd),
    mlp: zeros(be, rows * I),
    positions: upload(be, Int32Array.from(positions)),
    slots: upload(be, Int32Array.from(slots)),
    blockTables: upload(be, tables),
    rowSeq: upload(be, Int32Array.from(s.rowSeq)),
    invFreq: upload(be, Float32Array.from({ length: hd / 2 }, (_, i) => 10000 ** ((-2 * i) / hd))),
    layers,
    rows,
    hidden: H,
    numHeads: nq,
    numKvHeads: nkv,
    headDim: hd,
    intermediate: I,
    blockSize,
    maxBlocksPerSeq: maxBlocks,
    eps: 1e-6,
    scale: 1 / Math.sqrt(hd),
  };
}

/** The op's definition: the six per-layer ops, run one by one. */
function byHand(be: CpuBackend, a: OpArgs<'decoder_layers'>): void {
  const { rows, hidden: H, numHeads: nq, numKvHeads: nkv, headDim: hd, intermediate: I, eps } = a;
  const qkvOut = (nq + 2 * nkv) * hd;
  for (const lw of a.layers) {
    be.run('fused_matmul', { x: a.x, weight: lw.qkv, bias: lw.qkvBias, out: a.qkv, rows, inDim: H, outDim: qkvOut, normWeight: lw.attnNorm, eps });
    be.run('rope_append', {
      qkv: a.qkv,
      positions: a.positions,
      invFreq: a.invFreq,
      slots: a.slots,
      kCache: lw.kCache,
      vCache: lw.vCache,
      rows,
      numHeads: nq,
      numKvHeads: nkv,
      headDim: hd,
      rowStride: qkvOut,
      qNorm: lw.qNorm,
      kNorm: lw.kNorm,
      eps,
    });
    be.run('attention', {
      q: a.qkv,
      kCache: lw.kCache,
      vCache: lw.vCache,
      out: a.attn,
      blockTables: a.blockTables,
      rowSeq: a.rowSeq,
      positions: a.positions,
      rows,
      numHeads: nq,
      numKvHeads: nkv,
      headDim: hd,
      blockSize: a.blockSize,
      maxBlocksPerSeq: a.maxBlocksPerSeq,
      qRowStride: qkvOut,
      qOffset: 0,
      scale: a.scale,
    });
    be.run('fused_matmul', { x: a.attn, weight: lw.o, bias: lw.oBias, out: a.x, rows, inDim: nq * hd, outDim: H, accumulate: true });
    be.run('fused_matmul', { x: a.x, weight: lw.gateUp, out: a.mlp, rows, inDim: H, outDim: I, normWeight: lw.mlpNorm, eps, glu: true });
    be.run('fused_matmul', { x: a.mlp, weight: lw.down, out: a.x, rows, inDim: I, outDim: H, accumulate: true });
  }
}

/** What the op may change: x and every layer's caches. */
function state(be: CpuBackend, a: OpArgs<'decoder_layers'>): number[][] {
  return [a.x, ...a.layers.flatMap((l) => [l.kCache, l.vCache])].map((b) => Array.from(be.read(b)));
}

function thrown(f: () => unknown): Error {
  try {
    f();
  } catch (e) {
    return e as Error;
  }
  throw new Error('expected an error');
}

describe('decoder_layers', () => {
  it.each([
    ['GQA 2, QK-norm, qkv and o bias', GQA],
    ['GQA 2, no QK-norm, no bias', { ...GQA, qkNorm: false, bias: false }],
    ['MQA, 1 row, 3 layers', { ...GQA, layers: 3, numHeads: 3, numKvHeads: 1, headDim: 6, seqLens: [9], rowSeq: [0] }],
  ])('equals its six ops per layer run by hand, bit for bit (%s)', (_name, shape) => {
    const be = new CpuBackend();
    const fused = build(be, shape, 7);
    const hand = build(be, shape, 7);
    const before = state(be, fused);
    expect(state(be, hand)).toEqual(before);
    be.run('decoder_layers', fused);
    byHand(be, hand);
    const after = state(be, fused);
    expect(after).toEqual(state(be, hand));
    // Not a no-op: x moved, and each layer wrote every row's current slot and nothing else.
    expect(after[0]).not.toEqual(before[0]);
    const kvw = shape.numKvHeads * shape.headDim;
    const slots = Array.from(be.read(fused.slots));
    for (let i = 1; i < after.length; i++) {
      for (let sl = 0; sl < after[i].length / kvw; sl++) {
        const changed = after[i].slice(sl * kvw, (sl + 1) * kvw).some((v, j) => v !== before[i][sl * kvw + j]);
        expect(changed).toBe(slots.includes(sl));
      }
    }
  });

  it('with embed: op embedding into x, then the layers, bit for bit', () => {
    const be = new CpuBackend();
    const r = rng(11);
    const vocab = 13;
    const table = upload(be, randn(r, vocab * GQA.hidden));
    const ids = upload(be, Int32Array.from([12, 0, 5]));
    const fused = build(be, GQA, 9);
    const hand = build(be, GQA, 9);
    be.run('decoder_layers', { ...fused, embed: { table, ids } });
    be.run('embedding', { table, ids, out: hand.x, rows: hand.rows, hidden: GQA.hidden });
    be.run('decoder_layers', hand);
    expect(state(be, fused)).toEqual(state(be, hand));
    // The embedded rows replaced x: a run on x as it was gives another result.
    const plain = build(be, GQA, 9);
    be.run('decoder_layers', plain);
    expect(state(be, plain)[0]).not.toEqual(state(be, fused)[0]);
  });

  it('with embed: an id outside the table is refused before anything is written', () => {
    const be = new CpuBackend();
    const a = build(be, GQA, 4);
    const table = upload(be, randn(rng(2), 7 * GQA.hidden));
    const before = state(be, a);
    const e = thrown(() => be.run('decoder_layers', { ...a, embed: { table, ids: upload(be, Int32Array.from([1, 7, 2])) } }));
    expect(e).toBeInstanceOf(OpArgumentError);
    expect(e.message).toMatch(/ids\[1\] = 7 is outside the table \(7 rows\)/);
    expect(state(be, a)).toEqual(before);
    // A table shorter than one row, and an embed that is not an object, are refused as well.
    expect(() => be.run('decoder_layers', { ...a, embed: { table: zeros(be, GQA.hidden - 1), ids: a.rowSeq } })).toThrow(OpArgumentError);
    expect(() => be.run('decoder_layers', { ...a, embed: 3 as unknown as { table: DeviceBuffer; ids: DeviceBuffer } })).toThrow(OpArgumentError);
    // The table may not be a buffer the op writes.
    expect(() => be.run('decoder_layers', { ...a, embed: { table: a.x, ids: a.rowSeq } })).toThrow(/x: must not be the same buffer as embed\.table/);
    expect(state(be, a)).toEqual(before);
  });

  it('is captured and replayed like any op, with the same result as a direct run', () => {
    const be = new CpuBackend();
    const direct = build(be, GQA, 3);
    const graphed = build(be, GQA, 3);
    be.beginCapture();
    be.run('decoder_layers', graphed);
    const g = be.endCapture();
    be.run('decoder_layers', direct);
    be.replay(g);
    expect(state(be, graphed)).toEqual(state(be, direct));
  });

  it('rejects a too-short weight of a later layer before running any layer', () => {
    const be = new CpuBackend();
    const a = build(be, GQA, 5);
    const before = state(be, a);
    const short = zeros(be, 2 * GQA.intermediate * GQA.hidden - 1);
    const layers = [a.layers[0], { ...a.layers[1], gateUp: short }];
    const e = thrown(() => be.run('decoder_layers', { ...a, layers }));
    expect(e).toBeInstanceOf(OpArgumentError);
    expect(e).toBeInstanceOf(NervaError);
    expect((e as OpArgumentError).arg).toBe('layers[1].gateUp');
    expect(e.message).toMatch(/op decoder_layers: argument layers\[1\]\.gateUp: .* the op needs 2560/);
    expect(state(be, a)).toEqual(before);
    // The same check fails at capture, as a mis-sized launch would.
    be.beginCapture();
    expect(() => be.run('decoder_layers', { ...a, layers })).toThrow(OpArgumentError);
    expect(be.endCapture().nodes).toBe(0);
  });

  it('rejects bad attributes with a typed error naming the argument, leaving x untouched', () => {
    const be = new CpuBackend();
    const a = build(be, GQA, 9);
    const before = state(be, a);
    const cases: Array<[Partial<OpArgs<'decoder_layers'>>, string]> = [
      [{ numHeads: 3 }, 'numKvHeads'], // 3 q heads over 2 kv heads
      [{ headDim: 7 }, 'headDim'],
      [{ rows: -1 }, 'rows'],
      [{ intermediate: 0 }, 'intermediate'],
      [{ eps: Number.NaN }, 'eps'],
      [{ mlp: a.attn }, 'mlp'], // scratch buffers must not alias
      [{ layers: [a.layers[0], { ...a.layers[1], kCache: a.x }] }, 'layers[1].kCache'],
      [{ layers: [a.layers[0], { ...a.layers[1], qkv: undefined as unknown as DeviceBuffer }] }, 'layers[1].qkv'],
    ];
    for (const [bad, arg] of cases) {
      const e = thrown(() => be.run('decoder_layers', { ...a, ...bad }));
      expect(e, arg).toBeInstanceOf(OpArgumentError);
      expect((e as OpArgumentError).arg).toBe(arg);
    }
    expect(state(be, a)).toEqual(before);
  });

  it('checks indices against every layer before the first write', () => {
    const be = new CpuBackend();
    const a = build(be, GQA, 11);
    const kvw = GQA.numKvHeads * GQA.headDim;
    const maxSlot = Math.max(...Array.from(be.read(a.slots)));
    // Layer 1's caches are too small for the largest slot (layer 0's would be fine).
    const smallK = upload(be, randn(rng(1), maxSlot * kvw));
    const smallV = upload(be, randn(rng(2), maxSlot * kvw));
    const layers = [a.layers[0], { ...a.layers[1], kCache: smallK, vCache: smallV }];
    const before = state(be, a);
    let e = thrown(() => be.run('decoder_layers', { ...a, layers }));
    expect(e).toBeInstanceOf(OpArgumentError);
    expect(e.message).toMatch(/layers\[1\]'s cache/);
    expect(state(be, a)).toEqual(before);

    // Two appending rows of one sequence (a prefill chunk) break the op's precondition.
    be.write(a.rowSeq, Int32Array.from([2, 0, 2]));
    e = thrown(() => be.run('decoder_layers', a));
    expect((e as OpArgumentError).arg).toBe('rowSeq');
    expect(e.message).toMatch(/more than one appending row/);
    expect(state(be, a)).toEqual(before);
    // ... unless the extra row is padding (slot -1), as the padded rows of a captured batch are.
    be.write(a.slots, Int32Array.from([-1]), 2);
    be.run('decoder_layers', a);
    expect(state(be, a)[0]).not.toEqual(before[0]);

    const b = build(be, GQA, 12);
    const b0 = state(be, b);
    be.write(b.rowSeq, Int32Array.from([3]), 1); // there are 3 block tables
    expect((thrown(() => be.run('decoder_layers', b)) as OpArgumentError).arg).toBe('rowSeq');
    be.write(b.rowSeq, Int32Array.from([0]), 1);
    be.write(b.positions, Int32Array.from([b.maxBlocksPerSeq * GQA.blockSize]), 1);
    expect((thrown(() => be.run('decoder_layers', b)) as OpArgumentError).arg).toBe('positions');
    expect(state(be, b)).toEqual(b0);
  });
});
