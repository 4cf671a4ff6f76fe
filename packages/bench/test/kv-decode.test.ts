import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { defaultModelDir } from '@nerva/server';
import { afterAll, describe, expect, it } from 'vitest';

const run = promisify(execFile);
let root = dirname(fileURLToPath(import.meta.url));
while (!existsSync(join(root, 'pnpm-workspace.yaml'))) root = dirname(root);
const CLI = join(root, 'packages/bench/dist/cli.js');
const bench = (args: string[]) => run(process.execPath, [CLI, ...args], { cwd: root });
const tmp = mkdtempSync(join(tmpdir(), 'nerva-bench-kv-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const cfg = JSON.parse(readFileSync(join(defaultModelDir(), 'config.json'), 'utf8'));
/** One KV page of the embedded model on the CPU backend: 16 tokens of float32 K and V for every layer. */
const PB = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4 * 16;
const ARGS = ['decode', '--backend', 'cpu', '--new-tokens', '16', '--prompt-len', '64'];

describe('nerva-bench decode with tiered KV', () => {
  it('--kv-vram-budget: the budgets and the KV pages by tier are reported', async () => {
    const plain = JSON.parse((await bench(ARGS)).stdout.trim());
    expect(plain.kv).toBeUndefined();
    expect(plain.kv_vram_budget_bytes).toBeUndefined();

    // The smallest hot pool (5 pages: 4 usable) for 64 + 16 tokens: 5 pages, one of them warm.
    const { stdout } = await bench([...ARGS, '--kv-vram-budget', `${(5 * PB) / 1024}KiB`]);
    const lines = stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    const j = JSON.parse(lines[0]);
    expect(j.probe).toBe('decode');
    expect(j.new_tokens).toBe(16);
    expect(j.kv_vram_budget_bytes).toBe(5 * PB);
    expect(j.kv_host_budget_bytes).toBeNull();
    expect(j.kv_offload_dir).toBeNull();
    expect(j.kv.page_bytes).toBe(PB);
    expect(j.kv.tiers.hot.capacity_pages).toBe(4);
    expect(j.kv.tiers.warm.capacity_pages).toBe(40);
    expect(j.kv.tiers.warm.used_pages).toBeGreaterThan(0);
    expect(j.kv.demotions).toBeGreaterThan(0);
    expect(j.kv.moved.d2h.bytes).toBe(j.kv.demotions * PB);
    expect(j.kv.tiered_passes).toBeGreaterThan(0);
    expect(j.hot_path_allocations).toBe(0);
    expect(j.tokens_per_s).toBeGreaterThan(0);
  }, 120_000);

  it('--kv-host-budget and --kv-offload-dir size the warm and cold tiers; the cold file is removed', async () => {
    const dir = join(tmp, 'cold');
    await run('mkdir', ['-p', dir]);
    const { stdout } = await bench([...ARGS, '--kv-vram-budget', String(6 * PB), '--kv-host-budget', String(10 * PB), '--kv-offload-dir', dir]);
    const j = JSON.parse(stdout.trim());
    expect(j.kv_vram_budget_bytes).toBe(6 * PB);
    expect(j.kv_host_budget_bytes).toBe(10 * PB);
    expect(j.kv_offload_dir).toBe(dir);
    expect(j.kv.tiers.hot.capacity_pages).toBe(5);
    expect(j.kv.tiers.warm.capacity_pages).toBe(10);
    expect(j.kv.tiers.cold.capacity_pages).toBe(4 * (6 + 10));
    expect(readdirSync(dir)).toEqual([]);
  }, 120_000);

  it('bad kv budgets are one clear error each', async () => {
    const fail = (args: string[]) => bench(args).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e,
    );
    const garbage = await fail(['decode', '--kv-vram-budget', '64 megs']);
    expect(garbage?.code).not.toBe(0);
    expect(garbage?.stderr).toContain('--kv-vram-budget must be a size such as 4GiB');
    const zero = await fail(['decode', '--kv-host-budget', '0']);
    expect(zero?.stderr).toContain('--kv-host-budget must be greater than zero');
    const tiny = await fail([...ARGS, '--kv-vram-budget', '1']);
    expect(tiny?.code).toBe(1);
    const lines = tiny!.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toBe(
      `nerva-bench: error: kvVramBudget 1 bytes holds 0 KV pages of ${PB} bytes; one sequence's window needs 5 (1 sink, 2 recent, the page being written and the null page): use at least ${5 * PB} bytes`,
    );
    const alone = await fail([...ARGS, '--kv-host-budget', '64MiB']);
    expect(alone?.code).toBe(1);
    expect(alone?.stderr).toContain('kvHostBudget needs kvVramBudget (the hot KV pool it extends)');
  }, 120_000);
});
