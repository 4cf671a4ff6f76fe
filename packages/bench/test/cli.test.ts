import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);
let root = dirname(fileURLToPath(import.meta.url));
while (!existsSync(join(root, 'pnpm-workspace.yaml'))) root = dirname(root);
const CLI = join(root, 'packages/bench/dist/cli.js');

describe('nerva-bench', () => {
  it('generate prints one JSON line with throughput, latency percentiles and hot-path allocations', async () => {
    const { stdout } = await run(process.execPath, [CLI, 'generate', '--backend', 'cpu', '--new-tokens', '12', '--prompt-len', '8'], { cwd: root });
    const lines = stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    const j = JSON.parse(lines[0]);
    expect(j.probe).toBe('generate');
    expect(j.new_tokens).toBe(12);
    expect(j.tokens_per_s).toBeGreaterThan(0);
    expect(j.ms_per_token_p99).toBeGreaterThanOrEqual(j.ms_per_token_p50);
    expect(j.hot_path_allocations).toBe(0);
  }, 120_000);

  it('decode reports the roofline from the copy bandwidth it measured', async () => {
    const { stdout } = await run(process.execPath, [CLI, 'decode', '--backend', 'cpu', '--new-tokens', '8', '--prompt-len', '16'], { cwd: root });
    const j = JSON.parse(stdout.trim());
    expect(j.probe).toBe('decode');
    expect(j.copy_bandwidth_gbs).toBeGreaterThan(0);
    expect(j.roofline_tok_s).toBeCloseTo((j.copy_bandwidth_gbs * 1e9) / j.weight_bytes, 0);
    expect(j.fraction_of_roofline).toBeGreaterThan(0);
    expect(j.graph_replays_per_token).toBe(1);
  }, 120_000);

  it('rejects a bad flag with a clear message', async () => {
    const err = await run(process.execPath, [CLI, 'decode', '--new-tokens', '-3'], { cwd: root }).catch((e) => e);
    expect(err.code).not.toBe(0);
    expect(err.stderr).toContain('--new-tokens must be a positive integer');
  });
});
