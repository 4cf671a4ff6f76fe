import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createNcclUniqueId, loadNccl, NcclError } from '../src/index.js';
import { fromNativeNccl } from '../src/errors.js';
import type { NativeAddon, NativeNccl } from '../src/native.js';
import { addon as loadedAddon, addonError, failEachUnless, gpuTestsRequired, skipGpuSuite } from './gpu-world.js';

// The addon's NCCL glue (native/nccl_dl.cc) against a stub libnccl.so.2 compiled here
// (test/fixtures/nccl_stub.c): loading, symbol checks, version and path, the unique id, the
// communicator table and the error text, all without a GPU. Skipped where the addon is not built
// or there is no C compiler; failed instead in the GPU test phase (NERVA_GPU_TESTS=1,
// test/gpu-world.ts). A process loads one library for good, so the order below matters (vitest
// runs each test file in its own process).

const hasCc = spawnSync('cc', ['--version'], { stdio: 'ignore' }).status === 0;
const missing = !loadedAddon
  ? (addonError ?? 'CUDA addon not loadable')
  : typeof loadedAddon.ncclLoad !== 'function'
    ? 'the addon was built without NCCL support'
    : hasCc
      ? null
      : 'no C compiler (cc) to build the stub libnccl.so.2';
const addon = missing === null ? (loadedAddon as NativeAddon & NativeNccl) : null;
const stubSrc = path.resolve(path.dirname(fileURLToPath(import.meta.url)), 'fixtures', 'nccl_stub.c');

/** Runs fn with environment variable `name` set to `value` (or unset), then restores it. */
function withEnv<T>(name: string, value: string | undefined, fn: () => T): T {
  const saved = process.env[name];
  if (value === undefined) delete process.env[name];
  else process.env[name] = value;
  try {
    return fn();
  } finally {
    if (saved === undefined) delete process.env[name];
    else process.env[name] = saved;
  }
}

/** The exception fn throws (fails the test when it throws none). */
function thrown(fn: () => unknown): Error & Record<string, unknown> {
  try {
    fn();
  } catch (e) {
    return e as Error & Record<string, unknown>;
  }
  throw new Error('expected an exception');
}

