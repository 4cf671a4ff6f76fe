import { randomBytes } from 'node:crypto';
import { open as openFile, rename, stat, unlink, type FileHandle } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { GGML_TYPES, type GgmlTypeName } from '@nerva/core';
import { GgufError } from './gguf-error.js';
import { GGUF_DEFAULT_ALIGNMENT, GGUF_LIMITS, GGUF_MAGIC } from './gguf-header.js';
import { GGUF_SCALAR_BYTES, GGUF_VALUE_TYPES, type GgufScalar, type GgufScalarType, type GgufValue } from './gguf-value.js';

/** One tensor to write: its header entry and a producer of exactly its bytes. */
export interface GgufWriteTensor {
  readonly name: string;
  readonly type: GgmlTypeName;
  /** ggml order: `dims[0]` innermost (the reverse of a PyTorch shape). */
  readonly dims: readonly number[];
  /**
   * The tensor's bytes (ggml blocks of `type`), whole or in chunks: called once, when the writer
   * reaches this tensor, so only the chunk in hand is held in memory.
   */
  readonly data: () => AsyncIterable<Uint8Array> | Promise<Uint8Array>;
}

export interface GgufWriteOptions {
  /** Metadata in the order to write it; `general.alignment` is added when `alignment` is not 32. */
  readonly metadata: Iterable<readonly [string, GgufValue]>;
  readonly tensors: readonly GgufWriteTensor[];
  /** Data alignment (power of two); default 32 as llama.cpp writes. */
  readonly alignment?: number;
  /** Overwrite an existing file at `path` (default false: EXISTS). */
  readonly overwrite?: boolean;
  /** Called after each chunk of tensor data with bytes written so far and the data total. */
  readonly onProgress?: (done: number, total: number, tensor: string) => void;
}

/** What was written. */
export interface GgufWriteResult {
  readonly path: string;
  /** Size of the file. */
  readonly bytes: number;
  readonly dataOffset: number;
}

/** Bytes of the tensor `t` (whole blocks), or a BAD_INPUT error naming it. */
export function ggufTensorBytes(path: string, t: Pick<GgufWriteTensor, 'name' | 'type' | 'dims'>): number {
  const info = GGML_TYPES[t.type];
  if (!info) throw new GgufError('BAD_INPUT', path, `unknown ggml type ${String(t.type)}`, { tensor: t.name });
  if (t.dims.length < 1 || t.dims.length > GGUF_LIMITS.maxDims || !t.dims.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw new GgufError('BAD_INPUT', path, `dims [${t.dims.join(', ')}] must be 1 to ${GGUF_LIMITS.maxDims} non-negative integers`, { tensor: t.name });
  }
  if (t.dims[0] % info.blockSize !== 0) {
    throw new GgufError('NOT_BLOCK_MULTIPLE', path, `innermost dimension ${t.dims[0]} is not a multiple of the ${t.type} block size ${info.blockSize}`, { tensor: t.name });
  }
  const n = t.dims.reduce((a, b) => a * b, 1);
  if (!Number.isSafeInteger(n)) throw new GgufError('DIMS_OVERFLOW', path, `dims [${t.dims.join(', ')}] overflow`, { tensor: t.name });
  return (n / info.blockSize) * info.typeSize;
}

/**
 * Write a GGUF v3 file: header, metadata, tensor infos, then each tensor's data streamed from its
 * producer, aligned, in the order given (offsets contiguous, as llama.cpp requires). The file is
 * written under a temporary name beside `path` and renamed into place only when complete, so a
 * failure never leaves a partial file at `path` (the temporary is removed). Throws
 * {@link GgufError}: BAD_INPUT, NOT_BLOCK_MULTIPLE, DUPLICATE_KEY, DUPLICATE_TENSOR,
 * BAD_TENSOR_NAME, BAD_ALIGNMENT for invalid arguments (before anything is created); EXISTS when
 * `path` exists and `overwrite` is not set; WRITE when the file cannot be written.
 */
