import os from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildNative, HOST_BASE, hasGxx, runProcess } from './native-build.js';

// The host MLP math (native/host/host_mlp.cc) without CUDA or the addon: test/native/host_mlp_test.cc
// is compiled here with g++ and checks every vector path this CPU has (scalar, AVX2, AVX-512)
// against a float64 reference, with the error bound and its reason stated in that file. Skipped
// where there is no g++.

const onX86 = process.arch === 'x64' || process.arch === 'ia32';

interface CaseLine {
  case: string;
  isa: string;
  threads: number;
  rows: number;
  hidden: number;
  inter: number;
  boundUsed: number;
  normRelErr: number;
  ok: boolean;
}
interface Summary {
  summary: true;
  cases: number;
  failures: number;
  isas: string[];
  allocsDuringCalls: number;
  repeatMismatches: number;
  /** Cases where the 4-thread pool's y differs from the 1-thread pool's (bitwise). */
  threadMismatches: number;
  /** The default pool before the program reconfigures it. */
  initial: { threads: number; isa: string; pinned: boolean };
}

/** Runs the test program with extra environment; returns its case lines and summary. */
async function runProgram(exe: string, env: Record<string, string>): Promise<{ cases: CaseLine[]; summary: Summary; failures: string[] }> {
  const r = await runProcess(exe, [], { env: { ...process.env, ...env }, timeoutMs: 120_000 });
  const lines = r.stdout
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  const summary = lines.find((l) => l.summary) as Summary | undefined;
  if (!summary) throw new Error(`no summary from host_mlp_test (status ${r.status}, signal ${r.signal}): ${r.stderr}`);
  return {
    cases: lines.filter((l) => 'case' in l) as unknown as CaseLine[],
    summary,
    failures: lines.filter((l) => 'fail' in l).map((l) => String(l.fail)),
  };
}

describe.skipIf(!hasGxx)('host MLP math (native/host/host_mlp.cc, g++, no CUDA)', () => {
  let exe = '';
  let dispose = () => {};

  beforeAll(async () => {
    ({ exe, dispose } = await buildNative('host_mlp_test', ['-pthread', '-DNERVA_HOST_MLP_NO_CUDA', 'test/native/host_mlp_test.cc', 'native/host/host_mlp.cc', ...HOST_BASE]));
  }, 120_000);
  afterAll(() => dispose());

  it('matches the float64 reference on every ISA path, 1 and 4 threads, odd sizes, rows 1/3/8/11, c = 0', async () => {
    const { cases, summary, failures } = await runProgram(exe, {});
    expect(failures).toEqual([]);
    expect(summary.failures).toBe(0);
    expect(summary.isas[0]).toBe('scalar');
    if (onX86) expect(summary.isas).toContain('avx2'); // every x86-64 CI machine of this decade
    for (const isa of summary.isas) {
      const mine = cases.filter((c) => c.isa === isa);
      // 8 shapes x rows {1, 3, 8} + one of 11 rows, at 1 and 4 threads
      expect(mine).toHaveLength(2 * 25);
      expect(new Set(mine.map((c) => c.rows))).toEqual(new Set([1, 3, 8, 11]));
      expect(mine.some((c) => c.inter === 0)).toBe(true);
      expect(mine.every((c) => c.ok && c.boundUsed <= 1)).toBe(true);
    }
    expect(summary.allocsDuringCalls).toBe(0);
    expect(summary.repeatMismatches).toBe(0);
    expect(summary.threadMismatches).toBe(0);
  });

  it('gives the same results when idle workers sleep at once (NERVA_HOST_SPIN_US=0)', async () => {
    const { summary, failures } = await runProgram(exe, { NERVA_HOST_SPIN_US: '0' });
    expect(failures).toEqual([]);
    expect(summary.failures).toBe(0);
  });

  it('sizes the default pool from NERVA_HOST_THREADS, caps its ISA with NERVA_HOST_ISA, pins with NERVA_HOST_PIN', async () => {
    const dflt = (await runProgram(exe, {})).summary;
    // Three CPUs are left to the channel server, the host-function thread and the thread that waits on the GPU (host_pool.cc defaultThreads).
    expect(dflt.initial.threads).toBe(Math.max(1, (os.availableParallelism?.() ?? os.cpus().length) - 3));
    expect(dflt.initial.isa).toBe(dflt.isas[dflt.isas.length - 1]); // the best path by default
    expect(dflt.initial.pinned).toBe(false);
    const capped = (await runProgram(exe, { NERVA_HOST_ISA: 'avx2', NERVA_HOST_THREADS: '3', NERVA_HOST_PIN: '1' })).summary;
    expect(capped.failures).toBe(0);
    expect(capped.initial).toEqual({ threads: 3, isa: capped.isas.includes('avx2') ? 'avx2' : 'scalar', pinned: true });
    expect((await runProgram(exe, { NERVA_HOST_ISA: 'scalar' })).summary.initial.isa).toBe('scalar');
  });
});
