import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeEach, describe, expect, it } from 'vitest';
import { NervaError } from '@nerva/core';
import {
  createCudaBackend,
  createNcclUniqueId,
  CudaArgumentError,
  CudaDisposedError,
  loadNccl,
  ncclCandidateDirs,
  NcclCommunicator,
  NcclError,
  NcclUnavailableError,
  type CudaBackend,
} from '../src/index.js';
import { ABI_VERSION, type NativeContextOptions } from '../src/native.js';
import { addon as builtAddon } from './gpu-world.js';

// The TypeScript NCCL layer (src/nccl.ts) on a CPU: argument checks, the typed errors when the
// addon or libnccl is missing, and what reaches the addon, through a fake addon (a CommonJS file
// standing in for nerva_cuda.node) that records every NCCL call.

// A path that does not exist falls through to a built addon (NERVA_CUDA_ADDON, the package's
// build) where there is one: then the calls below get that addon's NCCL, whatever it is.
const missing = '/nonexistent/nerva_cuda.node';
const tmp = mkdtempSync(path.join(os.tmpdir(), 'nerva-nccl-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const DEVICE_BASE = 2 ** 32;
const calls: unknown[][] = [];
const fake = {
  ncclFound: true,
  initAll: true,
  nextComm: 0,
  /** Communicator ids handed out since the last reset. */
  comms: [] as number[],
  /** Thrown by the NCCL call of the named kind after `skip` such calls succeeded. */
  failNext: null as null | { kind: string; skip?: number; error: Record<string, unknown> },
};

function newComm(): number {
  fake.comms.push(fake.nextComm);
  return fake.nextComm++;
}

function maybeFail(kind: string): void {
  const f = fake.failNext;
  if (f?.kind !== kind) return;
  if (f.skip) {
    f.skip--;
    return;
  }
  fake.failNext = null;
  throw Object.assign(new Error(String(f.error.message)), f.error);
}

class FakeContext {
  readonly device: number;
  private readonly streams = [0];
  constructor(opts: NativeContextOptions) {
    this.device = opts.device;
  }
  info() {
    return {
      name: 'Fake GPU', totalMemory: 2 ** 34, smCount: 1, computeCapability: '9.0', deviceBase: DEVICE_BASE * (this.device + 1),
      deviceArenaBytes: 2 ** 20, pinnedBase: 2 ** 40, pinnedArenaBytes: 2 ** 16, workspaceBytes: 0, runtimeVersion: 13000,
      driverVersion: 13000, gemm: 'gemv', numerics: 'exact', cublas: '', cublasNote: '',
    };
  }
  pinnedArrayBuffer() {
    return new ArrayBuffer(2 ** 16);
  }
  createStream() {
    this.streams.push(this.streams.length);
    return this.streams.length - 1;
  }
  counters() {
    return { allocCalls: 0, freeCalls: 0, launches: 0, graphReplays: 0, hotPathRejected: 0 };
  }
  dispose() {}
  ncclCommInit(nranks: number, rank: number, id: Uint8Array) {
    calls.push(['commInit', this.device, nranks, rank, id.length]);
    maybeFail('commInit');
    return newComm();
  }
  ncclSend(...a: number[]) {
    calls.push(['send', this.device, ...a]);
    maybeFail('send');
  }
  ncclRecv(...a: number[]) {
    calls.push(['recv', this.device, ...a]);
    maybeFail('recv');
  }
}

const fakeAddon = {
  abiVersion: ABI_VERSION,
  Context: FakeContext,
  probe: () => ({ ok: true, count: 4, name: 'Fake GPU', computeCapability: '9.0' }),
  knobs: () => [],
  validateKnobs: () => null,
  ncclLoad: (dirs: string[]) => {
    calls.push(['load', dirs]);
    return fake.ncclFound
      ? { ok: true, version: 22803, versionString: '2.28.3', path: '/fake/libnccl.so.2', initAll: fake.initAll }
      : { ok: false, error: 'libnccl.so.2 not loadable: libnccl.so.2 (cannot open shared object file)' };
  },
  ncclUniqueId: () => new Uint8Array(128).fill(7),
  ncclGroupStart: () => calls.push(['groupStart']),
  ncclGroupEnd: () => {
    calls.push(['groupEnd']);
    maybeFail('groupEnd');
  },
  ncclCommInitAll: (devices: number[]) => {
    calls.push(['commInitAll', devices]);
    return devices.map(() => newComm());
  },
  ncclCommInfo: (comm: number) => ({ nranks: 2, rank: comm, device: 0 }),
  ncclCommDestroy: (comm: number) => {
    calls.push(['destroy', comm]);
    maybeFail('destroy');
  },
  ncclCommAbort: (comm: number) => calls.push(['abort', comm]),
  ncclDataTypes: { int8: 0, uint8: 1, int32: 2, uint32: 3, int64: 4, uint64: 5, float16: 6, float32: 7, float64: 8, bfloat16: 9 },
  ncclUniqueIdBytes: 128,
};
const { ncclLoad: _omit, ...withoutNccl } = fakeAddon;
void _omit;

(globalThis as Record<string, unknown>).__nervaFakeAddons = { fakeAddon, withoutNccl };
const fakePath = path.join(tmp, 'fake-addon.cjs');
writeFileSync(fakePath, 'module.exports = globalThis.__nervaFakeAddons.fakeAddon;\n');
const oldPath = path.join(tmp, 'old-addon.cjs');
writeFileSync(oldPath, 'module.exports = globalThis.__nervaFakeAddons.withoutNccl;\n');

const backend = (device: number, addonPath = fakePath): CudaBackend => createCudaBackend({ addonPath, device, deviceArenaBytes: 2 ** 20 });

function thrown(fn: () => unknown): Error {
  try {
    fn();
  } catch (e) {
    return e as Error;
  }
  throw new Error('expected an exception');
}

beforeEach(() => {
  calls.length = 0;
  fake.ncclFound = true;
  fake.initAll = true;
  fake.failNext = null;
  fake.comms = [];
});

describe('NCCL without the addon or the library', () => {
  it('loadNccl reports a missing addon and never throws', () => {
    const s = loadNccl({ addonPath: missing });
    if (builtAddon) {
      expect(s).toEqual(loadNccl());
      return;
    }
    expect(s.available).toBe(false);
    expect(s.reason).toMatch(/^CUDA addon not loadable: /);
  });

  it('createNcclUniqueId throws one NcclUnavailableError (an id where a built addon loads NCCL)', () => {
    if (builtAddon && loadNccl().available) {
      expect(createNcclUniqueId({ addonPath: missing })).toHaveLength(128);
      return;
    }
    const e = thrown(() => createNcclUniqueId({ addonPath: missing }));
    expect(e).toBeInstanceOf(NcclUnavailableError);
    expect(e).toBeInstanceOf(NervaError);
    expect((e as NcclUnavailableError).code).toBe('NCCL_UNAVAILABLE');
    expect(e.message).toMatch(/^NCCL unavailable: .*NERVA_NCCL_PATH/);
  });

  it('an addon built without NCCL support says to rebuild', () => {
    const s = loadNccl({ addonPath: oldPath });
    expect(s).toEqual({ available: false, reason: expect.stringMatching(/built without NCCL support.*pnpm build:cuda/) });
    expect(() => NcclCommunicator.init([backend(0, oldPath)])).toThrow(NcclUnavailableError);
  });

  it('a missing libnccl.so.2 is reported with what the addon tried', () => {
    fake.ncclFound = false;
    expect(loadNccl({ addonPath: fakePath, candidateDirs: ['/a', '/b'] })).toEqual({
      available: false,
      reason: 'libnccl.so.2 not loadable: libnccl.so.2 (cannot open shared object file)',
    });
    expect(calls).toEqual([['load', ['/a', '/b']]]);
    const e = thrown(() => NcclCommunicator.initAll([backend(0)]));
    expect(e).toBeInstanceOf(NcclUnavailableError);
    expect(e.message).toContain('cannot open shared object file');
    expect(() => createNcclUniqueId({ addonPath: fakePath })).toThrow(NcclUnavailableError);
  });

  it('the real addon (where built) reports every candidate it tried', () => {
    const saved = process.env.NERVA_NCCL_PATH;
    process.env.NERVA_NCCL_PATH = '/nonexistent/libnccl.so.2';
    try {
      const s = loadNccl({ candidateDirs: ['/also/nonexistent'] });
      // On a machine with NCCL on the loader path, the system library loads; else the reason
      // names the candidates (or that the addon itself is missing).
      if (!s.available) expect(s.reason).toMatch(/\/nonexistent\/libnccl\.so\.2 .*\/also\/nonexistent\/libnccl\.so\.2|CUDA addon not loadable/);
      else expect(s.version).toMatch(/^\d+\.\d+\.\d+$/);
    } finally {
      if (saved === undefined) delete process.env.NERVA_NCCL_PATH;
      else process.env.NERVA_NCCL_PATH = saved;
    }
  });
});

describe('ncclCandidateDirs', () => {
  it('finds the pip wheel directory under a virtualenv, a conda prefix and PYTHONPATH', () => {
    const venv = path.join(tmp, 'venv');
    const conda = path.join(tmp, 'conda');
    const pp = path.join(tmp, 'pp');
    const dirs = [
      path.join(venv, 'lib', 'python3.12', 'site-packages', 'nvidia', 'nccl', 'lib'),
      path.join(conda, 'lib', 'python3.10', 'site-packages', 'nvidia', 'nccl', 'lib'),
      path.join(pp, 'nvidia', 'nccl', 'lib'),
    ];
    for (const d of dirs) mkdirSync(d, { recursive: true });
    mkdirSync(path.join(venv, 'lib', 'python3.11', 'site-packages'), { recursive: true });
    const got = ncclCandidateDirs({ VIRTUAL_ENV: venv, CONDA_PREFIX: conda, PYTHONPATH: pp, HOME: path.join(tmp, 'home') });
    expect(got.slice(0, 3)).toEqual([dirs[2], dirs[0], dirs[1]]);
    for (const d of got) expect(d).toMatch(/nvidia\/nccl\/lib$/);
  });
});

describe('NcclCommunicator argument checks', () => {
  it('rejects bad ranks, nranks and unique ids before loading anything', () => {
    const a = backend(0);
    const b = backend(1);
    const cases: Array<[() => unknown, RegExp]> = [
      [() => NcclCommunicator.init([]), /at least one CudaBackend/],
      [() => NcclCommunicator.initAll([]), /at least one CudaBackend/],
      [() => NcclCommunicator.init([a, b], { nranks: 1 }), /nranks must be an integer >= the number of backends \(2\), got 1/],
      [() => NcclCommunicator.init([a], { nranks: 2.5, uniqueId: new Uint8Array(128) }), /nranks must be an integer/],
      [() => NcclCommunicator.init([a, b], { ranks: [0] }), /one rank per backend/],
      [() => NcclCommunicator.init([a, b], { ranks: [1, 1] }), /ranks repeat/],
      [() => NcclCommunicator.init([a], { nranks: 2, ranks: [2], uniqueId: new Uint8Array(128) }), /rank 2 is not an integer in \[0, 2\)/],
      [() => NcclCommunicator.init([a], { uniqueId: new Uint8Array(64) }), /uniqueId must be a Uint8Array of 128 bytes/],
      [() => NcclCommunicator.init([a], { nranks: 2, ranks: [1] }), /uniqueId is required when other processes hold ranks \(1 of 2 here\)/],
      [() => NcclCommunicator.init([{} as CudaBackend]), /backends\[0\] is not a CudaBackend/],
      [() => NcclCommunicator.initAll([a, backend(0)]), /two backends on device 0/],
    ];
    for (const [fn, msg] of cases) {
      const e = thrown(fn);
      expect(e).toBeInstanceOf(CudaArgumentError);
      expect(e.message).toMatch(msg);
    }
    expect(calls).toEqual([]);
  });
});

describe('NcclCommunicator through the addon', () => {
  it('initAll: one comm per backend, rank i on backends[i], and the library it used', () => {
    const a = backend(2);
    const b = backend(3);
    const c = NcclCommunicator.initAll([a, b], { candidateDirs: ['/x'] });
    expect(calls).toEqual([['load', ['/x']], ['commInitAll', [2, 3]]]);
    expect(c.nranks).toBe(2);
    expect(c.ranks).toEqual([0, 1]);
    expect([c.rankOf(a), c.rankOf(b)]).toEqual([0, 1]);
    expect(c.library).toEqual({ available: true, version: '2.28.3', versionCode: 22803, path: '/fake/libnccl.so.2', initAll: true });
  });

  it('initAll falls back to per-rank init in one group where the library lacks ncclCommInitAll', () => {
    fake.initAll = false;
    NcclCommunicator.initAll([backend(0), backend(1)]);
    expect(calls.slice(1)).toEqual([['groupStart'], ['commInit', 0, 2, 0, 128], ['commInit', 1, 2, 1, 128], ['groupEnd']]);
  });

  it('init: a one-rank communicator needs no group; remote ranks take the given id', () => {
    NcclCommunicator.init([backend(0)]);
    expect(calls.slice(1)).toEqual([['commInit', 0, 1, 0, 128]]);
    calls.length = 0;
    const c = NcclCommunicator.init([backend(1)], { nranks: 4, ranks: [3], uniqueId: new Uint8Array(128) });
    expect(calls.slice(1)).toEqual([['commInit', 1, 4, 3, 128]]);
    expect(c.ranks).toEqual([3]);
  });

  it('a failing init inside the group still ends the group, aborts what was made, and is typed', () => {
    // The first init succeeds, the second throws.
    fake.failNext = {
      kind: 'commInit',
      skip: 1,
      error: { message: 'ncclInvalidArgument (invalid argument) in ncclCommInitRank(...)', ncclError: 'ncclInvalidArgument', call: 'ncclCommInitRank' },
    };
    const e = thrown(() => NcclCommunicator.init([backend(0), backend(1)]));
    expect(e).toBeInstanceOf(NcclError);
    expect((e as NcclError).ncclError).toBe('ncclInvalidArgument');
    expect((e as NcclError).call).toBe('ncclCommInitRank');
    expect(calls.slice(1)).toEqual([['groupStart'], ['commInit', 0, 2, 0, 128], ['commInit', 1, 2, 1, 128], ['groupEnd'], ['abort', fake.comms[0]]]);
  });

  it('send/recv: address, count and NCCL type from the buffer, on the given stream of its backend', () => {
    const a = backend(0);
    const b = backend(1);
    const c = NcclCommunicator.initAll([a, b]);
    const comms = fake.comms;
    const x = a.alloc({ dtype: 'f32', length: 64 });
    const y = b.alloc({ dtype: 'bf16', length: 64 });
    const s = b.createStream();
    calls.length = 0;
    c.group(() => {
      c.send(x, c.rankOf(b), { offset: 8, length: 16 });
      c.recv(y, c.rankOf(a), { stream: s });
    });
    const baseA = DEVICE_BASE * 1;
    const baseB = DEVICE_BASE * 2;
    expect(calls).toEqual([
      ['groupStart'],
      ['send', 0, comms[0], baseA + 8 * 4, 16, 7, 1, 0],
      ['recv', 1, comms[1], baseB + 0, 64, 9, 0, s.id],
      ['groupEnd'],
    ]);
  });

  it('send/recv argument checks', () => {
    const a = backend(0);
    const b = backend(1);
    const other = backend(2);
    const c = NcclCommunicator.initAll([a, b]);
    const x = a.alloc({ dtype: 'f32', length: 64 });
    const pinned = a.alloc({ dtype: 'f32', length: 4, tier: 'pinned' });
    const foreign = other.alloc({ dtype: 'f32', length: 4 });
    const foreignStream = other.createStream();
    calls.length = 0;
    expect(() => c.send(x, 1)).toThrow(/2 ranks live in this process: put sends and receives inside group\(\)/);
    const cases: Array<[() => unknown, RegExp]> = [
      [() => c.send(x, 2), /peer must be an integer in \[0, 2\), got 2/],
      [() => c.send(x, -1), /peer must be an integer/],
      [() => c.send(x, 1, { offset: 60, length: 8 }), /range \[60, 68\) outside buffer of 64 elements/],
      [() => c.recv(x, 1, { offset: 65 }), /outside buffer of 64 elements/],
      [() => c.send(pinned, 1), /only 'vram' buffers can be sent or received/],
      [() => c.send(foreign, 1), /not a live buffer of a backend holding a rank of this communicator/],
      [() => c.send(x, 1, { stream: foreignStream }), /unknown stream/],
      [() => c.send(undefined as never, 1), /expected a DeviceBuffer/],
    ];
    c.group(() => {
      for (const [fn, msg] of cases) {
        const e = thrown(fn);
        expect(e).toBeInstanceOf(CudaArgumentError);
        expect(e.message).toMatch(msg);
      }
    });
    a.free(x);
    c.group(() => expect(() => c.send(x, 1)).toThrow(/not a live buffer/));
    expect(calls.filter((k) => k[0] === 'send' || k[0] === 'recv')).toEqual([]);
  });

  it('a one-rank communicator sends without a group; NCCL failures are NcclError', () => {
    const a = backend(0);
    const c = NcclCommunicator.init([a]);
    const x = a.alloc({ dtype: 'i32', length: 4 });
    c.send(x, 0);
    expect(calls.at(-1)).toEqual(['send', 0, fake.comms[0], DEVICE_BASE, 4, 2, 0, 0]);
    fake.failNext = { kind: 'recv', error: { message: 'ncclInvalidUsage (invalid usage) in ncclRecv(4 int32, peer 0, comm #0 rank 0)', ncclError: 'ncclInvalidUsage', call: 'ncclRecv(4 int32, peer 0, comm #0 rank 0)', status: 5 } };
    const e = thrown(() => c.recv(x, 0));
    expect(e).toBeInstanceOf(NcclError);
    expect((e as NcclError).code).toBe('NCCL_ERROR');
    expect(e.message).toBe('nccl recv: ncclInvalidUsage (invalid usage) in ncclRecv(4 int32, peer 0, comm #0 rank 0)');
    fake.failNext = { kind: 'send', error: { message: 'ncclSend: NCCL is not loaded (call ncclLoad first)', ncclError: 'NCCL_NOT_LOADED' } };
    expect(() => c.send(x, 0)).toThrow(NcclUnavailableError);
    fake.failNext = { kind: 'send', error: { message: 'ncclSend: communicator #0 has its rank on device 1', ncclError: 'NERVA_BAD_ARGS' } };
    expect(() => c.send(x, 0)).toThrow(CudaArgumentError);
  });

  it('groups: groupEnd needs a groupStart; group() closes on a throw', () => {
    const c = NcclCommunicator.init([backend(0)]);
    calls.length = 0;
    expect(() => c.groupEnd()).toThrow(/no group is open/);
    expect(() =>
      c.group(() => {
        throw new Error('boom');
      }),
    ).toThrow('boom');
    expect(calls).toEqual([['groupStart'], ['groupEnd']]);
    expect(() => c.groupEnd()).toThrow(/no group is open/);
    expect(c.group(() => 42)).toBe(42);
  });

  it('destroy: every local rank once; abort frees what a failed destroy left', () => {
    const a = backend(0);
    const b = backend(1);
    const c = NcclCommunicator.initAll([a, b]);
    const ids = fake.comms;
    calls.length = 0;
    fake.failNext = { kind: 'destroy', error: { message: 'ncclInternalError (internal error) in ncclCommDestroy(comm #1)', ncclError: 'ncclInternalError', call: 'ncclCommDestroy' } };
    expect(() => c.destroy()).toThrow(NcclError);
    expect(c.isDestroyed).toBe(false);
    c.abort();
    expect(c.isDestroyed).toBe(true);
    expect(calls).toEqual([['destroy', ids[0]], ['destroy', ids[1]], ['abort', ids[0]]]);
    c.destroy();
    expect(calls).toHaveLength(3);
    const x = a.alloc({ dtype: 'f32', length: 4 });
    expect(() => c.send(x, 1)).toThrow(/the NCCL communicator was destroyed/);
    expect(() => c.info()).toThrow(/destroyed/);
  });

  it('a disposed backend is refused', () => {
    const a = backend(0);
    const c = NcclCommunicator.init([a]);
    const x = a.alloc({ dtype: 'f32', length: 4 });
    a.dispose();
    expect(() => c.send(x, 0)).toThrow(CudaArgumentError); // its buffers are gone with it
    expect(() => NcclCommunicator.init([a])).toThrow(CudaDisposedError);
  });
});
