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
});
