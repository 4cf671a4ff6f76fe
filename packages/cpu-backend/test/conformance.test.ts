import { OP_NAMES, runConformance } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/index.js';

describe('conformance: CpuBackend against a second CpuBackend', () => {
  it('passes every case of every op with no leaks (small and large shapes)', async () => {
    const be = new CpuBackend({ name: 'cpu-under-test' });
    const ref = new CpuBackend({ name: 'cpu-reference' });
    const report = await runConformance(be, ref, { sizes: 'large' });
    const failures = report.results.filter((r) => !r.ok).map((r) => `${r.op}/${r.name}: ${r.error}`);
    expect(failures).toEqual([]);
    expect(report.backend).toBe('cpu-under-test');
    expect(report.failed).toBe(0);
    expect(report.passed).toBe(report.results.length);
    expect(new Set(report.results.map((r) => r.op))).toEqual(new Set(OP_NAMES));
    for (const r of report.results) {
      expect(r.leakedBuffers).toBe(0);
      // Two instances of the same deterministic backend agree bit for bit.
      expect(r.maxAbsErr).toBe(0);
    }
    expect(be.stats().liveBuffers).toBe(0);
    expect(ref.stats().liveBuffers).toBe(0);
  }, 60_000);
});