export async function writeGguf(path: string, opts: GgufWriteOptions): Promise<GgufWriteResult> {
  const alignment = opts.alignment ?? GGUF_DEFAULT_ALIGNMENT;
  if (!(Number.isInteger(alignment) && alignment > 0 && alignment <= 2 ** 30 && (alignment & (alignment - 1)) === 0)) {
    throw new GgufError('BAD_ALIGNMENT', path, `alignment ${alignment} is not a power of two`);
  }
  const entries: [string, GgufValue][] = [];
  const keys = new Set<string>();
  for (const [k, v] of opts.metadata) {
    if (keys.has(k)) throw new GgufError('DUPLICATE_KEY', path, 'given twice', { key: k });
    if (k === 'general.alignment') throw new GgufError('BAD_INPUT', path, 'set through the alignment option', { key: k });
    keys.add(k);
    entries.push([k, v]);
  }
  if (alignment !== GGUF_DEFAULT_ALIGNMENT) entries.push(['general.alignment', { type: 'UINT32', value: alignment }]);

  const names = new Set<string>();
  const sizes = opts.tensors.map((t) => {
    if (t.name.length === 0 || Buffer.byteLength(t.name) > GGUF_LIMITS.maxTensorNameBytes) {
      throw new GgufError('BAD_TENSOR_NAME', path, `names are 1 to ${GGUF_LIMITS.maxTensorNameBytes} bytes`, { tensor: t.name });
    }
    if (names.has(t.name)) throw new GgufError('DUPLICATE_TENSOR', path, 'given twice', { tensor: t.name });
    names.add(t.name);
    return ggufTensorBytes(path, t);
  });
  const pad = (n: number): number => Math.ceil(n / alignment) * alignment;
  const offsets: number[] = [];
  let dataBytes = 0;
  for (const s of sizes) {
    offsets.push(dataBytes);
    dataBytes += pad(s);
  }

  const head = new HeaderBuilder(path);
  head.u32(GGUF_MAGIC);
  head.u32(3);
  head.u64(BigInt(opts.tensors.length));
  head.u64(BigInt(entries.length));
  for (const [k, v] of entries) {
    head.string(k);
    head.value(k, v);
  }
  opts.tensors.forEach((t, i) => {
    head.string(t.name);
    head.u32(t.dims.length);
    for (const d of t.dims) head.u64(BigInt(d));
    head.u32(GGML_TYPES[t.type].id);
    head.u64(BigInt(offsets[i]));
  });
  const header = head.finish();
  const dataOffset = pad(header.byteLength);

  if (!opts.overwrite && (await exists(path))) throw new GgufError('EXISTS', path, 'already exists (pass overwrite to replace it)');
  const tmp = join(dirname(path), `.${basename(path)}.${process.pid}.${randomBytes(4).toString('hex')}.partial`);
  let fh: FileHandle | undefined;
  try {
    try {
      fh = await openFile(tmp, 'wx');
    } catch (e) {
      throw new GgufError('WRITE', path, `cannot create a file in ${dirname(path)}: ${(e as Error).message}`, {}, { cause: e });
    }
    const out = new Sink(fh, path);
    await out.write(header);
    await out.zeros(dataOffset - header.byteLength);
    let done = 0;
    for (let i = 0; i < opts.tensors.length; i++) {
      const t = opts.tensors[i];
      let got = 0;
      const src = await t.data();
      const chunks: AsyncIterable<Uint8Array> | Iterable<Uint8Array> = src instanceof Uint8Array ? [src] : src;
      for await (const chunk of chunks) {
        if (got + chunk.byteLength > sizes[i]) {
          throw new GgufError('BAD_INPUT', path, `producer gave more than the ${sizes[i]} bytes of ${t.type} [${t.dims.join(', ')}]`, { tensor: t.name });
        }
        await out.write(chunk);
        got += chunk.byteLength;
        done += chunk.byteLength;
        opts.onProgress?.(done, dataBytes, t.name);
      }
      if (got !== sizes[i]) {
        throw new GgufError('BAD_INPUT', path, `producer gave ${got} bytes, ${t.type} [${t.dims.join(', ')}] needs ${sizes[i]}`, { tensor: t.name });
      }
      await out.zeros(pad(got) - got);
    }
    await out.flush();
    await fh.sync().catch(() => undefined);
    await fh.close();
    fh = undefined;
    try {
      await rename(tmp, path);
    } catch (e) {
      throw new GgufError('WRITE', path, `cannot move the finished file into place: ${(e as Error).message}`, {}, { cause: e });
    }
    return { path, bytes: dataOffset + dataBytes, dataOffset };
  } catch (e) {
    await fh?.close().catch(() => undefined);
    await unlink(tmp).catch(() => undefined);
    if (e instanceof GgufError) throw e;
    throw new GgufError('WRITE', path, (e as Error).message, {}, { cause: e });
  }
}

async function exists(p: string): Promise<boolean> {
  try {
    await stat(p);
    return true;
  } catch {
    return false;
  }
}

/** Buffered sequential writes to a file handle. */
class Sink {
  private readonly buf = Buffer.alloc(4 * 1024 * 1024);
  private used = 0;
  private pos = 0;
  constructor(
    private readonly fh: FileHandle,
    private readonly path: string,
  ) {}

