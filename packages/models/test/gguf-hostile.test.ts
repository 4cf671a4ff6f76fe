import { mkdir, truncate, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { GgufError, GgufFile, parseGgufHeader, type GgufErrorCode } from '../src/index.js';
import { f32, gguf, kv, kvStr, kvU32, str, T, tinfo, u32, u64, validSmall, type RawGguf } from './gguf-bytes.js';
import { tempDir } from './helpers.js';

function parseErr(bytes: Buffer): GgufError {
  try {
    parseGgufHeader(bytes, bytes.byteLength, 'hostile.gguf');
  } catch (e) {
    expect(e).toBeInstanceOf(GgufError);
    return e as GgufError;
  }
  throw new Error('expected the header to be refused');
}

const base = validSmall;
const with_ = (over: Partial<RawGguf>): Buffer => gguf({ ...base(), ...over });
const d = Buffer.alloc(64);

/** [case, bytes, expected code, a word the message must contain] */
const CASES: [string, () => Buffer, GgufErrorCode, string][] = [
  ['empty file', () => Buffer.alloc(0), 'TRUNCATED', 'magic'],
  ['bad magic', () => with_({ magic: Buffer.from('GGML') }), 'BAD_MAGIC', 'GGUF'],
  ['version 1 (obsolete)', () => with_({ version: 1 }), 'BAD_VERSION', 'obsolete'],
  ['version 4 (unknown)', () => with_({ version: 4 }), 'BAD_VERSION', 'version 4'],
  ['big-endian file', () => with_({ version: 0x03000000 }), 'BAD_VERSION', 'big-endian'],
  ['counts cut off', () => gguf(base()).subarray(0, 14), 'TRUNCATED', 'counts'],
  ['2^63 keys', () => with_({ nKv: 1n << 63n }), 'TOO_MANY_KEYS', 'keys'],
  ['2^40 tensors', () => with_({ nTensors: 1n << 40n }), 'TOO_MANY_TENSORS', 'tensors'],
  ['60,000 keys in a tiny file', () => with_({ nKv: 60_000 }), 'TRUNCATED', 'cannot fit'],
  ['key length 2^40', () => with_({ kvs: [Buffer.concat([str('k', 1n << 40n), u32(T.U32), u32(1)])] }), 'STRING_TOO_LONG', 'claims'],
  ['key runs past the end', () => with_({ kvs: [str('key', 5000)], tensors: [], data: Buffer.alloc(0) }), 'TRUNCATED', 'needs'],
  ['string value of 2^33 bytes', () => with_({ kvs: [kv('k', T.STR, str('x', 2n ** 33n))] }), 'STRING_TOO_LONG', '16777216'],
  ['key not UTF-8', () => with_({ kvs: [kv(Buffer.from([0xff, 0xfe, 0x41]), T.U32, u32(1))] }), 'BAD_STRING', 'UTF-8'],
  ['unknown value type 13', () => with_({ kvs: [kv('k', 13, u32(1))] }), 'UNKNOWN_VALUE_TYPE', '13'],
  ['array of arrays', () => with_({ kvs: [kv('k', T.ARR, Buffer.concat([u32(T.ARR), u64(1), u32(T.U8), u64(0)]))] }), 'NESTED_ARRAY', 'arrays of arrays'],
  ['array length 2^40', () => with_({ kvs: [kv('k', T.ARR, Buffer.concat([u32(T.U32), u64(1n << 40n)]))] }), 'ARRAY_TOO_LONG', 'claims'],
  ['array of 1M strings in a tiny file', () => with_({ kvs: [kv('k', T.ARR, Buffer.concat([u32(T.STR), u64(1_000_000)]))] }), 'TRUNCATED', 'at least'],
  ['array element type 77', () => with_({ kvs: [kv('k', T.ARR, Buffer.concat([u32(77), u64(1)]))] }), 'UNKNOWN_VALUE_TYPE', '77'],
  ['duplicate key', () => with_({ kvs: [kvU32('k', 1), kvU32('k', 2)] }), 'DUPLICATE_KEY', 'twice'],
  ['empty key', () => with_({ kvs: [kvU32('', 1)] }), 'BAD_METADATA', 'empty'],
  ['alignment 0', () => with_({ kvs: [kvU32('general.alignment', 0)] }), 'BAD_ALIGNMENT', 'power of two'],
  ['alignment 48', () => with_({ kvs: [kvU32('general.alignment', 48)] }), 'BAD_ALIGNMENT', 'power of two'],
  ['alignment as a string', () => with_({ kvs: [kvStr('general.alignment', '32')] }), 'BAD_ALIGNMENT', 'UINT32'],
  ['empty tensor name', () => with_({ tensors: [tinfo('', [4], 0, 0)] }), 'BAD_TENSOR_NAME', 'empty'],
  ['64-byte tensor name', () => with_({ tensors: [tinfo('x'.repeat(64), [4], 0, 0)] }), 'BAD_TENSOR_NAME', '63'],
  ['duplicate tensor name', () => with_({ tensors: [tinfo('a', [4], 0, 0), tinfo('a', [4], 0, 32)] }), 'DUPLICATE_TENSOR', 'twice'],
  ['0 dimensions', () => with_({ tensors: [tinfo('a', [], 0, 0)] }), 'BAD_DIMS', '0 dimensions'],
  ['5 dimensions', () => with_({ tensors: [tinfo('a', [1, 1, 1, 1, 1], 0, 0)] }), 'BAD_DIMS', '5 dimensions'],
  ['dims whose product overflows', () => with_({ tensors: [tinfo('a', [1n << 32n, 1n << 32n], 0, 0)] }), 'DIMS_OVERFLOW', 'overflow'],
  ['one dim of 2^60', () => with_({ tensors: [tinfo('a', [1n << 60n], 0, 0)] }), 'DIMS_OVERFLOW', 'overflow'],
  ['dim of 2^64-1', () => with_({ tensors: [tinfo('a', [2n ** 64n - 1n], 0, 0)] }), 'DIMS_OVERFLOW', 'overflow'],
  ['unknown type id 99', () => with_({ tensors: [tinfo('a', [4], 99, 0)] }), 'UNKNOWN_TYPE', 'unknown ggml type id 99'],
  ['IQ2_XXS (id 16) is named in the refusal', () => with_({ tensors: [tinfo('a', [256], 16, 0)] }), 'UNKNOWN_TYPE', 'IQ2_XXS'],
  ['Q8_0 row of 33 elements', () => with_({ tensors: [tinfo('a', [33, 2], 8, 0)], data: d }), 'NOT_BLOCK_MULTIPLE', 'block size 32'],
  ['Q4_K row of 128 elements', () => with_({ tensors: [tinfo('a', [128], 12, 0)], data: d }), 'NOT_BLOCK_MULTIPLE', '256'],
  ['misaligned offset', () => with_({ tensors: [tinfo('a', [4], 0, 4)] }), 'MISALIGNED', 'alignment 32'],
  ['offset misaligned for a 64-byte alignment', () => with_({ kvs: [kvU32('general.alignment', 64)], tensors: [tinfo('a', [4], 0, 32)] }), 'MISALIGNED', 'alignment 64'],
  ['offset past the end of the file', () => with_({ tensors: [tinfo('a', [4], 0, 1n << 40n)] }), 'OUT_OF_RANGE', 'past the end'],
  ['tensor runs past the data', () => with_({ tensors: [tinfo('a', [64], 0, 0)] }), 'OUT_OF_RANGE', 'run past'],
  ['overlapping tensors', () => with_({ tensors: [tinfo('a', [8], 0, 0), tinfo('b', [4], 0, 0)] }), 'OVERLAP', 'overlap'],
  ['overlap listed out of order', () => with_({ tensors: [tinfo('b', [4], 0, 32), tinfo('a', [12], 0, 0)] }), 'OVERLAP', 'overlap'],
  ['cut inside the tensor infos', () => gguf({ ...base(), data: Buffer.alloc(0) }).subarray(0, 120), 'TRUNCATED', 'needs'],
  ['a float value cut short', () => Buffer.concat([Buffer.from('GGUF'), u32(3), u64(0), u64(1), str('k'), u32(T.F32), f32(1).subarray(0, 2)]), 'TRUNCATED', 'FLOAT32'],
];

describe('hostile GGUF headers: each refused with a clear code', () => {
  it('has at least 30 distinct cases', () => {
    expect(CASES.length).toBeGreaterThanOrEqual(30);
  });

  it.each(CASES)('%s', (_name, make, code, word) => {
    const e = parseErr(make());
    expect(e.code).toBe(code);
    expect(e.message).toContain(word);
    expect(e.message).toContain('hostile.gguf');
    expect(e.message).toContain(`[${code}]`);
  });

  it('the valid base file parses (so each case fails for its own fault)', () => {
    const h = parseGgufHeader(gguf(base()));
    expect(h.tensors.map((t) => [t.name, t.byteLength])).toEqual([['a.weight', 16], ['b.weight', 16]]);
    expect(h.metadata.get('some.strings')).toEqual({ type: 'ARRAY', value: { itemType: 'STRING', items: ['a', 'bc', ''] } });
  });

  it('names the key or tensor at fault', () => {
    expect(parseErr(with_({ kvs: [kvU32('dup', 1), kvU32('dup', 1)] })).key).toBe('dup');
    expect(parseErr(with_({ tensors: [tinfo('t.weight', [4], 99, 0)] })).tensor).toBe('t.weight');
  });

  it('truncated at every byte of the header and at points in the data: TRUNCATED or OUT_OF_RANGE, never anything else', () => {
    const full = gguf(base());
    const seen = new Set<string>();
    for (let n = 0; n < full.byteLength; n++) {
      const e = parseErr(full.subarray(0, n));
      expect(['TRUNCATED', 'OUT_OF_RANGE']).toContain(e.code);
      seen.add(e.code);
    }
    expect(seen).toEqual(new Set(['TRUNCATED', 'OUT_OF_RANGE']));
  });
});

describe('GgufFile on disk', () => {
  it('NOT_FOUND for a missing file, IO for a folder', async () => {
    const dir = await tempDir();
    await expect(GgufFile.open(join(dir, 'none.gguf'))).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await mkdir(join(dir, 'x.gguf'));
    await expect(GgufFile.open(join(dir, 'x.gguf'))).rejects.toMatchObject({ code: 'IO' });
  });

  it('reads a header larger than its first read in growing steps', async () => {
    const p = join(await tempDir(), 'big.gguf');
    const big = 'y'.repeat(3 * 1024 * 1024);
    await writeFile(p, gguf({ ...base(), kvs: [kvStr('general.architecture', 'llama'), kvStr('big', big)] }));
    const f = await GgufFile.open(p);
    try {
      expect((f.get('big')!.value as string).length).toBe(big.length);
      expect([...(await f.readTensor('b.weight'))]).toEqual(new Array(16).fill(1));
    } finally {
      await f.close();
    }
  });

  it('bounded range reads: out-of-range ranges refused, closed files CLOSED, a file that shrank TRUNCATED', async () => {
    const p = join(await tempDir(), 'small.gguf');
    const bytes = gguf(base());
    await writeFile(p, bytes);
    const f = await GgufFile.open(p);
    await expect(f.readTensorRange('a.weight', 8, new Uint8Array(16))).rejects.toBeInstanceOf(RangeError);
    await expect(f.readTensor('nope')).rejects.toMatchObject({ code: 'MISSING_TENSOR' });
    await truncate(p, bytes.byteLength - 8);
    await expect(f.readTensor('b.weight')).rejects.toMatchObject({ code: 'TRUNCATED', tensor: 'b.weight' });
    await f.close();
    await expect(f.readTensor('a.weight')).rejects.toMatchObject({ code: 'CLOSED' });
  });
});
