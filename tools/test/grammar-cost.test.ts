import { describe, expect, it } from 'vitest';
import { decodeWindow, median, parseArgs } from '../gpu/grammar_cost_stats.js';

// grammar_cost.mjs times decode steps from the engine's step signals: a step's time is the
// interval since the step before it ended; steps with prompt tokens are not decode steps; the
// time per token is read on the steps where the whole batch decoded.
const step = (time: number, promptTokens: number, generationTokens: number) => ({ time, promptTokens, generationTokens });

describe('decodeWindow', () => {
  it('skips prefill steps, times each decode step from the previous step, and keeps full-batch steps apart', () => {
    const w = decodeWindow(
      [
        step(100, 64, 2), // prefill of both requests
        step(110, 0, 2),
        step(122, 0, 2),
        step(130, 0, 1), // one request left
        step(135, 0, 1),
      ],
      2,
    );
    expect(w).toEqual({ decodeSteps: 4, decodeTokens: 6, decodeMs: 35, stepMsP50: 9, fullSteps: 2, fullStepMsP50: 11 });
  });

  it('a prefill chunk between decode steps is no decode step, and the step after it is timed from it', () => {
    const w = decodeWindow([step(0, 32, 1), step(5, 0, 1), step(40, 32, 2), step(47, 0, 2)], 2);
    expect(w.decodeSteps).toBe(2);
    expect(w.decodeMs).toBe(12);
    expect(w.fullSteps).toBe(1);
    expect(w.fullStepMsP50).toBe(7);
  });

  it('no decode step: zeros and null medians', () => {
    expect(decodeWindow([step(0, 16, 1)], 1)).toEqual({ decodeSteps: 0, decodeTokens: 0, decodeMs: 0, stepMsP50: null, fullSteps: 0, fullStepMsP50: null });
    expect(decodeWindow([], 1).decodeSteps).toBe(0);
  });
});

describe('median', () => {
  it('of odd and even counts, unsorted', () => {
    expect(median([3, 1, 2])).toBe(2);
    expect(median([4, 1, 3, 2])).toBe(2.5);
    expect(median([])).toBeNull();
  });
});

describe('parseArgs', () => {
  it('defaults: CUDA, batch 1 and 32, temperatures 1 and 0, 64 new tokens, graphs on then off', () => {
    expect(parseArgs(['/m'])).toEqual({ model: '/m', backend: 'cuda', batches: [1, 32], temperatures: [1, 0], newTokens: 64, promptLen: 32, repeats: 3, graphs: [true, false], grammarThreads: undefined });
  });

  it('takes every flag', () => {
    const a = parseArgs(['--backend', 'cpu', '/m', '--batches', '1,4', '--temperatures', '0', '--new-tokens', '8', '--prompt-len', '5', '--repeats', '1', '--graphs', 'off', '--grammar-threads', '0']);
    expect(a).toEqual({ model: '/m', backend: 'cpu', batches: [1, 4], temperatures: [0], newTokens: 8, promptLen: 5, repeats: 1, graphs: [false], grammarThreads: 0 });
  });

  it('refuses bad input, naming the flag', () => {
    expect(() => parseArgs([])).toThrow(/usage: grammar_cost/);
    expect(() => parseArgs(['/m', '--backend', 'metal'])).toThrow(/--backend takes cuda or cpu, got metal/);
    expect(() => parseArgs(['/m', '--batches', '1,0'])).toThrow(/--batches takes a positive integer, got 0/);
    expect(() => parseArgs(['/m', '--batches'])).toThrow(/--batches takes a positive integer/);
    expect(() => parseArgs(['/m', '--temperatures', '1,-1'])).toThrow(/--temperatures takes non-negative numbers, got -1/);
    expect(() => parseArgs(['/m', '--repeats', '1.5'])).toThrow(/--repeats takes a positive integer, got 1.5/);
    expect(() => parseArgs(['/m', '--bogus'])).toThrow(/unknown flag --bogus/);
    expect(() => parseArgs(['/m', '--graphs', 'on,maybe'])).toThrow(/--graphs takes on, off or both \(on,off\), got maybe/);
    expect(() => parseArgs(['/m', '--grammar-threads', '-1'])).toThrow(/--grammar-threads takes a non-negative integer, got -1/);
    expect(() => parseArgs(['/m', '--grammar-threads'])).toThrow(/--grammar-threads takes a non-negative integer, got undefined/);
    expect(() => parseArgs(['/m', '/n'])).toThrow(/one model folder, got \/m and \/n/);
  });
});
