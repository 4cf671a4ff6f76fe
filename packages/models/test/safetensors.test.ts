import { open, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { f32ToBf16, f32ToF16, NervaError } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import { CheckpointError, MAX_HEADER_BYTES, SafetensorsFile } from '../src/index.js';
import { tempDir, writeSafetensors } from './helpers.js';

async function expectCode(p: Promise<unknown>, code: string, ...inMessage: string[]): Promise<CheckpointError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(CheckpointError);
  expect(err).toBeInstanceOf(NervaError);
  const ce = err as CheckpointError;
  expect(ce.code).toBe(code);
  for (const s of inMessage) expect(ce.message).toContain(s);
  return ce;
}

describe('SafetensorsFile: valid files', () => {
  it('reads F32, F16 and BF16 tensors and metadata', async () => {
    const dir = await tempDir();
    const a = Float32Array.from([1.5, -2, 3.25, 0]);
    const b = Uint16Array.from([0.5, -1.25, 65504].map(f32ToF16));
    const c = Uint16Array.from([3.140625, -0.015625].map(f32ToBf16));
    const data = Buffer.concat([Buffer.from(a.buffer), Buffer.from(b.buffer), Buffer.from(c.buffer)]);
    const path = await writeSafetensors(
      join(dir, 'ok.safetensors'),
      {
        __metadata__: { format: 'pt' },
        c: { dtype: 'BF16', shape: [2], data_offsets: [22, 26] },
        a: { dtype: 'F32', shape: [2, 2], data_offsets: [0, 16] },
        b: { dtype: 'F16', shape: [3], data_offsets: [16, 22] },
        empty: { dtype: 'F32', shape: [0, 4], data_offsets: [16, 16] },
      },
      data,
    );
    const f = await SafetensorsFile.open(path);
    try {
      expect(f.metadata).toEqual({ format: 'pt' });
      expect(f.names()).toEqual(['a', 'b', 'empty', 'c']); // file order
      const hdrLen = f.dataOffset - 8;
      expect(f.info('b')).toEqual({ dtype: 'F16', shape: [3], byteOffset: 8 + hdrLen + 16, byteLength: 6 });
      expect(Array.from(await f.readF32('a'))).toEqual([1.5, -2, 3.25, 0]);
      expect(Array.from(await f.readF32('b'))).toEqual([0.5, -1.25, 65504]);
      expect(Array.from(await f.readF32('c'))).toEqual([3.140625, -0.015625]);
      expect(Array.from(await f.readRaw('c'))).toEqual(Array.from(new Uint8Array(c.buffer)));
      expect((await f.readF32('empty')).length).toBe(0);
      expect(f.totalBytes).toBe(26);
      await expectCode(f.readRaw('nope'), 'MISSING_TENSOR', 'nope', path);
    } finally {
      await f.close();
    }
    await expectCode(f.readRaw('a'), 'CLOSED');
  });

  it('knows non-float dtypes for inspection but refuses to read them as float', async () => {
    const dir = await tempDir();
    const path = await writeSafetensors(
      join(dir, 'ints.safetensors'),
      {
        ids: { dtype: 'I64', shape: [2], data_offsets: [0, 16] },
        mask: { dtype: 'BOOL', shape: [3], data_offsets: [16, 19] },
        d: { dtype: 'F64', shape: [1], data_offsets: [24, 32] },
      },
      new Uint8Array(32),
    );
    const f = await SafetensorsFile.open(path);
    expect(f.info('ids').dtype).toBe('I64');
    expect(f.info('mask').byteLength).toBe(3);
    expect((await f.readRaw('ids')).byteLength).toBe(16);
    await expectCode(f.readF32('ids'), 'UNSUPPORTED_DTYPE', 'I64', 'ids');
    await expectCode(f.readF32('d'), 'UNSUPPORTED_DTYPE', 'F64');
    await f.close();
  });

  it('readRawInto fills a caller buffer and rejects a short one', async () => {
    const dir = await tempDir();
    const path = await writeSafetensors(join(dir, 'x.safetensors'), { t: { dtype: 'U8', shape: [4], data_offsets: [0, 4] } }, Uint8Array.from([9, 8, 7, 6]));
    const f = await SafetensorsFile.open(path);
    const dst = new Uint8Array(6);
    await f.readRawInto('t', dst);
    expect(Array.from(dst)).toEqual([9, 8, 7, 6, 0, 0]);
    await expect(f.readRawInto('t', new Uint8Array(3))).rejects.toThrow(RangeError);
    await f.close();
  });
});

