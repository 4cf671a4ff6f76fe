import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { forkProbe } from '../src/probes/fork.js';

let root = dirname(fileURLToPath(import.meta.url));
while (!existsSync(join(root, 'pnpm-workspace.yaml'))) root = dirname(root);
const TINY = join(root, '../shared/fixtures/models/tiny-random-qwen3');
const CLI = join(root, 'packages/bench/dist/cli.js');
const run = promisify(execFile);

describe('nerva-bench fork', () => {
  it('n sampled forks of one prompt share its full blocks and equal the same requests run one by one', async () => {
    const r = await forkProbe({ model: TINY, backend: 'cpu', n: 5, promptLen: 37, newTokens: 10, temperature: 0.8, seed: 3 });
    expect(r).toMatchObject({ probe: 'fork', backend: 'cpu', n: 5, prompt_len: 37, tokens_identical: true, mismatches: 0, hot_path_allocations: 0 });
    // 37 tokens with blocks of 16: two full blocks, found in the prefix cache by every fork.
    expect(r.shared_prompt_blocks).toBe(2);
    expect(r.prefix_hit_tokens).toBe(5 * 32);
    expect(r.cached_prompt_tokens).toBe(5 * 32);
    // Different seeds: the forks really sample (not five copies of one sequence).
    expect(r.distinct_fork_outputs as number).toBeGreaterThan(1);
    for (const k of ['sequential_decode_s', 'fork_decode_s', 'decode_speedup', 'fork_decode_tok_s']) expect(r[k] as number, k).toBeGreaterThan(0);
    // Every block but the null block is free again.
    expect(r.kv_blocks_free_after).toBe((r.kv_blocks_total as number) - 1);
  }, 120_000);

  it('greedy forks are identical to each other and to the sequential runs', async () => {
    const r = await forkProbe({ model: TINY, backend: 'cpu', n: 3, promptLen: 20, newTokens: 6, temperature: 0, seed: 0 });
    expect(r).toMatchObject({ tokens_identical: true, distinct_fork_outputs: 1 });
  }, 60_000);

  it('bad options are one clear error each', async () => {
    await expect(forkProbe({ model: TINY, backend: 'cpu', n: 0, promptLen: 8, newTokens: 2, temperature: 0, seed: 0 })).rejects.toThrow(/--n must be a positive integer/);
    for (const [args, msg] of [
      [['--n', '0'], '--n'],
      [['--temperature', '-1'], '--temperature must be a number >= 0'],
      [['--seed', 'x'], '--seed must be a non-negative integer'],
    ] as [string[], string][]) {
      const err = await run(process.execPath, [CLI, 'fork', '--model', TINY, '--backend', 'cpu', ...args]).then(
        () => undefined,
        (e: { code: number; stderr: string }) => e,
      );
      expect(err?.code, args.join(' ')).not.toBe(0);
      expect(err?.stderr, args.join(' ')).toContain(msg);
    }
  });
});
