import { open as openFile, type FileHandle } from 'node:fs/promises';
import { decodeHalf } from '@nerva/core';
import { CheckpointError } from './errors.js';

/** Element types the safetensors format names. Only F32, F16 and BF16 can be read as weights. */
export type SafetensorsDType =
  | 'F64'
  | 'F32'
  | 'F16'
  | 'BF16'
  | 'F8_E4M3'
  | 'F8_E5M2'
  | 'I64'
  | 'I32'
  | 'I16'
  | 'I8'
  | 'U64'
  | 'U32'
  | 'U16'
  | 'U8'
  | 'BOOL';

/** Bytes per element of every known dtype. */
export const SAFETENSORS_DTYPE_BYTES: Readonly<Record<SafetensorsDType, number>> = {
  F64: 8,
  F32: 4,
  F16: 2,
  BF16: 2,
  F8_E4M3: 1,
  F8_E5M2: 1,
  I64: 8,
  I32: 4,
  I16: 2,
  I8: 1,
  U64: 8,
  U32: 4,
  U16: 2,
  U8: 1,
  BOOL: 1,
};

/** The dtypes NERVA accepts for weights. */
export type WeightDType = 'F32' | 'F16' | 'BF16';

/** True for the dtypes that `readF32` can decode. */
export function isWeightDType(dtype: SafetensorsDType): dtype is WeightDType {
  return dtype === 'F32' || dtype === 'F16' || dtype === 'BF16';
}

/** Where one tensor lives in its file. `byteOffset` is absolute (from the start of the file). */
export interface TensorInfo {
  readonly dtype: SafetensorsDType;
  readonly shape: readonly number[];
  readonly byteOffset: number;
  readonly byteLength: number;
}

/**
 * Largest header we agree to read. Real headers are a few hundred KiB (a 128-expert MoE shard
 * is ~1 MiB); a bigger claim is a corrupt or hostile file, and we refuse before allocating.
 */
export const MAX_HEADER_BYTES = 100 * 1024 * 1024;

/** fs.read moves at most ~2 GiB per call; stay well under it. */
const READ_CHUNK = 256 * 1024 * 1024;

/**
 * One `.safetensors` file, opened for bounded range reads. Opening reads and validates only the
 * 8-byte length and the JSON header; tensor bytes are read on demand, one tensor at a time.
 */
export class SafetensorsFile {
  private closed = false;

  private constructor(
    /** Path the file was opened from (used in every error message). */
    readonly path: string,
    private readonly fh: FileHandle,
    /** Size of the whole file in bytes. */
    readonly fileSize: number,
    /** Absolute offset of the data section (8 + header length). */
    readonly dataOffset: number,
    private readonly tensors: ReadonlyMap<string, TensorInfo>,
    /** The optional `__metadata__` string map. */
    readonly metadata: Readonly<Record<string, string>>,
  ) {}

  /**
   * Open and validate `path`. Throws {@link CheckpointError} with codes NOT_FOUND, TRUNCATED,
   * HEADER_LENGTH, HEADER_TOO_LARGE, HEADER_NOT_JSON, BAD_ENTRY, UNKNOWN_DTYPE, SHAPE_MISMATCH,
   * OFFSET_OUT_OF_RANGE or OVERLAP.
   */
  static async open(path: string): Promise<SafetensorsFile> {
    let fh: FileHandle;
    try {
      fh = await openFile(path, 'r');
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      throw new CheckpointError(code === 'ENOENT' ? 'NOT_FOUND' : 'IO', path, `cannot open: ${(e as Error).message}`, undefined, { cause: e });
    }
    try {
      const { size } = await fh.stat();
      if (size < 8) throw new CheckpointError('TRUNCATED', path, `file is ${size} bytes, shorter than the 8-byte header length`);
      const lenBuf = Buffer.alloc(8);
      await readExactly(fh, path, lenBuf, 0);
      const claimed = lenBuf.readBigUInt64LE(0);
      // Compare as bigint: a corrupt length may not fit a double exactly.
      if (claimed > BigInt(size - 8)) {
        throw new CheckpointError('HEADER_LENGTH', path, `header length ${claimed} runs past the end of the file (${size - 8} bytes after the length field)`);
      }
      const headerLen = Number(claimed);
      if (headerLen > MAX_HEADER_BYTES) {
        throw new CheckpointError('HEADER_TOO_LARGE', path, `header length ${headerLen} exceeds the ${MAX_HEADER_BYTES}-byte cap`);
      }
      const headerBuf = Buffer.alloc(headerLen);
      await readExactly(fh, path, headerBuf, 8);
      const dataOffset = 8 + headerLen;
      const { tensors, metadata } = parseHeader(path, headerBuf, size - dataOffset, dataOffset);
      return new SafetensorsFile(path, fh, size, dataOffset, tensors, metadata);
    } catch (e) {
      await fh.close().catch(() => undefined);
      throw e;
    }
  }

