import { describe, expect, it } from 'vitest';
import { NervaError } from '@nerva/core';
import { planStages, StagePlanError, stageOfLayer } from '../src/index.js';

describe('planStages', () => {
  it('covers every layer once in contiguous, non-empty ranges', () => {
    const p = planStages(28, 3);
    expect(p.stages.map((s) => [s.firstLayer, s.endLayer])).toEqual([
      [0, 10],
      [10, 19],
      [19, 28],
    ]);
    expect(stageOfLayer(p, 19)).toBe(2);
  });

  it('moves layers off a stage that carries extra bytes', () => {
    // The last layer also carries an LM head worth two layers: the last stage takes fewer layers.
    const p = planStages(8, 2, [1, 1, 1, 1, 1, 1, 1, 3]);
    expect(p.stages.map((s) => s.layers)).toEqual([5, 3]);
    expect(p.maxStageBytes).toBe(5);
  });

  it('throws StagePlanError (a NervaError, code STAGE_PLAN) for impossible plans', () => {
    expect(() => planStages(2, 3)).toThrow(StagePlanError);
    expect(() => planStages(2, 3)).toThrow(/numStages \(3\) exceeds numLayers \(2\)/);
    expect(() => planStages(4, 0)).toThrow(/numStages must be a positive integer/);
    let thrown: unknown;
    try {
      planStages(4, 1.5);
    } catch (e) {
      thrown = e;
    }
    expect(thrown).toBeInstanceOf(NervaError);
    expect((thrown as NervaError).code).toBe('STAGE_PLAN');
    expect(() => stageOfLayer(planStages(4, 2), 4)).toThrow(StagePlanError);
  });
});

describe('planStages: balance and arguments', () => {
  it('splits equal layers evenly, earlier stages taking the remainder', () => {
    const p = planStages(10, 3);
    expect(p.stages.map((s) => [s.firstLayer, s.endLayer])).toEqual([
      [0, 4],
      [4, 7],
      [7, 10],
    ]);
    expect(p).toMatchObject({ totalBytes: 10, maxStageBytes: 4 });
    expect(p.imbalance).toBeCloseTo(1.2, 10);
    expect(planStages(36, 4).stages.map((s) => s.layers)).toEqual([9, 9, 9, 9]);
    expect(planStages(5, 5).stages.map((s) => s.layers)).toEqual([1, 1, 1, 1, 1]);
    expect(planStages(7, 1).stages).toEqual([{ stage: 0, firstLayer: 0, endLayer: 7, layers: 7, bytes: 7 }]);
  });

  it('balances by bytes: a heavy embedding stage gets fewer layers', () => {
    const bytes = [400, 100, 100, 100, 100, 100, 100, 300];
    const p = planStages(8, 3, bytes);
    expect(p.stages.map((s) => [s.firstLayer, s.endLayer, s.bytes])).toEqual([
      [0, 2, 500],
      [2, 6, 400],
      [6, 8, 400],
    ]);
    expect(p.maxStageBytes).toBe(500);
    // Optimal: no contiguous split has a smaller largest stage.
    let best = Infinity;
    for (let i = 1; i < 7; i++)
      for (let j = i + 1; j < 8; j++) {
        const sum = (a: number, b: number) => bytes.slice(a, b).reduce((x, y) => x + y, 0);
        best = Math.min(best, Math.max(sum(0, i), sum(i, j), sum(j, 8)));
      }
    expect(p.maxStageBytes).toBe(best);
  });

  it('is optimal on random weights (checked by brute force) and covers every layer once', () => {
    let seed = 7;
    const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    for (let round = 0; round < 40; round++) {
      const n = 2 + Math.floor(rnd() * 9);
      const s = 1 + Math.floor(rnd() * Math.min(n, 4));
      const w = Array.from({ length: n }, () => Math.floor(rnd() * 1000));
      const p = planStages(n, s, w);
      expect(p.stages).toHaveLength(s);
      expect(p.stages[0].firstLayer).toBe(0);
      expect(p.stages.at(-1)?.endLayer).toBe(n);
      for (let i = 1; i < s; i++) expect(p.stages[i].firstLayer).toBe(p.stages[i - 1].endLayer);
      expect(p.stages.every((st) => st.layers >= 1)).toBe(true);
      const brute = (from: number, k: number): number => {
        if (k === 1) return w.slice(from).reduce((a, b) => a + b, 0);
        let m = Infinity;
        for (let e = from + 1; e <= n - (k - 1); e++) m = Math.min(m, Math.max(w.slice(from, e).reduce((a, b) => a + b, 0), brute(e, k - 1)));
        return m;
      };
      expect(p.maxStageBytes).toBe(brute(0, s));
    }
  });

  it('balances zero weights by layer count', () => {
    expect(planStages(4, 2, [0, 0, 0, 0]).stages.map((s) => [s.layers, s.bytes])).toEqual([
      [2, 0],
      [2, 0],
    ]);
  });

  it('validates its arguments', () => {
    expect(() => planStages(4, 0)).toThrow(StagePlanError);
    expect(() => planStages(4, 5)).toThrow(/exceeds numLayers/);
    expect(() => planStages(0, 1)).toThrow(/numLayers/);
    expect(() => planStages(4, 1.5)).toThrow(/numStages/);
    expect(() => planStages(3, 2, [1, 2])).toThrow(/2 entries for 3 layers/);
    expect(() => planStages(2, 2, [1, NaN])).toThrow(/layerBytes\[1\]/);
    expect(() => planStages(2, 2, [1, -1])).toThrow(/layerBytes\[1\]/);
  });

  it('maps layers to stages', () => {
    const p = planStages(10, 3);
    expect([0, 3, 4, 6, 7, 9].map((l) => stageOfLayer(p, l))).toEqual([0, 0, 1, 1, 2, 2]);
    expect(() => stageOfLayer(p, 10)).toThrow(/outside 0..9/);
  });
});

