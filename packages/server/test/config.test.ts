import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { checkFlags, DEFAULT_CONFIG, loadConfigFile, mergeConfig } from '../src/config.js';
import { ConfigError } from '../src/errors.js';

function file(text: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'nerva-config-'));
  const p = join(dir, 'nerva.toml');
  writeFileSync(p, text);
  return p;
}

describe('config', () => {
  it('reads TOML keys, resolves paths against the file, and flags override the file', async () => {
    const p = file('port = 9000\nmax_queue = 8\nmodel = "models/x"\napi_key = "k"\nenable_prefix_caching = false\n');
    const f = await loadConfigFile(p);
    expect(f).toEqual({ port: 9000, maxQueue: 8, model: join(p, '..', 'models/x'), apiKey: 'k', enablePrefixCaching: false });
    const c = mergeConfig(f, checkFlags({ port: 1234, host: undefined }));
    expect(c.port).toBe(1234);
    expect(c.maxQueue).toBe(8);
    expect(c.host).toBe(DEFAULT_CONFIG.host);
    expect(c.bodyLimitBytes).toBe(1024 * 1024);
  });

  it('an unknown key is an error naming the key', async () => {
    const err = await loadConfigFile(file('port = 1\nmax_qeue = 3\n')).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as ConfigError).key).toBe('max_qeue');
    expect((err as Error).message).toContain('unknown key "max_qeue"');
  });

  it('wrong types and bad TOML name the key or the file', async () => {
    const t = await loadConfigFile(file('port = "eighty"\n')).catch((e: unknown) => e);
    expect((t as ConfigError).key).toBe('port');
    expect((t as Error).message).toMatch(/"port" must be/);
    const b = await loadConfigFile(file('backend = "tpu"\n')).catch((e: unknown) => e);
    expect((b as ConfigError).key).toBe('backend');
    const n = await loadConfigFile(file('numerics = "fp8"\n')).catch((e: unknown) => e);
    expect((n as ConfigError).key).toBe('numerics');
    expect((n as Error).message).toMatch(/"numerics" must be "exact" or "bf16"/);
    expect(await loadConfigFile(file('numerics = "bf16"\n'))).toEqual({ numerics: 'bf16' });
    const syntax = await loadConfigFile(file('port = = 3\n')).catch((e: unknown) => e);
    expect((syntax as Error).message).toContain('not valid TOML');
    expect(() => checkFlags({ maxQueue: -1 })).toThrow(/max_queue/);
    await expect(loadConfigFile('/nonexistent/nerva.toml')).rejects.toThrow(/cannot read config file/);
  });

  it('memory budgets: sizes as strings with units or integer bytes, offload_dir resolved against the file', async () => {
    const p = file('vram_budget = "4GiB"\nhost_budget = 34359738368\noffload_dir = "spill"\n');
    expect(await loadConfigFile(p)).toEqual({ vramBudget: 4 * 2 ** 30, hostBudget: 32 * 2 ** 30, offloadDir: join(p, '..', 'spill') });
    // G alone is GiB; SI units are powers of 1000.
    expect(await loadConfigFile(file('vram_budget = "4G"\nhost_budget = "512MB"\n'))).toEqual({ vramBudget: 4 * 2 ** 30, hostBudget: 512_000_000 });
    // Flags arrive as numbers (parsed by the CLI) and override the file.
    const c = mergeConfig(await loadConfigFile(p), checkFlags({ vramBudget: 2 ** 30, offloadDir: '/tmp/nerva-spill' }));
    expect(c.vramBudget).toBe(2 ** 30);
    expect(c.hostBudget).toBe(32 * 2 ** 30);
    expect(c.offloadDir).toBe('/tmp/nerva-spill');
    expect(DEFAULT_CONFIG.vramBudget).toBeUndefined();
    // kv_cache_bytes takes the same sizes (integers as before).
    expect(await loadConfigFile(file('kv_cache_bytes = "256MiB"\n'))).toEqual({ kvCacheBytes: 256 * 2 ** 20 });
    expect(await loadConfigFile(file('kv_cache_bytes = 268435456\n'))).toEqual({ kvCacheBytes: 256 * 2 ** 20 });
  });

  it('pipeline keys: pipeline_parallel (a positive integer) and allow_single_device_stages', async () => {
    expect(await loadConfigFile(file('pipeline_parallel = 2\nallow_single_device_stages = true\n'))).toEqual({ pipelineParallel: 2, allowSingleDeviceStages: true });
    const zero = await loadConfigFile(file('pipeline_parallel = 0\n')).catch((e: unknown) => e);
    expect((zero as ConfigError).key).toBe('pipeline_parallel');
    expect((zero as Error).message).toMatch(/"pipeline_parallel" must be a positive integer, got 0/);
    const frac = await loadConfigFile(file('pipeline_parallel = 1.5\n')).catch((e: unknown) => e);
    expect((frac as ConfigError).key).toBe('pipeline_parallel');
    const yes = await loadConfigFile(file('allow_single_device_stages = "yes"\n')).catch((e: unknown) => e);
    expect((yes as Error).message).toMatch(/"allow_single_device_stages" must be true or false/);
    // Flags override the file.
    const c = mergeConfig(await loadConfigFile(file('pipeline_parallel = 4\n')), checkFlags({ pipelineParallel: 2 }));
    expect(c.pipelineParallel).toBe(2);
    expect(() => checkFlags({ pipelineParallel: -2 })).toThrow(/pipeline_parallel/);
    expect(DEFAULT_CONFIG.pipelineParallel).toBeUndefined();
  });

  it('bad memory budget values are errors naming the key', async () => {
    const cases: [string, string, RegExp][] = [
      ['vram_budget = "lots"\n', 'vram_budget', /"vram_budget" must be a size such as 4GiB.*got "lots"/],
      ['vram_budget = "4 GiBs"\n', 'vram_budget', /"vram_budget" must be .*unknown unit "GiBs"/],
      ['vram_budget = "-4GiB"\n', 'vram_budget', /"vram_budget" must be greater than zero/],
      ['vram_budget = 0\n', 'vram_budget', /"vram_budget" must be greater than zero, got 0/],
      ['host_budget = -1\n', 'host_budget', /"host_budget" must be greater than zero/],
      ['host_budget = 1.5\n', 'host_budget', /"host_budget" must be a whole number of bytes/],
      ['vram_budget = true\n', 'vram_budget', /"vram_budget" must be a size such as "4GiB" or a positive integer byte count, got true/],
      ['vram_budget = ["4GiB"]\n', 'vram_budget', /"vram_budget" must be a size/],
      ['offload_dir = 3\n', 'offload_dir', /"offload_dir" must be a non-empty string, got 3/],
      ['offload_dir = ""\n', 'offload_dir', /"offload_dir" must be a non-empty string/],
      ['vram_bugdet = "4GiB"\n', 'vram_bugdet', /unknown key "vram_bugdet"/],
    ];
    for (const [text, key, re] of cases) {
      const p = file(text);
      const err = await loadConfigFile(p).catch((e: unknown) => e);
      expect(err, text).toBeInstanceOf(ConfigError);
      expect((err as ConfigError).key, text).toBe(key);
      expect((err as Error).message, text).toMatch(re);
      // The message names the file too.
      expect((err as Error).message, text).toContain(p);
    }
    expect(() => checkFlags({ vramBudget: 0 })).toThrow(/vram_budget.*greater than zero/);
  });
});
