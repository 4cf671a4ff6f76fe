import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { checkFlags, checkKvTiers, DEFAULT_CONFIG, loadConfigFile, mergeConfig } from '../src/config.js';
import { ConfigError } from '../src/errors.js';

function file(text: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'nerva-kv-config-'));
  const p = join(dir, 'nerva.toml');
  writeFileSync(p, text);
  return p;
}

describe('config: tiered KV keys', () => {
  it('kv_vram_budget and kv_host_budget take sizes, kv_offload_dir resolves against the file, flags override', async () => {
    const p = file('kv_vram_budget = "64MiB"\nkv_host_budget = 1073741824\nkv_offload_dir = "kv-spill"\n');
    expect(await loadConfigFile(p)).toEqual({ kvVramBudget: 64 * 2 ** 20, kvHostBudget: 2 ** 30, kvOffloadDir: join(p, '..', 'kv-spill') });
    // G alone is GiB; SI units are powers of 1000; an integer is bytes.
    expect(await loadConfigFile(file('kv_vram_budget = "1G"\nkv_host_budget = "512MB"\n'))).toEqual({ kvVramBudget: 2 ** 30, kvHostBudget: 512_000_000 });
    expect(await loadConfigFile(file('kv_vram_budget = 81920\n'))).toEqual({ kvVramBudget: 81920 });
    // The KV keys sit beside the weight budgets without touching them.
    const both = await loadConfigFile(file('vram_budget = "4GiB"\nkv_vram_budget = "256MiB"\n'));
    expect(both).toEqual({ vramBudget: 4 * 2 ** 30, kvVramBudget: 256 * 2 ** 20 });
    // Flags arrive as numbers (parsed by the CLI) and override the file; the other keys stay.
    const c = mergeConfig(await loadConfigFile(p), checkFlags({ kvVramBudget: 2 ** 20, kvOffloadDir: '/tmp/nerva-kv' }));
    expect(c.kvVramBudget).toBe(2 ** 20);
    expect(c.kvHostBudget).toBe(2 ** 30);
    expect(c.kvOffloadDir).toBe('/tmp/nerva-kv');
    expect(DEFAULT_CONFIG.kvVramBudget).toBeUndefined();
    expect(DEFAULT_CONFIG.kvHostBudget).toBeUndefined();
    expect(DEFAULT_CONFIG.kvOffloadDir).toBeUndefined();
  });

  it('kv_warm_link_share takes a number from 0 to 1; anything else names the key', async () => {
    expect(await loadConfigFile(file('kv_vram_budget = "64MiB"\nkv_warm_link_share = 0.4\n'))).toEqual({ kvVramBudget: 64 * 2 ** 20, kvWarmLinkShare: 0.4 });
    expect(await loadConfigFile(file('kv_warm_link_share = 1\n'))).toEqual({ kvWarmLinkShare: 1 });
    for (const bad of ['1.5', '-0.1', '"half"', 'true']) {
      const err = await loadConfigFile(file(`kv_warm_link_share = ${bad}\n`)).catch((e: unknown) => e);
      expect(err, bad).toBeInstanceOf(ConfigError);
      expect((err as Error).message, bad).toMatch(/"kv_warm_link_share" must be a number from 0 to 1/);
    }
    expect(() => checkFlags({ kvWarmLinkShare: 2 })).toThrow(/kv_warm_link_share.*from 0 to 1/);
    expect(() => checkKvTiers({ kvWarmLinkShare: 0.5 })).toThrow(/^kv_warm_link_share \(--kv-warm-link-share\) needs kv_vram_budget/);
    expect(() => checkKvTiers({ kvVramBudget: 1, kvWarmLinkShare: 0.5 })).not.toThrow();
  });

  it('malformed values are errors naming the key, the file and what was given', async () => {
    const cases: [string, string, RegExp][] = [
      ['kv_vram_budget = "lots"\n', 'kv_vram_budget', /"kv_vram_budget" must be a size such as 4GiB.*got "lots"/],
      ['kv_vram_budget = "64 MiBs"\n', 'kv_vram_budget', /"kv_vram_budget" must be .*unknown unit "MiBs"/],
      ['kv_vram_budget = "-64MiB"\n', 'kv_vram_budget', /"kv_vram_budget" must be greater than zero/],
      ['kv_vram_budget = 0\n', 'kv_vram_budget', /"kv_vram_budget" must be greater than zero, got 0/],
      ['kv_vram_budget = true\n', 'kv_vram_budget', /"kv_vram_budget" must be a size such as "4GiB" or a positive integer byte count, got true/],
      ['kv_host_budget = -1\n', 'kv_host_budget', /"kv_host_budget" must be greater than zero/],
      ['kv_host_budget = 1.5\n', 'kv_host_budget', /"kv_host_budget" must be a whole number of bytes/],
      ['kv_host_budget = ["1GiB"]\n', 'kv_host_budget', /"kv_host_budget" must be a size/],
      ['kv_offload_dir = 3\n', 'kv_offload_dir', /"kv_offload_dir" must be a non-empty string, got 3/],
      ['kv_offload_dir = ""\n', 'kv_offload_dir', /"kv_offload_dir" must be a non-empty string/],
      ['kv_vram_bugdet = "64MiB"\n', 'kv_vram_bugdet', /unknown key "kv_vram_bugdet" \(known: .*kv_vram_budget, kv_host_budget, kv_offload_dir/],
    ];
    for (const [text, key, re] of cases) {
      const p = file(text);
      const err = await loadConfigFile(p).catch((e: unknown) => e);
      expect(err, text).toBeInstanceOf(ConfigError);
      expect((err as ConfigError).key, text).toBe(key);
      expect((err as Error).message, text).toMatch(re);
      expect((err as Error).message, text).toContain(p);
    }
    expect(() => checkFlags({ kvVramBudget: 0 })).toThrow(/kv_vram_budget.*greater than zero/);
    expect(() => checkFlags({ kvHostBudget: 1.5 })).toThrow(/kv_host_budget.*whole number/);
  });

  it('kv_host_budget and kv_offload_dir without kv_vram_budget are one error naming the keys and flags', () => {
    expect(() => checkKvTiers({})).not.toThrow();
    expect(() => checkKvTiers({ kvVramBudget: 1, kvHostBudget: 2, kvOffloadDir: '/tmp' })).not.toThrow();
    const host = (() => {
      try {
        checkKvTiers({ kvHostBudget: 2 ** 30 });
      } catch (e) {
        return e;
      }
    })();
    expect(host).toBeInstanceOf(ConfigError);
    expect((host as ConfigError).key).toBe('kv_host_budget');
    expect((host as Error).message).toBe(
      'kv_host_budget (--kv-host-budget) needs kv_vram_budget (--kv-vram-budget): the hot KV pool that the warm and cold KV tiers extend',
    );
    expect(() => checkKvTiers({ kvHostBudget: 1, kvOffloadDir: '/tmp' })).toThrow(/^kv_host_budget \(--kv-host-budget\) and kv_offload_dir \(--kv-offload-dir\) need kv_vram_budget/);
    expect(() => checkKvTiers({ kvOffloadDir: '/tmp' })).toThrow(/^kv_offload_dir \(--kv-offload-dir\) needs kv_vram_budget/);
  });
});
