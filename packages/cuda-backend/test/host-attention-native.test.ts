import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildNative, hasGxx } from './native-build.js';

// The host attention math (native/host_attention.cc: tiered KV's warm partial, computed by the
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
  /** The shared host pool's spin before sleeping (NERVA_HOST_SPIN_US, or its deprecated alias NERVA_HOST_ATTN_SPIN_US). */
  spinUs: number;
}

function runProgram(exe: string, env: Record<string, string>): { cases: CaseLine[]; summary: Summary; failures: string[] } {
  const r = spawnSync(exe, [], { encoding: 'utf8', env: { ...process.env, ...env }, timeout: 120_000 });
  const lines = r.stdout.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Record<string, unknown>);
  const summary = lines.find((l) => l.summary) as Summary | undefined;
  if (!summary) throw new Error(`no summary from host_attention_test (status ${r.status}, signal ${r.signal}): ${r.stderr}`);
  return {
    cases: lines.filter((l) => 'case' in l) as unknown as CaseLine[],
    summary,
    failures: lines.filter((l) => 'fail' in l).map((l) => String(l.fail)),
  };
}

describe.skipIf(!hasGxx)('host attention math (native/host_attention.cc, g++, no CUDA)', () => {
  let exe = '';
  let dispose = () => {};

  beforeAll(() => {
    ({ exe, dispose } = buildNative('host_attention_test', ['-pthread', '-DNERVA_HOST_ATTN_NO_CUDA', '-Inative', 'test/native/host_attention_test.cc', 'native/host_attention.cc', 'native/host_pool.cc']));
  }, 120_000);
  afterAll(() => dispose());

  it('matches the float64 reference (dtypes, GQA 1/4/12, windows, missing blocks), thread-count independent, allocation-free', () => {
    const { cases, summary, failures } = runProgram(exe, {});
    expect(failures).toEqual([]);
    expect(summary.failures).toBe(0);
    expect(cases).toHaveLength(14); // 7 shapes at 1 and 4 threads
    expect(cases.every((c) => c.boundUsed <= 1 && c.keys > 0)).toBe(true);
    expect(summary.allocsDuringCalls).toBe(0);
    expect(summary.threadMismatches).toBe(0);
  });

  it('gives the same results when idle workers sleep at once (NERVA_HOST_SPIN_US=0) with a pool of 3 (NERVA_HOST_THREADS)', () => {
    const { summary, failures } = runProgram(exe, { NERVA_HOST_SPIN_US: '0', NERVA_HOST_THREADS: '3' });
    expect(failures).toEqual([]);
    expect(summary.failures).toBe(0);
    expect(summary.spinUs).toBe(0);
  });

  it('reads NERVA_HOST_ATTN_SPIN_US as a deprecated alias of NERVA_HOST_SPIN_US (the pool is shared with the host MLP)', () => {
    const env = { NERVA_HOST_SPIN_US: '', NERVA_HOST_ATTN_SPIN_US: '' };
    expect(runProgram(exe, env).summary.spinUs).toBe(1000); // the default (host_pool.cc spinNs)
    const alias = runProgram(exe, { ...env, NERVA_HOST_ATTN_SPIN_US: '0' });
    expect(alias.failures).toEqual([]);
    expect(alias.summary.spinUs).toBe(0);
    expect(runProgram(exe, { NERVA_HOST_SPIN_US: '50', NERVA_HOST_ATTN_SPIN_US: '0' }).summary.spinUs).toBe(50);
  });
});
