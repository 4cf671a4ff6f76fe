import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildNative, HOST_BASE, hasGxx, runProcess } from './native-build.js';

// The host pool (native/host/host_pool.cc) under stress, without CUDA: test/native/host_pool_test.cc
// runs many back-to-back two-phase calls on a pool larger than this machine's CPUs whose idle
// workers sleep at once, so workers often wake after their call ended. Each call must run each
// task exactly once, keep the phase barrier, and return only when every task is done. Skipped
// where there is no g++.


interface Result {
  calls: number;
  threads: number;
  missing: number;
  duplicated: number;
  barrierViolations: number;
  badThread: number;
  ok: boolean;
}

describe.skipIf(!hasGxx)('host pool (native/host/host_pool.cc, g++, no CUDA)', () => {
  let exe = '';
  let dispose = () => {};
  beforeAll(async () => {
    ({ exe, dispose } = await buildNative('host_pool_test', ['-pthread', 'test/native/host_pool_test.cc', ...HOST_BASE]));
  }, 120_000);
  afterAll(() => dispose());

  const cases: Array<[threads: number, spinUs: number]> = [
    [8, 0],
    [3, 0],
    [3, 5],
    [2, 100],
  ];
  for (const [threads, spinUs] of cases) {
    it(`${threads} threads, workers spinning ${spinUs} us: every task once per call, barrier kept`, async () => {
      const r = await runProcess(exe, ['20000'], {
        env: { ...process.env, NERVA_HOST_THREADS: String(threads), NERVA_HOST_SPIN_US: String(spinUs) },
        timeoutMs: 120_000,
      });
      const line = r.stdout.split('\n').find((l) => l.startsWith('{'));
      expect(line, `no result (status ${r.status}, signal ${r.signal}): ${r.stderr}`).toBeDefined();
      const res = JSON.parse(line!) as Result;
      expect(res.threads).toBe(threads);
      expect(res.calls).toBe(20000);
      expect({ missing: res.missing, duplicated: res.duplicated, barrierViolations: res.barrierViolations, badThread: res.badThread }).toEqual({
        missing: 0,
        duplicated: 0,
        barrierViolations: 0,
        badThread: 0,
      });
      expect(r.status).toBe(0);
    }, 120_000);
  }
});
