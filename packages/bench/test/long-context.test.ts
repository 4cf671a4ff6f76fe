import { execFile } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { longContextProbe } from '../src/probes/long-context.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '../../..');
const TINY = join(root, '../shared/fixtures/models/tiny-shakespeare-qwen3');
const CLI = join(root, 'packages/bench/dist/cli.js');
const run = promisify(execFile);

describe('nerva-bench long-context', () => {
  for (const kvCacheDtype of ['auto', 'bf16'] as const) {
    it(`every tier mix gives the all-hot tokens (KV ${kvCacheDtype})`, async () => {
      const r = await longContextProbe({ model: TINY, backend: 'cpu', context: 256, newTokens: 4, ratios: [2, 4], kvCacheDtype });
      expect(r).toMatchObject({ probe: 'long-context', backend: 'cpu', context: 256, new_tokens: 4, block_size: 16, kv_cache_dtype: kvCacheDtype === 'auto' ? 'f32' : 'bf16' });
      const mixes = r.mixes as Record<string, number | boolean | null>[];
      expect(mixes.map((m) => m.kv_to_hot_ratio)).toEqual([1, 2, 4]);
      expect(mixes[0]).toMatchObject({ warm_pages: 0, tiered_passes: 0, fraction_of_all_hot: 1, same_tokens_as_all_hot: true });
      for (const m of mixes.slice(1)) {
        // Pages past the hot pool were attended where they lie (the warm tier) and merged: same tokens.
        expect(m.same_tokens_as_all_hot, `ratio ${m.kv_to_hot_ratio}`).toBe(true);
        expect(m.warm_pages as number).toBeGreaterThan(0);
        expect(m.tiered_passes as number).toBeGreaterThan(0);
        expect(m.demotions as number).toBeGreaterThan(0);
        expect(m.tokens_per_s as number).toBeGreaterThan(0);
        expect(m.hot_path_allocations).toBe(0);
      }
      // A smaller hot pool leaves more pages warm.
      expect(mixes[2].warm_pages as number).toBeGreaterThan(mixes[1].warm_pages as number);
    }, 120_000);
  }

  it('link shares: one mix per ratio and share, the all-hot tokens, pages staged only with a share', async () => {
    const r = await longContextProbe({ model: TINY, backend: 'cpu', context: 256, newTokens: 4, ratios: [4], linkShares: [0, 0.5] });
    const mixes = r.mixes as Record<string, number | boolean | null>[];
    expect(mixes.map((m) => [m.kv_to_hot_ratio, m.warm_link_share])).toEqual([
      [1, null],
      [4, 0],
      [4, 0.5],
    ]);
    for (const m of mixes) expect(m.same_tokens_as_all_hot).toBe(true);
    expect(mixes[1].staged_bytes_per_token).toBe(0);
    expect(mixes[2].staged_bytes_per_token as number).toBeGreaterThan(0);
    const err = await run(process.execPath, [CLI, 'long-context', '--model', TINY, '--backend', 'cpu', '--link-shares', '0,2']).catch((e) => e);
    expect(err.code).not.toBe(0);
    expect(err.stderr).toContain('--link-shares takes numbers from 0 to 1, got "0,2"');
  }, 120_000);

  it('the CLI prints one JSON line; a bad KV dtype is one clear error', async () => {
    const { stdout } = await run(process.execPath, [CLI, 'long-context', '--model', TINY, '--backend', 'cpu', '--context', '64', '--new-tokens', '3', '--ratios', '2', '--kv-cache-dtype', 'bf16']);
    const lines = stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0])).toMatchObject({ probe: 'long-context', kv_cache_dtype: 'bf16', context: 64 });
    const err = await run(process.execPath, [CLI, 'long-context', '--model', TINY, '--backend', 'cpu', '--kv-cache-dtype', 'f8']).catch((e) => e);
    expect(err.code).not.toBe(0);
    expect(err.stderr).toContain("option '--kv-cache-dtype <dtype>' argument 'f8' is invalid");
  }, 120_000);
});
