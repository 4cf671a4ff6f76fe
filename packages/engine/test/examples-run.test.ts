import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { quickstart } from '../examples/quickstart.js';
import { DEFAULT_MODEL, ROOT } from './fixtures.js';

const run = promisify(execFile);

/** The README tells users to run the examples with `pnpm example NAME` (tsx under the hood; pnpm on PATH as in CI). */
describe('pnpm example', () => {
  it('runs the README quickstart as shown and prints what it returns', async () => {
    const { stdout } = await run('pnpm', ['--silent', 'example', 'quickstart'], { cwd: ROOT });
    expect(stdout).toBe((await quickstart(DEFAULT_MODEL)) + '\n');
  });

  it('runs the shared-model example on a model folder relative to the caller, and refuses an unknown name', async () => {
    const { stdout } = await run('pnpm', ['--silent', 'example', 'shared-model', '../models/tiny-shakespeare-qwen3'], { cwd: `${ROOT}/docs` });
    const j = JSON.parse(stdout);
    expect(j.batch).toHaveLength(3);
    expect(j.chat.length).toBeGreaterThan(0);
    const err = await run('pnpm', ['--silent', 'example', 'nope'], { cwd: ROOT }).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e,
    );
    expect(err?.code).toBe(2);
    expect(err?.stderr).toContain('usage: pnpm example quickstart|shared-model [MODEL]');
  });
});