describe('planStages: per-stage capacities and fixed bytes', () => {
  it('gives a stage with a smaller capacity fewer layers', () => {
    const p = planStages(8, 2, undefined, { capacity: [1, 3] });
    expect(p.stages.map((s) => s.layers)).toEqual([2, 6]);
    expect(p.maxLoad).toBe(2);
  });

  it('counts a stage\'s fixed bytes (the embedding on stage 0) against it', () => {
    const even = planStages(8, 2);
    const p = planStages(8, 2, undefined, { fixed: [2, 0] });
    expect(even.stages.map((s) => s.layers)).toEqual([4, 4]);
    expect(p.stages.map((s) => s.layers)).toEqual([3, 5]);
    expect(p.maxLoad).toBe(5);
  });

  it('reports a load above 1 when the stages cannot fit their capacities', () => {
    const p = planStages(4, 2, [3, 3, 3, 3], { capacity: [5, 5] });
    expect(p.maxLoad).toBeCloseTo(6 / 5);
    expect(planStages(4, 2, [3, 3, 3, 3], { capacity: [6, 6] }).maxLoad).toBe(1);
  });

  it('without capacities it is the byte-balanced split', () => {
    const bytes = [1, 1, 1, 1, 1, 1, 1, 3];
    expect(planStages(8, 2, bytes, { capacity: [7, 7], fixed: [0, 0] }).stages).toEqual(planStages(8, 2, bytes).stages);
  });

  it('rejects capacities and fixed bytes of the wrong length or value', () => {
    expect(() => planStages(4, 2, undefined, { capacity: [1] })).toThrow('capacity has 1 entries for 2 stages');
    expect(() => planStages(4, 2, undefined, { capacity: [1, 0] })).toThrow('capacity[1] = 0 is not a positive number');
    expect(() => planStages(4, 2, undefined, { fixed: [1, -1] })).toThrow('fixed[1] = -1 is not a non-negative number');
    expect(() => planStages(4, 2, undefined, { capacity: [1, Number.NaN] })).toThrow(StagePlanError);
  });
});
