import { OP_NAMES } from '@nerva/core';
import { runConformance } from '@nerva/core/conformance';
import { describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/index.js';

// One test an op, so a failure names its op. The model-sized shapes of every op took ~45 s
// together on CI's two cores, decoder_layers ~30 s of it alone, and CI runs another package's
// tests beside them: a limit of three minutes a test, not the package's one (a limit on time,
// not a speed target: none of these asserts a speed).
describe('conformance: CpuBackend against a second CpuBackend', () => {
  it.each(OP_NAMES.map((op) => [op]))('%s: every case passes with no leaks (small and large shapes)', async (op) => {
    const be = new CpuBackend({ name: 'cpu-under-test' });
    const ref = new CpuBackend({ name: 'cpu-reference' });
    const report = await runConformance(be, ref, { sizes: 'large', ops: [op] });
    const failures = report.results.filter((r) => !r.ok).map((r) => `${r.op}/${r.name}: ${r.error}`);
    expect(failures).toEqual([]);
    expect(report.backend).toBe('cpu-under-test');
    expect(report.results.length).toBeGreaterThan(0);
    expect(report.failed).toBe(0);
    expect(report.passed).toBe(report.results.length);
    expect(new Set(report.results.map((r) => r.op))).toEqual(new Set([op]));
    for (const r of report.results) {
      expect(r.leakedBuffers).toBe(0);
      // Two instances of the same deterministic backend agree bit for bit.
      expect(r.maxAbsErr).toBe(0);
    }
    expect(be.stats().liveBuffers).toBe(0);
    expect(ref.stats().liveBuffers).toBe(0);
  }, 180_000);
});

describe('bf16 numerics', () => {
  it('conformance compares like with like: a bf16 backend against an exact reference is refused', async () => {
    const be = new CpuBackend({ numerics: 'bf16' });
    const ref = new CpuBackend();
    await expect(runConformance(be, ref, { ops: ['add'] })).rejects.toThrow(/numerics 'bf16' but the reference has 'exact'/);
    expect(be.capabilities.precision.compute).toBe('bf16');
    expect(ref.capabilities.numerics).toBe('exact');
  });

  it('passes the suite against a bf16 reference, and rounds its stores to bf16 where exact keeps float32', async () => {
    const be = new CpuBackend({ numerics: 'bf16' });
    const ex = new CpuBackend();
    const report = await runConformance(be, new CpuBackend({ numerics: 'bf16' }));
    expect(report.failed).toBe(0);
    const lowBits = (v: number) => new Uint32Array(new Float32Array([v]).buffer)[0] & 0xffff;
    const x = Float32Array.from({ length: 2 * 64 }, (_, i) => Math.sin(i * 0.37) * 3);
    const w = Float32Array.from({ length: 64 }, (_, i) => 1 + 0.01 * i);
    const outs: Float32Array[] = [];
    for (const b of [be, ex]) {
      const xb = b.alloc({ dtype: 'f32', length: x.length });
      const wb = b.alloc({ dtype: 'bf16', length: w.length });
      const ob = b.alloc({ dtype: 'f32', length: x.length });
      b.write(xb, x);
      b.write(wb, w);
      b.run('rmsnorm', { x: xb, weight: wb, out: ob, rows: 2, dim: 64, eps: 1e-6 });
      outs.push(b.read(ob) as Float32Array);
      for (const h of [xb, wb, ob]) b.free(h);
    }
    const [got, exact] = outs;
    expect(got.every((v) => lowBits(v) === 0)).toBe(true);
    expect(exact.some((v) => lowBits(v) !== 0)).toBe(true);
    // R(R(x * inv) * w): two roundings of 2^-9 relative each at most.
    for (let i = 0; i < got.length; i++) expect(Math.abs(got[i] - exact[i])).toBeLessThanOrEqual(2 * 2 ** -8 * Math.abs(exact[i]));
  });
});
