import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildNative, HOST_BASE, hasGxx, runProcess } from './native-build.js';

// The host attention math (native/host/host_attention.cc: tiered KV's warm partial, computed by the
// CPU where the pages lie) without CUDA or the addon: test/native/host_attention_test.cc is
// compiled with g++ and checks f32/bf16/f16 caches, GQA, windows and missing blocks against a
// float64 reference, with its error bound stated in that file. Skipped where there is no g++.


interface CaseLine { case: string; threads: number; boundUsed: number; keys: number }
interface Summary {
  summary: true;
  cases: number;
  failures: number;
  allocsDuringCalls: number;
  threadMismatches: number;
  threads: number;
  /** The shared host pool's spin before sleeping (NERVA_HOST_SPIN_US). */
  spinUs: number;
}

async function runProgram(exe: string, env: Record<string, string>): Promise<{ cases: CaseLine[]; summary: Summary; failures: string[] }> {
  const r = await runProcess(exe, [], { env: { ...process.env, ...env }, timeoutMs: 120_000 });
  const lines = r.stdout.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Record<string, unknown>);
  const summary = lines.find((l) => l.summary) as Summary | undefined;
  if (!summary) throw new Error(`no summary from host_attention_test (status ${r.status}, signal ${r.signal}): ${r.stderr}`);
  return {
    cases: lines.filter((l) => 'case' in l) as unknown as CaseLine[],
    summary,
    failures: lines.filter((l) => 'fail' in l).map((l) => String(l.fail)),
  };
}

describe.skipIf(!hasGxx)('host attention math (native/host/host_attention.cc, g++, no CUDA)', () => {
  let exe = '';
  let dispose = () => {};

  // The build compiles the span kernels at three ISA levels with -O3: past two minutes on a busy
  // two-core machine.
  beforeAll(async () => {
    ({ exe, dispose } = await buildNative('host_attention_test', ['-pthread', '-DNERVA_HOST_ATTN_NO_CUDA', 'test/native/host_attention_test.cc', 'native/host/host_attention.cc', ...HOST_BASE]));
  }, 300_000);
  afterAll(() => dispose());

  it('matches the float64 reference (dtypes, GQA 1/4/12, windows, missing blocks), thread-count independent, allocation-free', async () => {
    const { cases, summary, failures } = await runProgram(exe, {});
    expect(failures).toEqual([]);
    expect(summary.failures).toBe(0);
    expect(cases).toHaveLength(14); // 7 shapes at 1 and 4 threads
    expect(cases.every((c) => c.boundUsed <= 1 && c.keys > 0)).toBe(true);
    expect(summary.allocsDuringCalls).toBe(0);
    expect(summary.threadMismatches).toBe(0);
  });

  it('gives the same results when idle workers sleep at once (NERVA_HOST_SPIN_US=0) with a pool of 3 (NERVA_HOST_THREADS)', async () => {
    const { summary, failures } = await runProgram(exe, { NERVA_HOST_SPIN_US: '0', NERVA_HOST_THREADS: '3' });
    expect(failures).toEqual([]);
    expect(summary.failures).toBe(0);
    expect(summary.spinUs).toBe(0);
  });

  it('spins NERVA_HOST_SPIN_US before sleeping, 1000 by default, and ignores an invalid value (the pool is shared with the host MLP)', async () => {
    expect((await runProgram(exe, { NERVA_HOST_SPIN_US: '' })).summary.spinUs).toBe(1000); // the knob's default
    expect((await runProgram(exe, { NERVA_HOST_SPIN_US: 'x' })).summary.spinUs).toBe(1000); // validateKnobs reports it
    expect((await runProgram(exe, { NERVA_HOST_SPIN_US: '50' })).summary.spinUs).toBe(50);
  }, 60_000);
});
