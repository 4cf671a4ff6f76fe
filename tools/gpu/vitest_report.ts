// run.sh's `vitest` phase: reads vitest's JSON report (`--reporter=json`) and writes the phase's
// result, $OUT/vitest.json: counts (passed, failed, skipped, todo) over the files run, each failed
// test and each file that failed outside a test (an import or a hook) with its message. ok only
// with tests run, none failed and none skipped: on the GPU machine every GPU-only file must run.
//   node vitest_report.mjs RAW.json OUT.json    (exit status 1 unless ok)
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/** The part of vitest's JSON report (jest's format) read here. */
export interface VitestJson {
  testResults: Array<{
    name: string;
    status: string;
    message?: string;
    assertionResults: Array<{ fullName: string; status: string; failureMessages?: string[] }>;
  }>;
}

/** What the phase reports. */
export interface VitestSummary {
  ok: boolean;
  files: number;
  tests: number;
  passed: number;
  failed: number;
  skipped: number;
  todo: number;
  failures: Array<{ file: string; test: string; message: string }>;
  fileErrors: Array<{ file: string; message: string }>;
  skippedTests: Array<{ file: string; test: string }>;
}

/** The first lines of a failure, without colour codes: enough to read why. */
function firstLines(text: string, lines = 4): string {
  return text.replace(/\u001b\[[0-9;]*m/g, '').split('\n').slice(0, lines).join('\n').slice(0, 600);
}

/** Counts and failures of a vitest JSON report; file paths relative to `root`. */
export function summarizeVitest(report: VitestJson, root = ''): VitestSummary {
  const s: VitestSummary = { ok: false, files: 0, tests: 0, passed: 0, failed: 0, skipped: 0, todo: 0, failures: [], fileErrors: [], skippedTests: [] };
  for (const f of report.testResults) {
    const file = root ? path.relative(root, f.name) : f.name;
    s.files++;
    for (const t of f.assertionResults) {
      s.tests++;
      if (t.status === 'passed') s.passed++;
      else if (t.status === 'failed') {
        s.failed++;
        s.failures.push({ file, test: t.fullName, message: firstLines((t.failureMessages ?? []).join('\n')) });
      } else if (t.status === 'todo') s.todo++;
      else {
        s.skipped++;
        s.skippedTests.push({ file, test: t.fullName });
      }
    }
    // A file that failed with no failed test: its import or a suite hook threw.
    if (f.status === 'failed' && !f.assertionResults.some((t) => t.status === 'failed')) {
      s.fileErrors.push({ file, message: firstLines(f.message || 'failed outside its tests') });
    }
  }
  s.ok = s.tests > 0 && s.failed === 0 && s.skipped === 0 && s.todo === 0 && s.fileErrors.length === 0;
  return s;
}

if (process.argv[1] && /vitest_report\.(mjs|ts)$/.test(process.argv[1])) {
  const [raw, out] = process.argv.slice(2);
  if (!raw || !out) throw new Error('usage: vitest_report.mjs RAW.json OUT.json');
  if (!existsSync(raw)) {
    writeFileSync(out, `${JSON.stringify({ ok: false, error: `vitest wrote no report (${raw}): see run.log` })}\n`);
    throw new Error(`vitest wrote no report (${raw})`);
  }
  const s = summarizeVitest(JSON.parse(readFileSync(raw, 'utf8')) as VitestJson, process.cwd());
  writeFileSync(out, `${JSON.stringify(s, null, 1)}\n`);
  console.log(`vitest: ${s.files} files, ${s.passed} passed, ${s.failed} failed, ${s.skipped} skipped${s.fileErrors.length ? `, ${s.fileErrors.length} files failed outside a test` : ''}${s.ok ? '' : ' (NOT ok)'}`);
  for (const f of s.failures.slice(0, 10)) console.log(`  FAIL ${f.file} > ${f.test}: ${f.message.split('\n')[0]}`);
  for (const f of s.fileErrors) console.log(`  FAIL ${f.file}: ${f.message.split('\n')[0]}`);
  process.exitCode = s.ok ? 0 : 1;
}
