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
  it('--vs-default: the same requests one by one on the default decode path, and the speedup against it', async () => {
    const r = await forkProbe({ model: TINY, backend: 'cpu', n: 3, promptLen: 20, newTokens: 6, temperature: 0.8, seed: 3, vsDefault: true });
    expect(r.tokens_identical).toBe(true);
    const d = r.default_sequential_decode_s as number;
    expect(d).toBeGreaterThan(0);
    // 3 requests of 6 tokens on the default path. The line's seconds are rounded to the
    // millisecond (e = 0.0005 s) and these runs take a few, so the figures agree to that rounding:
    // tok/s = 18 / D and speedup = D / F, each of D and F known to within e.
    const tokS = r.default_sequential_decode_tok_s as number;
    expect(Math.abs(18 / tokS - d)).toBeLessThanOrEqual(0.0005 + 1e-9);
    const f = r.fork_decode_s as number;
    const speedup = r.decode_speedup_vs_default as number;
    expect(Math.abs(speedup * f - d)).toBeLessThanOrEqual(0.0005 * (speedup + 1) + 0.0005 * f + 1e-9);
    // Without batch invariance and not asked: no default-path runs.
    const plain = await forkProbe({ model: TINY, backend: 'cpu', n: 2, promptLen: 20, newTokens: 4, temperature: 0.8, seed: 3 });
    expect(plain).not.toHaveProperty('decode_speedup_vs_default');
  });

  it('n sampled forks of one prompt: prefilled once, full blocks shared, tokens equal to the same requests one by one', async () => {
    const r = await forkProbe({ model: TINY, backend: 'cpu', n: 5, promptLen: 37, newTokens: 10, temperature: 0.8, seed: 3 });
    expect(r).toMatchObject({ probe: 'fork', backend: 'cpu', n: 5, prompt_len: 37, new_tokens: 10, prefix_caching: false, tokens_identical: true, mismatches: 0, hot_path_allocations: 0 });
    expect(r.mismatch_details).toEqual([]);
    // The prompt was computed once for the five forks.
    expect(r.fork_prefill_tokens).toBe(37);
    // 37 tokens with blocks of 16: two full blocks, held once and read by all five forks each step.
    expect(r.block_size).toBe(16);
    expect(r.shared_prompt_blocks).toBe(2);
    expect(r.kv_shared_blocks_peak).toBe(2);
    expect(r.prefix_blocks_read_per_step).toBe(2);
    expect(r.redundant_block_reads_per_step).toBe(2 * 4);
    expect(r.decode_rows_per_step).toBe(5);
    // 2 shared + 5 forks x 1 own block (47 tokens = 3 blocks), against 5 x 3 unshared.
    expect(r.kv_blocks_used_peak).toBe(2 + 5);
    expect(r.kv_blocks_unshared).toBe(15);
    // One step prefills and samples the 5 first tokens, then 9 batched decode steps.
    expect(r.fork_steps).toBe(10);
    // Different seeds: the forks really sample (not five copies of one sequence).
    expect(r.distinct_fork_outputs as number).toBeGreaterThan(1);
    expect(r.tokens_sha256).toMatch(/^[0-9a-f]{16}$/);
    for (const k of ['sequential_decode_s', 'fork_decode_s', 'decode_speedup', 'fork_decode_tok_s', 'sequential_total_s', 'fork_total_s', 'total_speedup'])
      expect(r[k] as number, k).toBeGreaterThan(0);
    // The forks decode as one graph replay per step: a fifth of a replay per token.
    expect(r.graph_bucket).toBe(8);
    expect(r.graph_nodes as number).toBeGreaterThan(0);
    expect(r.graph_replays_per_decode_token).toBeCloseTo(0.2, 2);
    expect(r.sequential_graph_replays_per_decode_token).toBe(1);
    // The step's wall time explained: interval between decode steps >= the host's step call >=
    // the device time between the step's events (the CPU backend's time is all "device" time).
    const interval = r.fork_step_interval_ms as number, call = r.fork_step_call_ms_p50 as number, dev = r.fork_step_device_ms_p50 as number;
    expect(dev).toBeGreaterThan(0);
    expect(call).toBeGreaterThanOrEqual(dev * 0.99);
    expect(interval).toBeGreaterThan(0);
    expect(r.sequential_token_device_ms_p50 as number).toBeGreaterThan(0);
    expect(r.sequential_token_interval_ms as number).toBeGreaterThanOrEqual((r.sequential_token_device_ms_p50 as number) * 0.5);
    // Every block but the null block is free again.
    expect(r.kv_blocks_free_after).toBe((r.kv_blocks_total as number) - 1);
  }, 120_000);

  it('--no-sequential: the forks alone give the same tokens (digest) and leave the one-by-one figures null', async () => {
    const opts = { model: TINY, backend: 'cpu' as const, n: 4, promptLen: 19, newTokens: 7, temperature: 0.8, seed: 3, batchInvariant: true };
    const full = await forkProbe({ ...opts, vsDefault: true });
    const fast = await forkProbe({ ...opts, sequential: false });
    await expect(forkProbe({ ...opts, sequential: false, vsDefault: true })).rejects.toThrow(/--vs-default needs the one-by-one runs/);
    expect(full.tokens_identical).toBe(true);
    expect(fast.tokens_sha256).toBe(full.tokens_sha256);
    expect(fast.distinct_fork_outputs).toBe(full.distinct_fork_outputs);
    for (const k of ['tokens_identical', 'mismatches', 'sequential_decode_s', 'decode_speedup', 'sequential_decode_tok_s', 'sequential_token_device_ms_p50'])
      expect(fast[k], k).toBeNull();
    // The default path's one-by-one runs only come with the line's own.
    expect(full.decode_speedup_vs_default as number).toBeGreaterThan(0);
    expect(fast).not.toHaveProperty('decode_speedup_vs_default');
    expect(fast.fork_step_device_ms_p50 as number).toBeGreaterThan(0);
    expect(fast.fork_decode_tok_s as number).toBeGreaterThan(0);
  }, 120_000);

  it('greedy forks are identical to each other and to the sequential runs', async () => {
    const r = await forkProbe({ model: TINY, backend: 'cpu', n: 3, promptLen: 20, newTokens: 6, temperature: 0, seed: 0 });
    expect(r).toMatchObject({ tokens_identical: true, distinct_fork_outputs: 1, fork_prefill_tokens: 20 });
  }, 60_000);

  it('--profile: a mean decode step of the n forks and of one row, by op class; the timed runs as without it', async () => {
    const r = await forkProbe({ model: TINY, backend: 'cpu', n: 4, promptLen: 21, newTokens: 12, temperature: 0.8, seed: 5, profile: true });
    expect(r).toMatchObject({ tokens_identical: true, fork_steps: 12 });
    const p = r.profile as { fork_step: Record<string, any>; single_step: Record<string, any>; device_speedup: number };
    // 12 tokens requested, profiled runs of PROFILE_STEPS + 1 = 9: 8 decode steps each.
    expect(p.fork_step).toMatchObject({ rows: 4, steps: 8 });
    expect(p.single_step).toMatchObject({ rows: 1, steps: 8 });
    for (const step of [p.fork_step, p.single_step]) {
      expect(step.device_ms).toBeGreaterThan(0);
      expect(step.ms.attention, JSON.stringify(step.ms)).toBeGreaterThan(0);
      for (const k of ['gemm_qkv', 'gemm_o', 'gemm_gate_up', 'gemm_down', 'lm_head']) expect(step.ms[k], k).toBeGreaterThan(0);
      const sum = Object.values(step.ms as Record<string, number>).reduce((a, b) => a + b, 0);
      expect(step.op_total_ms).toBeCloseTo(sum, 2);
    }
    expect(p.device_speedup).toBeCloseTo((4 * p.single_step.device_ms) / p.fork_step.device_ms, 2);
    // Without --profile the line has no profile.
    const plain = await forkProbe({ model: TINY, backend: 'cpu', n: 2, promptLen: 9, newTokens: 3, temperature: 0, seed: 0 });
    expect(plain.profile).toBeUndefined();
  }, 120_000);

  it('the CLI prints one JSON line; bad options are one clear error each', async () => {
    const { stdout } = await run(process.execPath, [CLI, 'fork', '--model', TINY, '--backend', 'cpu', '--n', '4', '--prompt-len', '24', '--new-tokens', '5', '--temperature', '0']);
    const lines = stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0])).toMatchObject({ probe: 'fork', n: 4, prompt_len: 24, new_tokens: 5, temperature: 0, tokens_identical: true, shared_prompt_blocks: 1 });

    await expect(forkProbe({ model: TINY, backend: 'cpu', n: 0, promptLen: 8, newTokens: 2, temperature: 0, seed: 0 })).rejects.toThrow(/--n must be a positive integer/);
    for (const [args, msg] of [
      [['--n', '0'], '--n'],
      [['--temperature', '-1'], '--temperature must be a number >= 0'],
      [['--seed', 'x'], '--seed must be a non-negative integer'],
      [['--no-sequential', '--vs-default'], '--vs-default needs the one-by-one runs'],
    ] as [string[], string][]) {
      const err = await run(process.execPath, [CLI, 'fork', '--model', TINY, '--backend', 'cpu', ...args]).then(
        () => undefined,
        (e: { code: number; stderr: string }) => e,
      );
      expect(err?.code, args.join(' ')).not.toBe(0);
      expect(err?.stderr, args.join(' ')).toContain(msg);
    }
  }, 60_000);
});