describe('SafetensorsFile: broken files give typed errors naming the file', () => {
  it('file shorter than 8 bytes → TRUNCATED', async () => {
    const path = join(await tempDir(), 'short.safetensors');
    await writeFile(path, Buffer.from([1, 2, 3]));
    await expectCode(SafetensorsFile.open(path), 'TRUNCATED', path, '3 bytes');
  });

  it('missing file → NOT_FOUND', async () => {
    const path = join(await tempDir(), 'absent.safetensors');
    await expectCode(SafetensorsFile.open(path), 'NOT_FOUND', path);
  });

  it('header length past end of file → HEADER_LENGTH', async () => {
    const path = join(await tempDir(), 'len.safetensors');
    const b = Buffer.alloc(8 + 10);
    b.writeBigUInt64LE(11n); // one byte more than the file holds
    await writeFile(path, b);
    await expectCode(SafetensorsFile.open(path), 'HEADER_LENGTH', path, '11');
  });

  // "Fast" is the allocation check: a wall-clock bound would be a timed unit test (flaky on a loaded CI machine).
  it('a giant claimed header length fails fast without allocating it', async () => {
    const path = join(await tempDir(), 'giant.safetensors');
    const b = Buffer.alloc(64);
    b.writeBigUInt64LE(0xffff_ffff_ffff_fff0n);
    await writeFile(path, b);
    const before = process.memoryUsage().arrayBuffers;
    await expectCode(SafetensorsFile.open(path), 'HEADER_LENGTH', path);
    expect(process.memoryUsage().arrayBuffers - before).toBeLessThan(16 * 1024 * 1024);
  });

  it('a header over the cap → HEADER_TOO_LARGE, checked before reading it', async () => {
    // A sparse file big enough that the claimed length is "in range" but over the cap.
    const path = join(await tempDir(), 'huge.safetensors');
    const fh = await open(path, 'w');
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(MAX_HEADER_BYTES + 1));
    await fh.write(len, 0, 8, 0);
    await fh.truncate(MAX_HEADER_BYTES + 64);
    await fh.close();
    const before = process.memoryUsage().arrayBuffers;
    await expectCode(SafetensorsFile.open(path), 'HEADER_TOO_LARGE', path);
    expect(process.memoryUsage().arrayBuffers - before).toBeLessThan(16 * 1024 * 1024);
  });

  it('header not JSON → HEADER_NOT_JSON', async () => {
    const dir = await tempDir();
    await expectCode(SafetensorsFile.open(await writeSafetensors(join(dir, 'a.safetensors'), '{"t": {')), 'HEADER_NOT_JSON', 'a.safetensors');
    await expectCode(SafetensorsFile.open(await writeSafetensors(join(dir, 'b.safetensors'), '[1, 2]')), 'HEADER_NOT_JSON', 'not an object');
    const bad = join(dir, 'c.safetensors');
    const b = Buffer.alloc(8 + 4);
    b.writeBigUInt64LE(4n);
    b.set([0x7b, 0xff, 0xfe, 0x7d], 8); // invalid UTF-8 inside braces
    await writeFile(bad, b);
    await expectCode(SafetensorsFile.open(bad), 'HEADER_NOT_JSON');
  });

  it('entry missing dtype / shape / data_offsets → BAD_ENTRY naming the tensor', async () => {
    const dir = await tempDir();
    const cases: [string, unknown][] = [
      ['nodtype', { shape: [1], data_offsets: [0, 4] }],
      ['noshape', { dtype: 'F32', data_offsets: [0, 4] }],
      ['nooffsets', { dtype: 'F32', shape: [1] }],
      ['negshape', { dtype: 'F32', shape: [-1], data_offsets: [0, 4] }],
      ['backwards', { dtype: 'F32', shape: [1], data_offsets: [4, 0] }],
    ];
    for (const [name, entry] of cases) {
      const p = await writeSafetensors(join(dir, `${name}.safetensors`), { [name]: entry }, new Uint8Array(8));
      await expectCode(SafetensorsFile.open(p), 'BAD_ENTRY', `"${name}"`);
    }
  });

  it('unknown dtype → UNKNOWN_DTYPE', async () => {
    const p = await writeSafetensors(join(await tempDir(), 'dt.safetensors'), { w: { dtype: 'Q4_K', shape: [2], data_offsets: [0, 2] } }, new Uint8Array(2));
    await expectCode(SafetensorsFile.open(p), 'UNKNOWN_DTYPE', 'Q4_K', '"w"');
  });

  it('shape not matching byte size → SHAPE_MISMATCH', async () => {
    const p = await writeSafetensors(join(await tempDir(), 'sh.safetensors'), { w: { dtype: 'BF16', shape: [2, 3], data_offsets: [0, 10] } }, new Uint8Array(12));
    await expectCode(SafetensorsFile.open(p), 'SHAPE_MISMATCH', '[2, 3]', '12 bytes', 'span 10');
  });

  it('offsets out of range of the data section → OFFSET_OUT_OF_RANGE', async () => {
    const p = await writeSafetensors(join(await tempDir(), 'oor.safetensors'), { w: { dtype: 'F32', shape: [4], data_offsets: [8, 24] } }, new Uint8Array(20));
    await expectCode(SafetensorsFile.open(p), 'OFFSET_OUT_OF_RANGE', '"w"', '20-byte');
  });

  it('overlapping tensors → OVERLAP', async () => {
    const p = await writeSafetensors(
      join(await tempDir(), 'ov.safetensors'),
      { a: { dtype: 'F32', shape: [4], data_offsets: [0, 16] }, b: { dtype: 'F32', shape: [2], data_offsets: [12, 20] } },
      new Uint8Array(20),
    );
    await expectCode(SafetensorsFile.open(p), 'OVERLAP', '"b"', '"a"');
  });

  it('a file truncated after its header was written → TRUNCATED on read', async () => {
    const dir = await tempDir();
    const p = await writeSafetensors(join(dir, 'tr.safetensors'), { a: { dtype: 'F32', shape: [4], data_offsets: [0, 16] } }, new Uint8Array(16));
    const f = await SafetensorsFile.open(p);
    const fh = await open(p, 'r+');
    await fh.truncate(f.dataOffset + 4);
    await fh.close();
    await expectCode(f.readRaw('a'), 'TRUNCATED', '"a"');
    await f.close();
  });
});
