import { describe, expect, it } from 'vitest';
import { summarizeVitest, type VitestJson } from '../gpu/vitest_report.js';

// run.sh's vitest phase passes only with tests run, none failed and none skipped; a file that
// failed outside its tests (an import, a hook) counts too.
const file = (name: string, status: string, tests: Array<[string, string]>, message = ''): VitestJson['testResults'][number] => ({
  name: `/repo/${name}`,
  status,
  message,
  assertionResults: tests.map(([fullName, s]) => ({ fullName, status: s, failureMessages: s === 'failed' ? [`\u001b[31mError: ${fullName} broke\u001b[39m\n    at x`] : [] })),
});

describe('summarizeVitest', () => {
  it('is ok with every test passed', () => {
    const s = summarizeVitest({ testResults: [file('a.test.ts', 'passed', [['a one', 'passed'], ['a two', 'passed']])] }, '/repo');
    expect(s).toMatchObject({ ok: true, files: 1, tests: 2, passed: 2, failed: 0, skipped: 0, failures: [], fileErrors: [] });
  });

  it('is not ok with a skipped test, and names it', () => {
    const s = summarizeVitest({ testResults: [file('a.test.ts', 'passed', [['a one', 'passed'], ['a gpu', 'skipped']])] }, '/repo');
    expect(s).toMatchObject({ ok: false, passed: 1, skipped: 1, skippedTests: [{ file: 'a.test.ts', test: 'a gpu' }] });
  });

  it('is not ok with a failed test, and keeps its message without colour codes', () => {
    const s = summarizeVitest({ testResults: [file('b.test.ts', 'failed', [['b one', 'failed']])] }, '/repo');
    expect(s.ok).toBe(false);
    expect(s.failures).toEqual([{ file: 'b.test.ts', test: 'b one', message: 'Error: b one broke\n    at x' }]);
  });

  it('is not ok when a file fails outside its tests, or nothing ran', () => {
    const s = summarizeVitest({ testResults: [file('c.test.ts', 'failed', [], 'Cannot find module x')] }, '/repo');
    expect(s).toMatchObject({ ok: false, tests: 0, fileErrors: [{ file: 'c.test.ts', message: 'Cannot find module x' }] });
    expect(summarizeVitest({ testResults: [] }).ok).toBe(false);
  });
});
