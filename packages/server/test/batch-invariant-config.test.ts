import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { checkFlags, loadConfigFile, mergeConfig } from '../src/config.js';
import { ConfigError } from '../src/errors.js';
import { FIXTURES, lastJson as last, nerva as nervaRun } from './cli-helpers.js';

const MODEL = join(FIXTURES, 'models/tiny-random-qwen3');
const nerva = (args: string[]) => nervaRun(args, { NERVA_BATCH_INVARIANT: '' });
const tmp = mkdtempSync(join(tmpdir(), 'nerva-batchinv-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe('batch_invariant / --batch-invariant', () => {
  it('the TOML key takes true or false, a flag overrides it, anything else is an error naming the key', async () => {
    const p = join(tmp, 'ok.toml');
    writeFileSync(p, 'batch_invariant = true\n');
    expect(await loadConfigFile(p)).toEqual({ batchInvariant: true });
    expect(mergeConfig(await loadConfigFile(p), checkFlags({})).batchInvariant).toBe(true);
    writeFileSync(p, 'batch_invariant = false\n');
    expect(mergeConfig(await loadConfigFile(p), checkFlags({ batchInvariant: true })).batchInvariant).toBe(true);
    for (const bad of ['"yes"', '1']) {
      const q = join(tmp, 'bad.toml');
      writeFileSync(q, `batch_invariant = ${bad}\n`);
      const err = await loadConfigFile(q).catch((e: unknown) => e);
      expect(err, bad).toBeInstanceOf(ConfigError);
      expect((err as ConfigError).key).toBe('batch_invariant');
      expect((err as Error).message).toMatch(/"batch_invariant" must be true or false/);
    }
  });

  it('nerva run --batch-invariant on the CPU backend: accepted, the same tokens, reported as not promised by the backend', async () => {
    const args = ['run', '--model', MODEL, '--prompt-ids', '1,2,3,4,5', '--max-tokens', '4', '--temperature', '0', '--backend', 'cpu', '--json'];
    const plain = last((await nerva(args)).stdout);
    const inv = last((await nerva([...args, '--batch-invariant'])).stdout);
    expect(plain.token_ids).toHaveLength(4);
    expect(inv.token_ids).toEqual(plain.token_ids);
    // The CPU backend ignores the option (it makes no batch-invariance promise); CUDA reports true.
    expect(plain.batch_invariant).toBe(false);
    expect(inv.batch_invariant).toBe(false);
  });
});