describe.skipIf(skipGpuSuite(missing))("the addon's NCCL glue against a stub libnccl.so.2", () => {
  failEachUnless(missing, "the addon's NCCL glue cannot be tested");
  let tmp = '';
  let goodDir = '';
  let badDir = '';
  // A machine with a real NCCL on the loader path loads that instead of the stubs: the checks
  // that need the stub are skipped there. The GPU test phase puts a stub lacking ncclSend first
  // on LD_LIBRARY_PATH, so the loader's search refuses it and every check runs.
  let systemNccl = false;

  beforeAll(() => {
    if (missing !== null) return;
    tmp = mkdtempSync(path.join(os.tmpdir(), 'nerva-nccl-stub-'));
    goodDir = path.join(tmp, 'good');
    badDir = path.join(tmp, 'bad');
    for (const [dir, extra] of [[goodDir, []], [badDir, ['-DSTUB_NO_SEND']]] as const) {
      mkdirSync(dir);
      const r = spawnSync('cc', ['-shared', '-fPIC', ...extra, '-o', path.join(dir, 'libnccl.so.2'), stubSrc], { encoding: 'utf8' });
      if (r.status !== 0) throw new Error(`cc failed: ${r.stderr}`);
    }
  });
  afterAll(() => {
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  it('refuses a library lacking a needed symbol and names every candidate it tried', () => {
    const r = withEnv('NERVA_NCCL_PATH', badDir, () => addon!.ncclLoad(['/nonexistent/nccl/lib']));
    if (r.ok && !gpuTestsRequired) {
      systemNccl = true;
      return;
    }
    // In the GPU test phase a real NCCL must not be reached (see systemNccl above).
    expect(r.ok, `loaded ${r.path}: a real libnccl.so.2 is on the loader path`).toBe(false);
    expect(r.error).toContain(`${path.join(badDir, 'libnccl.so.2')} (lacks ncclSend`);
    expect(r.error).toMatch(/; libnccl\.so\.2 \(/);
    expect(r.error).toContain('/nonexistent/nccl/lib/libnccl.so.2 (');
  });

  it('loads from a candidate directory and reports version, path and ncclCommInitAll', ({ skip }) => {
    if (systemNccl) skip();
    const s = withEnv('NERVA_NCCL_PATH', undefined, () => loadNccl({ candidateDirs: ['/nonexistent', goodDir] }));
    expect(s).toEqual({ available: true, version: '2.28.3', versionCode: 22803, path: path.join(goodDir, 'libnccl.so.2'), initAll: true });
    // Loaded for good: later calls report it whatever they are given.
    expect(loadNccl({ candidateDirs: [] }).path).toBe(s.path);
    expect(addon!.ncclDataTypes).toMatchObject({ int8: 0, int32: 2, float16: 6, float32: 7, bfloat16: 9 });
    expect(addon!.ncclUniqueIdBytes).toBe(128);
  });

  it('hands out the 128-byte unique id', ({ skip }) => {
    if (systemNccl) skip();
    const id = createNcclUniqueId();
    expect(id).toBeInstanceOf(Uint8Array);
    expect(id.length).toBe(128);
    expect([id[0], id[1], id[127]]).toEqual([3, 10, (127 * 7 + 3) & 255]);
  });

  it("names the call, the ncclResult_t and ncclGetErrorString's text in errors", ({ skip }) => {
    if (systemNccl) skip();
    const e = thrown(() => addon!.ncclGroupEnd());
    expect(e.message).toBe('ncclInvalidUsage (invalid usage (run with NCCL_DEBUG=WARN for details)) in ncclGroupEnd: stub: ncclGroupEnd without ncclGroupStart');
    expect([e.ncclError, e.call, e.status]).toEqual(['ncclInvalidUsage', 'ncclGroupEnd', 5]);
    const typed = fromNativeNccl(e, 'nccl groupEnd');
    expect(typed).toBeInstanceOf(NcclError);
    expect((typed as NcclError).code).toBe('NCCL_ERROR');
    expect((typed as NcclError).ncclError).toBe('ncclInvalidUsage');
    addon!.ncclGroupStart();
    addon!.ncclGroupEnd();
  });

  it('keeps ncclCommInitAll communicators in the table until destroyed', ({ skip }) => {
    if (systemNccl) skip();
    const ids = addon!.ncclCommInitAll([3, 5]);
    expect(ids).toHaveLength(2);
    expect(addon!.ncclCommInfo(ids[0])).toEqual({ nranks: 2, rank: 0, device: 3 });
    expect(addon!.ncclCommInfo(ids[1])).toEqual({ nranks: 2, rank: 1, device: 5 });
    addon!.ncclCommDestroy(ids[0]);
    addon!.ncclCommAbort(ids[1]);
    const e = thrown(() => addon!.ncclCommDestroy(ids[0]));
    expect(e.message).toMatch(new RegExp(`unknown NCCL communicator #${ids[0]}`));
    expect(e.ncclError).toBe('NERVA_BAD_ARGS');
    const f = thrown(() => addon!.ncclCommInitAll([0, 9]));
    expect(f.message).toBe('ncclUnhandledCudaError (unhandled cuda error (run with NCCL_DEBUG=INFO for details)) in ncclCommInitAll(devices 0,9): stub: no such device');
  });

  it('rejects malformed arguments before calling NCCL', ({ skip }) => {
    if (systemNccl) skip();
    for (const bad of [[], [-1], [1.5], ['0']] as unknown[][]) {
      const e = thrown(() => addon!.ncclCommInitAll(bad as number[]));
      expect(e.ncclError).toBe('NERVA_BAD_ARGS');
    }
    expect(thrown(() => addon!.ncclCommInfo(-1)).ncclError).toBe('NERVA_BAD_ARGS');
    expect(thrown(() => addon!.ncclCommInfo(1e6)).message).toMatch(/unknown NCCL communicator #1000000/);
  });
});
