import type { DeviceBuffer, OpArgs } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import { CpuBackend, OpArgumentError } from '../src/index.js';
import { randn, rng, upload, zeros } from './helpers.js';

const V = 50;
const H = 24;

/** The buffers of a tiny decode step: embed -> norm (residual) -> lm head -> sample -> ring. */
function setup(be: CpuBackend, seed: number) {
  const r = rng(seed);
  return {
    table: upload(be, randn(r, V * H)),
    normW: upload(be, randn(r, H)),
    lmHead: upload(be, randn(r, V * H)),
    ids: upload(be, Int32Array.from([3, 7])),
    hidden: zeros(be, 2 * H),
    residual: upload(be, randn(r, 2 * H)),
    normed: zeros(be, 2 * H),
    logits: zeros(be, 2 * V),
    logitsCopy: zeros(be, 2 * V),
    params: upload(be, Float32Array.from([0.8, 10, 0.9, 0, 0, 0, 1, 0])),
    rng: upload(be, Int32Array.from([11, 0, 12, 0])),
    ring: upload(be, new Int32Array(6).fill(-1)),
    cursor: zeros(be, 1, 'i32'),
  };
}
type Bufs = ReturnType<typeof setup>;

function step(be: CpuBackend, b: Bufs, matmulArgs?: OpArgs<'matmul'>): void {
  be.run('embedding', { table: b.table, ids: b.ids, out: b.hidden, rows: 2, hidden: H });
  be.run('rmsnorm', { x: b.hidden, residual: b.residual, weight: b.normW, out: b.normed, rows: 2, dim: H, eps: 1e-6 });
  be.run('matmul', matmulArgs ?? { x: b.normed, weight: b.lmHead, out: b.logits, rows: 2, inDim: H, outDim: V });
  be.copy(b.logitsCopy, b.logits, 2 * V);
  // The sampled ids feed the next step, as the device token ring does.
  be.run('sample', { logits: b.logitsCopy, params: b.params, rng: b.rng, out: b.ids, rows: 2, vocab: V });
  be.run('ring_push', { src: b.ids, ring: b.ring, cursor: b.cursor, rows: 2, capacity: 6 });
}

function snapshot(be: CpuBackend, b: Bufs): Record<string, number[]> {
  const out: Record<string, number[]> = {};
  for (const [k, v] of Object.entries(b) as Array<[string, DeviceBuffer]>) out[k] = Array.from(be.read(v));
  return out;
}

describe('graph capture and replay', () => {
  it('replays the recorded ops on the current buffer contents, step after step', () => {
    const direct = new CpuBackend();
    const graphed = new CpuBackend();
    const d = setup(direct, 1);
    const g = setup(graphed, 1);
    const before = snapshot(graphed, g);

    graphed.beginCapture();
    step(graphed, g);
    const graph = graphed.endCapture();
    expect(graph.nodes).toBe(6); // five kernels and one copy
    // Capture recorded but did not run anything.
    expect(snapshot(graphed, g)).toEqual(before);
    expect(graphed.stats().launches).toBe(0);

    for (let s = 0; s < 4; s++) {
      if (s === 2) {
        // Host changes per-step values in buffers between replays; the graph reads them.
        direct.write(d.ids, Int32Array.from([40, 41]));
        graphed.write(g.ids, Int32Array.from([40, 41]));
        direct.write(d.params, Float32Array.from([0, 0, 1, 0]), 4);
        graphed.write(g.params, Float32Array.from([0, 0, 1, 0]), 4);
      }
      step(direct, d);
      graphed.replay(graph);
      expect(snapshot(graphed, g)).toEqual(snapshot(direct, d));
    }
    // Four steps of two tokens went through a ring of 6.
    expect(graphed.read(g.cursor)[0]).toBe(8);
    expect(graphed.stats()).toMatchObject({ launches: 0, graphReplays: 4 });
    expect(direct.stats()).toMatchObject({ launches: 20, graphReplays: 0 });
  });

  it('freezes attributes at capture, while buffers stay by reference', () => {
    const be = new CpuBackend();
    const x = upload(be, Float32Array.from([1, 2, 3, 4]));
    const w = upload(be, Float32Array.from([1, 1, 1, 1, 2, 2, 2, 2]));
    const out = zeros(be, 2);
    const args: OpArgs<'matmul'> = { x, weight: w, out, rows: 1, inDim: 4, outDim: 2 };
    be.beginCapture();
    be.run('matmul', args);
    const graph = be.endCapture();
    args.outDim = 1; // a caller reusing its args object must not change the graph
    be.replay(graph);
    expect(Array.from(be.read(out))).toEqual([10, 20]);
    be.write(x, Float32Array.from([0, 0, 0, 1]));
    be.replay(graph);
    expect(Array.from(be.read(out))).toEqual([1, 2]);
  });

  it('validates sizes at capture time and buffer liveness at replay', () => {
    const be = new CpuBackend();
    const x = zeros(be, 4);
    const out = zeros(be, 2);
    be.beginCapture();
    expect(() => be.run('matmul', { x, weight: zeros(be, 7), out, rows: 1, inDim: 4, outDim: 2 })).toThrow(OpArgumentError);
    const w = zeros(be, 8);
    be.run('matmul', { x, weight: w, out, rows: 1, inDim: 4, outDim: 2 });
    const graph = be.endCapture();
    expect(graph.nodes).toBe(1);
    be.free(w);
    expect(() => be.replay(graph)).toThrow(OpArgumentError);
  });

  it('captures only the capturing stream; other streams run at once', () => {
    const be = new CpuBackend();
    const side = be.createStream();
    const capStream = be.createStream();
    const a = upload(be, Float32Array.from([1, 2]));
    const sideOut = zeros(be, 2);
    const capOut = zeros(be, 2);
    const t0 = be.createEvent();
    const t1 = be.createEvent();
    be.beginCapture(capStream);
    be.run('add', { a, b: a, out: sideOut, length: 2 }, side);
    be.record(t0, capStream);
    be.run('add', { a, b: sideOut, out: capOut, length: 2 }, capStream);
    be.record(t1, capStream);
    const graph = be.endCapture(capStream);
    expect(graph.nodes).toBe(1); // event records are not kernels
    expect(Array.from(be.read(sideOut))).toEqual([2, 4]);
    expect(Array.from(be.read(capOut))).toEqual([0, 0]);
    expect(() => be.elapsedMs(t0, t1)).toThrow(/not recorded/);
    be.replay(graph, capStream);
    expect(Array.from(be.read(capOut))).toEqual([3, 6]);
    expect(be.elapsedMs(t0, t1)).toBeGreaterThanOrEqual(0);
    expect(be.stats()).toMatchObject({ launches: 1, graphReplays: 1 });
  });
});
