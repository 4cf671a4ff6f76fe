import { chmodSync, chownSync, existsSync, fstatSync, mkdirSync, readdirSync, readFileSync, statfsSync, symlinkSync, ftruncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { f32ToBf16, f32ToF16 } from '@nerva/core';
import { afterEach, describe, expect, it } from 'vitest';
import { DiskSpill, OffloadDirError, type SpillTensor } from '../src/index.js';
import { distUrl, NOBODY, runAsNobody, tempDir } from './helpers.js';

/** The spill's open file (its name is unlinked once open). */
const fdOf = (s: DiskSpill): number => (s as unknown as { fd: number }).fd;

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

function dir(): string {
  const t = tempDir('nerva-spill-test-');
  cleanups.push(t.cleanup);
  return t.dir;
}

const TENSORS: SpillTensor[] = [
  { name: 'w', dtype: 'f32', length: 10 },
  { name: 'h', dtype: 'bf16', length: 6 },
  { name: 'g', dtype: 'f16', length: 4 },
  { name: 'i', dtype: 'i32', length: 3 },
];
const LAYOUT = new Map([
  ['a', TENSORS],
  ['b', TENSORS],
]);
const BYTES = 2 * (10 * 4 + 6 * 2 + 4 * 2 + 3 * 4);

function open(d: string, layout: ReadonlyMap<string, readonly SpillTensor[]> = LAYOUT): DiskSpill {
  const s = DiskSpill.open(d, layout);
  cleanups.push(() => s.dispose());
  return s;
}

function offloadError(fn: () => unknown): OffloadDirError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(OffloadDirError);
    expect((e as OffloadDirError).code).toBe('OFFLOAD_DIR');
    return e as OffloadDirError;
  }
  throw new Error('expected an OffloadDirError');
}

function read(s: DiskSpill, id: string, name: string, bytes: number): Uint8Array {
  const out = new Uint8Array(bytes);
  s.readInto(id, name, out);
  return out;
}

const bytesOf = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

describe('DiskSpill.open: the offload dir', () => {
  it('refuses a missing directory, naming it', () => {
    const missing = join(dir(), 'no-such-dir');
    const err = offloadError(() => DiskSpill.open(missing, LAYOUT));
    expect(err.dir).toBe(missing);
    expect(err.message).toBe(`offload dir ${missing}: cannot be read (ENOENT)`);
    expect(err.cause).toBeDefined();
  });

  it('refuses a file in place of a directory', () => {
    const file = join(dir(), 'f');
    writeFileSync(file, 'x');
    expect(offloadError(() => DiskSpill.open(file, LAYOUT)).message).toBe(`offload dir ${file}: is not a directory`);
  });

  it('refuses a directory it cannot write (as root: checked as the unprivileged user nobody)', () => {
    const d = dir();
    const locked = join(d, 'locked');
    mkdirSync(locked);
    chmodSync(locked, 0o500);
    cleanups.push(() => chmodSync(locked, 0o700));
    if (process.getuid?.() === 0) {
      // Root writes whatever the mode says: nobody, owning the folder (so that only the missing
      // write bit stops it) and able to reach it, runs the same open in a child process.
      chmodSync(d, 0o755);
      chownSync(locked, NOBODY, NOBODY);
      const got = runAsNobody(`
        import { DiskSpill } from ${JSON.stringify(distUrl.href)};
        try {
          DiskSpill.open(${JSON.stringify(locked)}, new Map(${JSON.stringify([...LAYOUT])})).dispose();
          console.log(JSON.stringify({ opened: true }));
        } catch (e) {
          console.log(JSON.stringify({ name: e.name, code: e.code, message: e.message }));
        }`);
      expect(got).toEqual({ name: 'OffloadDirError', code: 'OFFLOAD_DIR', message: `offload dir ${locked}: is not readable and writable (EACCES)` });
      expect(readdirSync(locked)).toEqual([]);
      return;
    }
    const err = offloadError(() => DiskSpill.open(locked, LAYOUT));
    expect(err.message).toMatch(/is not readable and writable \(EACCES\)/);
    expect(readdirSync(locked)).toEqual([]);
  });

  it('refuses a layout larger than the free space, before writing anything', () => {
    const d = dir();
    const st = statfsSync(d);
    const free = st.bavail * st.bsize;
    const huge = new Map([['x', [{ name: 'w', dtype: 'f32' as const, length: Math.ceil(free / 4) + 2 ** 20 }]]]);
    const err = offloadError(() => DiskSpill.open(d, huge));
    expect(err.message).toMatch(/needs .* for the disk tier, .* free$/);
    expect(err.message).toContain('free');
    expect(readdirSync(d)).toEqual([]);
  });

  it('creates one private spill file of its own, exclusively, and unlinks it once open (nothing stays after a crash)', () => {
    const d = dir();
    const s = open(d);
    expect(s.bytes).toBe(BYTES);
    expect(s.file.startsWith(join(d, `nerva-spill-${process.pid}-`))).toBe(true);
    expect(s.file).toMatch(new RegExp(`nerva-spill-${process.pid}-[0-9a-f]{8}\\.bin$`));
    // Unlinked at once: the directory is empty while the spill is in use.
    expect(readdirSync(d)).toEqual([]);
    expect(fstatSync(fdOf(s)).mode & 0o777).toBe(0o600);
    // Two spills in one dir never share a file.
    const other = open(d);
    expect(other.file).not.toBe(s.file);
    s.dispose();
    expect(existsSync(s.file)).toBe(false);
    other.dispose();
    expect(readdirSync(d)).toEqual([]);
    s.dispose();
  });

  it('never follows a symlink planted at its file name (created exclusively)', () => {
    const d = dir();
    const target = join(d, 'victim');
    writeFileSync(target, 'keep');
    // Every name a spill could take cannot be planted; a planted one makes the open fail, never write through.
    const planted = join(d, `nerva-spill-${process.pid}-00000000.bin`);
    symlinkSync(target, planted);
    const s = open(d);
    expect(s.file).not.toBe(planted);
    s.dispose();
    expect(readFileSync(target, 'utf8')).toBe('keep');
  });

  it('takes an empty layout', () => {
    const s = open(dir(), new Map());
    expect(s.bytes).toBe(0);
  });
});

