import { describe, expect, it } from 'vitest';
import { NervaError, planStages, StagePlanError, stageOfLayer } from '../src/index.js';

describe('planStages (core)', () => {
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
    expect(() => planStages(4, 1.5)).toThrow(NervaError);
    expect(() => planStages(4, 1.5)).toThrow(expect.objectContaining({ code: 'STAGE_PLAN' }));
    expect(() => stageOfLayer(planStages(4, 2), 4)).toThrow(StagePlanError);
  });
});