  /** Tensor names in file order (by data offset). */
  names(): string[] {
    return [...this.tensors.keys()];
  }

  has(name: string): boolean {
    return this.tensors.has(name);
  }

  /** Where `name` lives; throws MISSING_TENSOR when absent. */
  info(name: string): TensorInfo {
    const t = this.tensors.get(name);
    if (!t) throw new CheckpointError('MISSING_TENSOR', this.path, 'not in this file', name);
    return t;
  }

  /** Sum of all tensors' byte lengths. */
  get totalBytes(): number {
    let n = 0;
    for (const t of this.tensors.values()) n += t.byteLength;
    return n;
  }

  /** Read exactly the bytes of `name` (nothing else) into a fresh, 8-byte-aligned buffer. */
  async readRaw(name: string): Promise<Uint8Array> {
    const t = this.info(name);
    const out = new Uint8Array(new ArrayBuffer(t.byteLength));
    await this.readRawInto(name, out);
    return out;
  }

  /**
   * Read the bytes of `name` into `dst` (which must be at least `byteLength` long), so a caller
   * with a preallocated staging buffer need not allocate.
   */
  async readRawInto(name: string, dst: Uint8Array): Promise<void> {
    this.assertOpen();
    const t = this.info(name);
    if (dst.byteLength < t.byteLength) {
      throw new RangeError(`${this.path}: tensor "${name}" needs ${t.byteLength} bytes, destination has ${dst.byteLength}`);
    }
    await readExactly(this.fh, this.path, dst.subarray(0, t.byteLength), t.byteOffset, name);
  }

  /** Read `name` and widen it to float32. Only F32, F16 and BF16 tensors can be read this way. */
  async readF32(name: string): Promise<Float32Array> {
    const t = this.info(name);
    if (!isWeightDType(t.dtype)) {
      throw new CheckpointError('UNSUPPORTED_DTYPE', this.path, `dtype ${t.dtype} cannot be read as float; weights must be F32, F16 or BF16`, name);
    }
    const raw = await this.readRaw(name);
    return rawToF32(t.dtype, raw);
  }

  /** Release the file handle. Further reads throw CLOSED. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.fh.close();
  }

  private assertOpen(): void {
    if (this.closed) throw new CheckpointError('CLOSED', this.path, 'file was closed');
  }
}

/** Widen raw little-endian F32/F16/BF16 bytes to float32. `raw` must be 4-byte aligned for F32. */
export function rawToF32(dtype: WeightDType, raw: Uint8Array): Float32Array {
  if (dtype === 'F32') {
    if (raw.byteOffset % 4 === 0) return new Float32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4);
    return new Float32Array(raw.slice().buffer);
  }
  const src =
    raw.byteOffset % 2 === 0
      ? new Uint16Array(raw.buffer, raw.byteOffset, raw.byteLength / 2)
      : new Uint16Array(raw.slice().buffer);
  return decodeHalf(dtype === 'BF16' ? 'bf16' : 'f16', src);
}

