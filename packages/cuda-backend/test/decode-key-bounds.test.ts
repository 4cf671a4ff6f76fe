import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { createCudaBackend } from '../src/index.js';
import { ABI_VERSION } from '../src/native.js';

// capabilities.shortContextKeys and longContextKeys come from the addon (info().decodeShortKeys,
// its SA_MAX_KEYS where the cluster attention can run; info().decodeLongKeys, its GQA_LONG_KEYS),
// not from copies of the bounds in TypeScript. A fake addon (a
// CommonJS file standing in for nerva_cuda.node) reports what each case sets, so no GPU is needed.

const tmp = mkdtempSync(path.join(os.tmpdir(), 'nerva-short-keys-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** What the fake context's info() adds to its fields (undefined: an addon without the field). */
const reported: { decodeShortKeys?: unknown; decodeLongKeys?: unknown } = {};

class FakeContext {
  info() {
    const base = {
      name: 'Fake GPU', totalMemory: 2 ** 34, smCount: 132, computeCapability: '9.0', deviceBase: 2 ** 32,
      deviceArenaBytes: 2 ** 20, pinnedBase: 2 ** 40, pinnedArenaBytes: 2 ** 16, workspaceBytes: 0, runtimeVersion: 13000,
      driverVersion: 13000, gemm: 'gemv', numerics: 'exact', cublas: '', cublasNote: '',
    };
    return { ...base, ...reported };
  }
  pinnedArrayBuffer() {
    return new ArrayBuffer(2 ** 16);
  }
  createStream() {
    return 1;
  }
  counters() {
    return { allocCalls: 0, freeCalls: 0, launches: 0, graphReplays: 0, hotPathRejected: 0 };
  }
  dispose() {}
}

(globalThis as Record<string, unknown>).__nervaShortKeysAddon = {
  abiVersion: ABI_VERSION,
  Context: FakeContext,
  probe: () => ({ ok: true, count: 1, name: 'Fake GPU', computeCapability: '9.0' }),
  knobs: () => [],
  validateKnobs: () => null,
};
const addonPath = path.join(tmp, 'fake-addon.cjs');
writeFileSync(addonPath, 'module.exports = globalThis.__nervaShortKeysAddon;\n');

function keysCapability(field: 'decodeShortKeys' | 'decodeLongKeys', value: unknown | undefined, present: boolean): number {
  delete reported.decodeShortKeys;
  delete reported.decodeLongKeys;
  if (present) reported[field] = value;
  const b = createCudaBackend({ addonPath, deviceArenaBytes: 2 ** 20 });
  try {
    return (field === 'decodeShortKeys' ? b.capabilities.shortContextKeys : b.capabilities.longContextKeys) ?? -1;
  } finally {
    b.dispose();
  }
}
const shortKeys = (value: unknown | undefined, present = true) => keysCapability('decodeShortKeys', value, present);
const longKeys = (value: unknown | undefined, present = true) => keysCapability('decodeLongKeys', value, present);

describe('capabilities.shortContextKeys (from the addon: info().decodeShortKeys)', () => {
  it('is the bound the addon reports', () => {
    expect(shortKeys(1024)).toBe(1024);
    expect(shortKeys(512)).toBe(512);
  });

  it('is 0 where the addon says the kernel never runs, or says nothing (an older addon)', () => {
    expect(shortKeys(0)).toBe(0);
    expect(shortKeys(undefined, false)).toBe(0);
  });

  it('is 0 for a value that is not a positive whole number', () => {
    for (const v of [-1, 1.5, Number.NaN, '1024', null]) expect(shortKeys(v), String(v)).toBe(0);
  });
});

describe('capabilities.longContextKeys (from the addon: info().decodeLongKeys)', () => {
  it('is the floor the addon reports, apart from the short bound', () => {
    expect(longKeys(8192)).toBe(8192);
    expect(shortKeys(1024)).toBe(1024);
    reported.decodeLongKeys = 8192;
    const b = createCudaBackend({ addonPath, deviceArenaBytes: 2 ** 20 });
    try {
      expect([b.capabilities.shortContextKeys, b.capabilities.longContextKeys]).toEqual([1024, 8192]);
    } finally {
      b.dispose();
    }
  });

  it('is 0 where the addon reports 0, nothing (an older addon) or a value that is not a positive whole number', () => {
    expect(longKeys(0)).toBe(0);
    expect(longKeys(undefined, false)).toBe(0);
    for (const v of [-1, 1.5, Number.NaN, '8192', null]) expect(longKeys(v), String(v)).toBe(0);
  });
});
