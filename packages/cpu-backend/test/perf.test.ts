import { describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/index.js';
import { randn, rng, upload, zeros } from './helpers.js';

describe('matmul speed', () => {
  it('runs a one-row 256 -> 4096 projection in a few milliseconds', () => {
    const be = new CpuBackend();
    const r = rng(9);
    const inDim = 256;
    const outDim = 4096;
    const args = { x: upload(be, randn(r, inDim)), weight: upload(be, randn(r, inDim * outDim)), out: zeros(be, outDim), rows: 1, inDim, outDim };
    for (let i = 0; i < 30; i++) be.run('matmul', args); // JIT warm-up
    const times: number[] = [];
    for (let i = 0; i < 31; i++) {
      const t = performance.now();
      be.run('matmul', args);
      times.push(performance.now() - t);
    }
    times.sort((a, b) => a - b);
    // The target is well under 2 ms on an idle core (about 0.8 ms measured); the bound is loose
    // because CI shares two cores, and is there to catch an order-of-magnitude regression.
    expect(times[15]).toBeLessThan(8);
  });
});