describe('DiskSpill: round trips', () => {
  it('stores float32 data as it is', () => {
    const s = open(dir());
    const w = Float32Array.from({ length: 10 }, (_, i) => i * 1.5 - 3.1);
    s.write('a', 'w', w);
    expect(read(s, 'a', 'w', 40)).toEqual(bytesOf(w));
    expect(new Float32Array(read(s, 'a', 'w', 40).buffer)).toEqual(w);
  });

  it('stores bf16 from float32 (rounded to nearest even) and from raw bits', () => {
    const s = open(dir());
    const x = Float32Array.from([1, -2.5, 3.14159, 1e-3, 65504.5, -0]);
    s.write('a', 'h', x);
    expect(Array.from(new Uint16Array(read(s, 'a', 'h', 12).buffer))).toEqual(Array.from(x, (v) => f32ToBf16(v)));
    const bits = Uint16Array.from([0x3f80, 0xc020, 0x7f80, 0x0001, 0xffff, 0x1234]);
    s.write('b', 'h', bits);
    expect(new Uint16Array(read(s, 'b', 'h', 12).buffer)).toEqual(bits);
  });

  it('stores f16 from float32 and i32 as it is', () => {
    const s = open(dir());
    const g = Float32Array.from([0.5, -1, 1000, 1e-5]);
    s.write('b', 'g', g);
    expect(Array.from(new Uint16Array(read(s, 'b', 'g', 8).buffer))).toEqual(Array.from(g, (v) => f32ToF16(v)));
    const i = Int32Array.from([-1, 2 ** 31 - 1, 7]);
    s.write('b', 'i', i);
    expect(new Int32Array(read(s, 'b', 'i', 12).buffer)).toEqual(i);
  });

  it('writes at element offsets and keeps tensors apart', () => {
    const s = open(dir());
    for (const id of ['a', 'b']) {
      const base = id === 'a' ? 0 : 100;
      s.write(id, 'w', Float32Array.from({ length: 6 }, (_, i) => base + i));
      s.write(id, 'w', Float32Array.from({ length: 4 }, (_, i) => base + 6 + i), 6);
      s.write(id, 'h', Uint16Array.from({ length: 6 }, (_, i) => base + i));
      s.write(id, 'g', Uint16Array.from({ length: 4 }, (_, i) => base + 50 + i));
      s.write(id, 'i', Int32Array.from({ length: 3 }, (_, i) => -(base + i) - 1));
    }
    for (const id of ['a', 'b']) {
      const base = id === 'a' ? 0 : 100;
      expect(Array.from(new Float32Array(read(s, id, 'w', 40).buffer))).toEqual(Array.from({ length: 10 }, (_, i) => base + i));
      expect(Array.from(new Uint16Array(read(s, id, 'h', 12).buffer))).toEqual(Array.from({ length: 6 }, (_, i) => base + i));
      expect(Array.from(new Uint16Array(read(s, id, 'g', 8).buffer))).toEqual(Array.from({ length: 4 }, (_, i) => base + 50 + i));
      expect(Array.from(new Int32Array(read(s, id, 'i', 12).buffer))).toEqual(Array.from({ length: 3 }, (_, i) => -(base + i) - 1));
    }
    expect(fstatSync(fdOf(s)).size).toBe(BYTES);
    // Reads are counted: bytes and time.
    expect(s.readBytes).toBe(2 * (40 + 12 + 8 + 12));
    expect(s.readMs).toBeGreaterThanOrEqual(0);
  });

  it('reads into a larger destination, leaving the rest alone', () => {
    const s = open(dir());
    s.write('a', 'i', Int32Array.from([1, 2, 3]));
    const out = new Uint8Array(16).fill(0xee);
    s.readInto('a', 'i', out);
    expect(Array.from(new Int32Array(out.buffer, 0, 3))).toEqual([1, 2, 3]);
    expect(Array.from(out.subarray(12))).toEqual([0xee, 0xee, 0xee, 0xee]);
  });

  it('refuses ranges, names and array types that do not fit', () => {
    const s = open(dir());
    expect(() => s.write('a', 'w', new Float32Array(11))).toThrow(RangeError);
    expect(() => s.write('a', 'w', new Float32Array(4), 7)).toThrow(/range \[7, 11\) outside 10/);
    expect(() => s.write('a', 'w', new Float32Array(1), -1)).toThrow(RangeError);
    expect(() => s.write('a', 'nope', new Float32Array(1))).toThrow(/no tensor nope in block a/);
    expect(() => s.write('c', 'w', new Float32Array(1))).toThrow(/no tensor w in block c/);
    expect(() => s.write('a', 'w', new Uint16Array(2))).toThrow(TypeError);
    expect(() => s.write('a', 'h', new Int32Array(2))).toThrow(/cannot be stored as bf16/);
    expect(() => s.readInto('a', 'w', new Uint8Array(39))).toThrow(/destination of 39 bytes for 40/);
    expect(() => s.readInto('a', 'nope', new Uint8Array(64))).toThrow(RangeError);
  });
});

describe('DiskSpill: a damaged file', () => {
  it('reports a truncated spill file as an offload dir error, naming the file', () => {
    const d = dir();
    const s = open(d);
    for (const id of ['a', 'b']) for (const t of TENSORS) s.write(id, t.name, t.dtype === 'f32' ? new Float32Array(t.length) : t.dtype === 'i32' ? new Int32Array(t.length) : new Uint16Array(t.length));
    expect(fstatSync(fdOf(s)).size).toBe(BYTES);
    ftruncateSync(fdOf(s), BYTES - 20);
    // The first block is intact; the last tensors of the second are cut.
    expect(read(s, 'a', 'w', 40)).toHaveLength(40);
    const err = offloadError(() => read(s, 'b', 'i', 12));
    expect(err.dir).toBe(d);
    expect(err.message).toContain(`spill file ${s.file} is truncated`);
  });

  it('reads a tensor never written as missing, not as zeros', () => {
    const s = open(dir());
    s.write('a', 'w', new Float32Array(10));
    expect(() => read(s, 'b', 'i', 12)).toThrow(OffloadDirError);
  });
});