  async write(src: Uint8Array): Promise<void> {
    if (src.byteLength >= this.buf.byteLength) {
      await this.flush();
      await this.raw(src);
      return;
    }
    if (this.used + src.byteLength > this.buf.byteLength) await this.flush();
    this.buf.set(src, this.used);
    this.used += src.byteLength;
  }

  async zeros(n: number): Promise<void> {
    if (n > 0) await this.write(new Uint8Array(n));
  }

  async flush(): Promise<void> {
    if (this.used === 0) return;
    const chunk = this.buf.subarray(0, this.used);
    this.used = 0;
    await this.raw(chunk);
  }

  private async raw(src: Uint8Array): Promise<void> {
    let off = 0;
    while (off < src.byteLength) {
      let n: number;
      try {
        ({ bytesWritten: n } = await this.fh.write(src, off, src.byteLength - off, this.pos));
      } catch (e) {
        throw new GgufError('WRITE', this.path, `write failed at byte ${this.pos}: ${(e as Error).message}`, {}, { cause: e });
      }
      off += n;
      this.pos += n;
    }
  }
}

/** Serializes the header in memory (it is small next to the tensor data). */
class HeaderBuilder {
  private parts: Buffer[] = [];
  private size = 0;
  constructor(private readonly path: string) {}

  private push(b: Buffer): void {
    this.parts.push(b);
    this.size += b.byteLength;
  }
  u32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v >>> 0);
    this.push(b);
  }
  u64(v: bigint): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(v);
    this.push(b);
  }
  string(s: string): void {
    const bytes = Buffer.from(s, 'utf8');
    this.u64(BigInt(bytes.byteLength));
    this.push(bytes);
  }

  value(key: string, v: GgufValue): void {
    const id = GGUF_VALUE_TYPES[v.type];
    if (id === undefined) throw new GgufError('BAD_INPUT', this.path, `unknown value type ${String(v.type)}`, { key });
    this.u32(id);
    if (v.type === 'ARRAY') {
      const { itemType, items } = v.value;
      if (itemType === ('ARRAY' as GgufScalarType) || GGUF_VALUE_TYPES[itemType] === undefined) {
        throw new GgufError('BAD_INPUT', this.path, `arrays of ${String(itemType)} are not supported`, { key });
      }
      this.u32(GGUF_VALUE_TYPES[itemType]);
      this.u64(BigInt(items.length));
      for (const x of items) this.scalar(key, itemType, x);
    } else {
      this.scalar(key, v.type, v.value);
    }
  }

  private scalar(key: string, type: GgufScalarType, x: GgufScalar): void {
    const bad = (): never => {
      throw new GgufError('BAD_INPUT', this.path, `${String(x)} is not a valid ${type}`, { key });
    };
    if (type === 'STRING') {
      if (typeof x !== 'string') bad();
      this.string(x as string);
      return;
    }
    const b = Buffer.alloc(GGUF_SCALAR_BYTES[type]);
    if (type === 'BOOL') {
      if (typeof x !== 'boolean') bad();
      b.writeUInt8(x ? 1 : 0);
    } else if (type === 'UINT64' || type === 'INT64') {
      if (typeof x !== 'bigint' && !(typeof x === 'number' && Number.isSafeInteger(x))) bad();
      const big = BigInt(x as number | bigint);
      if (type === 'UINT64' ? big < 0n || big >= 1n << 64n : big < -(1n << 63n) || big >= 1n << 63n) bad();
      if (type === 'UINT64') b.writeBigUInt64LE(big);
      else b.writeBigInt64LE(big);
    } else if (type === 'FLOAT32' || type === 'FLOAT64') {
      if (typeof x !== 'number') bad();
      if (type === 'FLOAT32') b.writeFloatLE(x as number);
      else b.writeDoubleLE(x as number);
    } else {
      if (typeof x !== 'number' || !Number.isInteger(x)) bad();
      const n = x as number;
      try {
        if (type === 'UINT8') b.writeUInt8(n);
        else if (type === 'INT8') b.writeInt8(n);
        else if (type === 'UINT16') b.writeUInt16LE(n);
        else if (type === 'INT16') b.writeInt16LE(n);
        else if (type === 'UINT32') b.writeUInt32LE(n);
        else b.writeInt32LE(n);
      } catch {
        bad();
      }
    }
    this.push(b);
  }

  finish(): Buffer {
    if (this.size > GGUF_LIMITS.maxHeaderBytes) {
      throw new GgufError('HEADER_TOO_LARGE', this.path, `the header would be ${this.size} bytes; readers cap it at ${GGUF_LIMITS.maxHeaderBytes}`);
    }
    return Buffer.concat(this.parts, this.size);
  }
}
