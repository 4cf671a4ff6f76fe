/**
 * A byte-level GGUF builder for tests: it writes whatever it is told, valid or not (the real
 * writer refuses invalid input), so hostile files can be made field by field.
 */

export const T = { U8: 0, I8: 1, U16: 2, I16: 3, U32: 4, I32: 5, F32: 6, BOOL: 7, STR: 8, ARR: 9, U64: 10, I64: 11, F64: 12 } as const;

export function u32(v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(v >>> 0);
  return b;
}
export function u64(v: number | bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt(v));
  return b;
}
export function f32(v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeFloatLE(v);
  return b;
}
/** A GGUF string: u64 length, then the bytes (a Buffer is taken as raw bytes). */
export function str(s: string | Buffer, claimedLength?: number | bigint): Buffer {
  const bytes = typeof s === 'string' ? Buffer.from(s, 'utf8') : s;
  return Buffer.concat([u64(claimedLength ?? bytes.byteLength), bytes]);
}

/** A key/value entry with a raw value. */
export function kv(key: string | Buffer, type: number, value: Buffer): Buffer {
  return Buffer.concat([str(key), u32(type), value]);
}
export const kvStr = (key: string, v: string): Buffer => kv(key, T.STR, str(v));
export const kvU32 = (key: string, v: number): Buffer => kv(key, T.U32, u32(v));
export const kvF32 = (key: string, v: number): Buffer => kv(key, T.F32, f32(v));
export const kvBool = (key: string, v: boolean): Buffer => kv(key, T.BOOL, Buffer.from([v ? 1 : 0]));
export function kvStrArr(key: string, items: string[]): Buffer {
  return kv(key, T.ARR, Buffer.concat([u32(T.STR), u64(items.length), ...items.map((s) => str(s))]));
}
export function kvI32Arr(key: string, items: number[]): Buffer {
  return kv(key, T.ARR, Buffer.concat([u32(T.I32), u64(items.length), ...items.map((x) => { const b = Buffer.alloc(4); b.writeInt32LE(x); return b; })]));
}

/** A tensor info entry. */
export function tinfo(name: string | Buffer, dims: (number | bigint)[], type: number, offset: number | bigint, nDims = dims.length): Buffer {
  return Buffer.concat([str(name), u32(nDims), ...dims.map((d) => u64(d)), u32(type), u64(offset)]);
}

export interface RawGguf {
  magic?: Buffer;
  version?: number;
  /** Claimed counts (default: the number of entries given). */
  nTensors?: number | bigint;
  nKv?: number | bigint;
  kvs?: Buffer[];
  tensors?: Buffer[];
  alignment?: number;
  /** Data section bytes (after padding to `alignment`). */
  data?: Buffer;
}

export function gguf(r: RawGguf): Buffer {
  const kvs = r.kvs ?? [];
  const tensors = r.tensors ?? [];
  const head = Buffer.concat([
    r.magic ?? Buffer.from('GGUF'),
    u32(r.version ?? 3),
    u64(r.nTensors ?? tensors.length),
    u64(r.nKv ?? kvs.length),
    ...kvs,
    ...tensors,
  ]);
  const align = r.alignment ?? 32;
  const pad = Buffer.alloc((align - (head.byteLength % align)) % align);
  return Buffer.concat([head, pad, r.data ?? Buffer.alloc(0)]);
}

/** A small valid file: two F32 [4] tensors at offsets 0 and 32. */
export function validSmall(): RawGguf {
  return {
    kvs: [kvStr('general.architecture', 'llama'), kvStrArr('some.strings', ['a', 'bc', ''])],
    tensors: [tinfo('a.weight', [4], 0, 0), tinfo('b.weight', [4], 0, 32)],
    data: Buffer.alloc(48, 1),
  };
}

/** A seeded PRNG (mulberry32): the fuzz run is the same every time. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
