import { readFileSync } from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { createCudaBackend, CudaArgumentError } from '../src/index.js';
import { loadAddon, type NativeAddon } from '../src/native.js';
import { pkgDir } from './native-build.js';

// The knob table (native/common/knobs.cc) as the built addon exposes it. The addon loads without
// a GPU (the CUDA runtime is linked statically and finds no driver only when asked), so this runs
// wherever the addon is built; createCudaBackend checks the environment before it probes.
function tryLoad(): NativeAddon | undefined {
  try {
    return loadAddon();
  } catch {
    return undefined;
  }
}
const addon = tryLoad();

const saved = new Map<string, string | undefined>();
function setEnv(name: string, value: string): void {
  if (!saved.has(name)) saved.set(name, process.env[name]);
  process.env[name] = value;
}
afterEach(() => {
  for (const [name, v] of saved) {
    if (v === undefined) delete process.env[name];
    else process.env[name] = v;
  }
  saved.clear();
});

describe.skipIf(!addon)('the knob table (built addon)', () => {
  const a = addon as NativeAddon;

  it('declares each knob once, with a doc line and a default it accepts', () => {
    const knobs = a.knobs();
    const names = knobs.map((k) => k.name);
    expect(new Set(names).size).toBe(names.length);
    expect(names.length).toBeLessThanOrEqual(15);
    for (const k of knobs) {
      expect(k.name).toMatch(/^NERVA_[A-Z0-9_]+$/);
      expect(k.doc.length, k.name).toBeGreaterThan(10);
      if (k.kind === 'oneOf') expect(k.values, k.name).toContain(k.default);
      if (k.kind === 'int') expect(Number(k.default), k.name).toBeGreaterThanOrEqual(k.min ?? 0);
    }
    // Retired switches are not read any more.
    for (const gone of ['NERVA_HOST_ATTN_SPIN_US', 'NERVA_HOST_CHANNEL', 'NERVA_HOST_CHANNEL_SPIN_US', 'NERVA_HOST_CHANNEL_TIMEOUT_MS', 'NERVA_CUDA_DECODER'])
      expect(names).not.toContain(gone);
  });

  it('reports the value the native code reads: the valid environment value, else the default', () => {
    const value = (name: string) => a.knobs().find((k) => k.name === name)?.value;
    setEnv('NERVA_HOST_SPIN_US', '50');
    expect(value('NERVA_HOST_SPIN_US')).toBe('50');
    setEnv('NERVA_HOST_SPIN_US', 'fifty');
    expect(value('NERVA_HOST_SPIN_US')).toBe('1000');
    setEnv('NERVA_CUDA_SYNC', '');
    expect(value('NERVA_CUDA_SYNC')).toBe('auto');
  });

  it('validateKnobs accepts unset, empty and valid values and names the first invalid one', () => {
    expect(a.validateKnobs()).toBeNull();
    for (const k of a.knobs()) {
      setEnv(k.name, '');
      expect(a.validateKnobs(), k.name).toBeNull();
      for (const v of k.kind === 'oneOf' ? (k.values ?? []) : k.kind === 'int' ? [String(k.min), String(k.max)] : ['/some/path']) {
        setEnv(k.name, v);
        expect(a.validateKnobs(), `${k.name}=${v}`).toBeNull();
      }
      setEnv(k.name, '');
    }
    const bad: Array<[string, string, RegExp]> = [
      ['NERVA_CUDA_SYNC', 'Block', /NERVA_CUDA_SYNC: must be one of spin,block,auto or unset, got "Block"/],
      ['NERVA_HOST_THREADS', '1.5', /NERVA_HOST_THREADS: must be an integer in \[0, \d+\].*"1.5"/],
      ['NERVA_HOST_THREADS', ' 4', /"\s4"/],
      ['NERVA_HOST_THREADS', '-1', /"-1"/],
      ['NERVA_HOST_SPIN_US', '99999999999', /NERVA_HOST_SPIN_US/],
      ['NERVA_HOST_ISA', 'avx', /NERVA_HOST_ISA: must be one of scalar,avx2,avx512 or unset, got "avx"/],
    ];
    for (const [name, v, re] of bad) {
      setEnv(name, v);
      const r = a.validateKnobs();
      expect(r?.name, `${name}=${v}`).toBe(name);
      expect(r?.message).toMatch(re);
      setEnv(name, '');
    }
  });

  it('createCudaBackend throws a CudaArgumentError naming the variable, before looking for a GPU', () => {
    setEnv('NERVA_PINNED_HUGEPAGES', 'yes');
    let err: unknown;
    try {
      createCudaBackend();
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(CudaArgumentError);
    expect((err as Error).message).toMatch(/^NERVA_PINNED_HUGEPAGES: must be one of 0,1 or unset, got "yes"/);
  });

  it('the README lists exactly the knobs of the table and the names the TypeScript side reads', () => {
    const readme = readFileSync(path.join(pkgDir, 'README.md'), 'utf8');
    const section = readme.slice(readme.indexOf('## Environment'));
    const listed = [...section.matchAll(/^\| `(NERVA_[A-Z0-9_]+)`/gm)].map((m) => m[1]);
    const ts = ['NERVA_MATMUL', 'NERVA_BATCH_INVARIANT', 'NERVA_CUDA_ADDON'];
    expect(listed.sort()).toEqual([...a.knobs().map((k) => k.name), ...ts].sort());
  });
});