async function readExactly(fh: FileHandle, path: string, dst: Uint8Array, position: number, tensor?: string): Promise<void> {
  let done = 0;
  while (done < dst.byteLength) {
    const want = Math.min(READ_CHUNK, dst.byteLength - done);
    const { bytesRead } = await fh.read(dst, done, want, position + done);
    if (bytesRead === 0) {
      // The file shrank after its header was validated.
      throw new CheckpointError('TRUNCATED', path, `unexpected end of file at byte ${position + done}`, tensor);
    }
    done += bytesRead;
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function isCount(v: unknown): v is number {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
}

function parseHeader(
  path: string,
  buf: Buffer,
  dataSize: number,
  dataOffset: number,
): { tensors: Map<string, TensorInfo>; metadata: Record<string, string> } {
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(buf));
  } catch (e) {
    throw new CheckpointError('HEADER_NOT_JSON', path, `header is not valid UTF-8 JSON: ${(e as Error).message}`, undefined, { cause: e });
  }
  if (!isObject(json)) throw new CheckpointError('HEADER_NOT_JSON', path, 'header JSON is not an object');

  let metadata: Record<string, string> = {};
  const spans: { name: string; begin: number; end: number }[] = [];
  const entries: [string, TensorInfo][] = [];
  for (const [name, raw] of Object.entries(json)) {
    if (name === '__metadata__') {
      if (!isObject(raw)) throw new CheckpointError('BAD_ENTRY', path, '__metadata__ is not an object');
      metadata = Object.fromEntries(Object.entries(raw).map(([k, v]) => [k, String(v)]));
      continue;
    }
    if (!isObject(raw)) throw new CheckpointError('BAD_ENTRY', path, 'entry is not an object', name);
    const { dtype, shape, data_offsets: offsets } = raw;
    if (typeof dtype !== 'string') throw new CheckpointError('BAD_ENTRY', path, 'missing or non-string "dtype"', name);
    if (!Object.hasOwn(SAFETENSORS_DTYPE_BYTES, dtype)) {
      throw new CheckpointError('UNKNOWN_DTYPE', path, `unknown dtype "${dtype}" (known: ${Object.keys(SAFETENSORS_DTYPE_BYTES).join(', ')})`, name);
    }
    if (!Array.isArray(shape) || !shape.every(isCount)) {
      throw new CheckpointError('BAD_ENTRY', path, 'missing or invalid "shape" (need an array of non-negative integers)', name);
    }
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every(isCount) || offsets[0] > offsets[1]) {
      throw new CheckpointError('BAD_ENTRY', path, 'missing or invalid "data_offsets" (need [begin, end] with 0 <= begin <= end)', name);
    }
    const [begin, end] = offsets as [number, number];
    const elemBytes = SAFETENSORS_DTYPE_BYTES[dtype as SafetensorsDType];
    const expected = (shape as number[]).reduce((a, b) => a * b, 1) * elemBytes;
    if (expected !== end - begin) {
      throw new CheckpointError(
        'SHAPE_MISMATCH',
        path,
        `shape [${shape.join(', ')}] of ${dtype} needs ${expected} bytes but data_offsets span ${end - begin}`,
        name,
      );
    }
    if (end > dataSize) {
      throw new CheckpointError('OFFSET_OUT_OF_RANGE', path, `data_offsets [${begin}, ${end}] exceed the ${dataSize}-byte data section`, name);
    }
    spans.push({ name, begin, end });
    entries.push([
      name,
      Object.freeze({ dtype: dtype as SafetensorsDType, shape: Object.freeze([...(shape as number[])]), byteOffset: dataOffset + begin, byteLength: end - begin }),
    ]);
  }
  // Overlapping tensors would alias each other's bytes; empty tensors occupy nothing.
  spans.sort((a, b) => a.begin - b.begin || a.end - b.end);
  let prev: (typeof spans)[number] | undefined;
  for (const s of spans) {
    if (s.end === s.begin) continue;
    if (prev && s.begin < prev.end) {
      throw new CheckpointError('OVERLAP', path, `bytes [${s.begin}, ${s.end}) overlap tensor "${prev.name}" [${prev.begin}, ${prev.end})`, s.name);
    }
    prev = s;
  }
  entries.sort((a, b) => a[1].byteOffset - b[1].byteOffset);
  return { tensors: new Map(entries), metadata };
}
