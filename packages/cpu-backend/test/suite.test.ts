/**
 * The conformance suite must catch what it claims to catch: each backend here is the CPU backend
 * with one deliberate defect, and the suite has to fail exactly the affected cases.
 */
import type { BackendCapabilities, OpArgs, OpName, StreamHandle } from '@nerva/core';
import { conformanceCases, runConformance } from '@nerva/core/conformance';
import { describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/index.js';

type Fault = (be: CpuBackend, op: OpName, args: Record<string, any>, run: () => void) => void;

/** A CPU backend whose `run` goes through `fault` (which decides whether and how to run the op). */
class FaultyBackend extends CpuBackend {
  override readonly capabilities: BackendCapabilities;
  constructor(
    private readonly fault: Fault,
    caps: Partial<BackendCapabilities> = {},
  ) {
    super({ name: 'faulty' });
    // A field redeclared in a subclass is reset after super(), so take the base capabilities from a fresh instance.
    this.capabilities = { ...new CpuBackend().capabilities, ...caps };
  }
  override run<K extends OpName>(op: K, args: OpArgs<K>, stream?: StreamHandle): void {
    this.fault(this, op, args as Record<string, any>, () => super.run(op, args, stream));
  }
}

async function failedOps(be: CpuBackend, ops?: OpName[]) {
  const report = await runConformance(be, new CpuBackend(), ops ? { ops } : {});
  return { report, failed: new Set(report.results.filter((r) => !r.ok).map((r) => r.op)) };
}

describe('conformance suite sensitivity', () => {
  it('lists cases for every op, deterministic per seed, with unique names', () => {
    const cases = conformanceCases();
    const names = cases.map((c) => `${c.op}/${c.name}`);
    expect(new Set(names).size).toBe(names.length);
    expect(conformanceCases({ sizes: 'large' }).length).toBeGreaterThan(cases.length);
    expect(conformanceCases({ ops: ['rope', 'sample'] }).every((c) => c.op === 'rope' || c.op === 'sample')).toBe(true);
  });

  it('fails a matmul that is off by 1e-3 on one element, and only matmul', async () => {
    const fault: Fault = (be, op, a, run) => {
      run();
      if (op !== 'matmul') return;
      const v = be.read(a.out, 0, 1) as Float32Array;
      v[0] += 1e-3;
      be.write(a.out, v, 0);
    };
    const { report, failed } = await failedOps(new FaultyBackend(fault));
    expect([...failed]).toEqual(['matmul']);
    const bad = report.results.filter((r) => !r.ok);
    expect(bad.length).toBe(report.results.filter((r) => r.op === 'matmul').length);
    for (const r of bad) {
      expect(r.maxAbsErr).toBeGreaterThan(r.tol);
      expect(r.error).toMatch(/mismatch: out\[0\]/);
    }
  });

  it('lets the same defect pass when the backend declares a looser precision', async () => {
    const fault: Fault = (be, op, a, run) => {
      run();
      if (op !== 'matmul') return;
      const v = be.read(a.out, 0, 1) as Float32Array;
      v[0] += 1e-3;
      be.write(a.out, v, 0);
    };
    const loose = new FaultyBackend(fault, { precision: { compute: 'bf16', relTol: 1e-2 } });
    const { failed } = await failedOps(loose, ['matmul']);
    expect(failed.size).toBe(0);
  });

  it('catches an attention off by one in the causal bound and a rope off by one position', async () => {
    const shift = (be: CpuBackend, buf: any, d: number, run: () => void) => {
      const pos = be.read(buf) as Int32Array;
      be.write(buf, pos.map((p) => Math.max(0, p + d)));
      run();
      be.write(buf, pos);
    };
    const fault: Fault = (be, op, a, run) => {
      if (op === 'attention') shift(be, a.positions, -1, run);
      else if (op === 'rope') shift(be, a.positions, 1, run);
      else run();
    };
    const { report, failed } = await failedOps(new FaultyBackend(fault), ['attention', 'rope', 'matmul']);
    expect(failed).toEqual(new Set(['attention', 'rope']));
    // Every attention and rope case sees the defect (each has a row at a position > 0).
    for (const r of report.results) expect(r.ok).toBe(r.op === 'matmul');
  });

  it('catches a sampler that does not advance its counter', async () => {
    const fault: Fault = (be, op, a, run) => {
      if (op !== 'sample') return run();
      const before = be.read(a.rng);
      run();
      be.write(a.rng, before as Int32Array);
    };
    const { report } = await failedOps(new FaultyBackend(fault), ['sample']);
    expect(report.failed).toBe(report.results.length);
    for (const r of report.results) expect(r.error).toMatch(/mismatch: (out1|rng)/);
  });

  it('does not excuse an exact argmax tie broken toward the higher index', async () => {
    const fault: Fault = (be, op, a, run) => {
      run();
      if (op !== 'argmax') return;
      const logits = be.read(a.logits);
      const out = new Int32Array(a.rows);
      for (let r = 0; r < a.rows; r++) {
        let best = 0;
        for (let i = 0; i < a.vocab; i++) if (logits[r * a.vocab + i] >= logits[r * a.vocab + best]) best = i;
        out[r] = best;
      }
      be.write(a.out, out);
    };
    const { report } = await failedOps(new FaultyBackend(fault), ['argmax']);
    const tie = report.results.filter((r) => /tie/.test(r.name));
    expect(tie.length).toBeGreaterThan(0);
    for (const r of report.results) expect(r.ok).toBe(!/tie/.test(r.name));
  });

  it('reports leaks, throwing ops and missing ops as failed cases without stopping the run', async () => {
    const fault: Fault = (be, op, _a, run) => {
      if (op === 'add') be.alloc({ dtype: 'f32', length: 1, label: 'leak' });
      if (op === 'gather_rows') throw new Error('kernel exploded');
      run();
    };
    const be = new FaultyBackend(fault, { ops: ['embedding', 'add', 'gather_rows'] });
    const { report } = await failedOps(be, ['embedding', 'add', 'gather_rows', 'silu_mul']);
    for (const r of report.results) {
      if (r.op === 'embedding') expect(r.ok).toBe(true);
      if (r.op === 'add') expect(r).toMatchObject({ ok: false, leakedBuffers: 1 });
      if (r.op === 'add') expect(r.error).toMatch(/leaked 1 buffer/);
      if (r.op === 'gather_rows') expect(r.error).toMatch(/kernel exploded/);
      if (r.op === 'silu_mul') expect(r.error).toMatch(/not in the backend's capabilities.ops/);
    }
    // The gather cases freed what they had allocated before the throw.
    expect(be.stats().liveBuffers).toBe(report.results.filter((r) => r.op === 'add').length);
  });
});
