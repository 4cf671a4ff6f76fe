/**
 * Parsing and validating a GGUF header (magic, version, metadata, tensor infos) from bytes, with
 * every count, length and offset bounded before anything is allocated from it: a hostile file
 * gets a {@link GgufError} naming what is wrong, never a crash or an allocation sized by the file.
 */
import { GGML_TYPES, ggmlTypeName, type GgmlTypeName } from '@nerva/core';
import { GgufError } from './gguf-error.js';
import {
  GGUF_SCALAR_BYTES,
  ggufValueTypeName,
  type GgufArray,
  type GgufMetadata,
  type GgufScalar,
  type GgufScalarType,
  type GgufValue,
} from './gguf-value.js';

/** "GGUF" read as a little-endian u32. */
export const GGUF_MAGIC = 0x46554747;
/** Versions this reader accepts (v1 used 32-bit counts and is long obsolete). */
export const GGUF_VERSIONS: readonly number[] = [2, 3];
/** Data-section alignment when `general.alignment` is absent. */
export const GGUF_DEFAULT_ALIGNMENT = 32;

/**
 * Caps on what a header may claim. They sit far above real files (a 256k-token vocabulary is
 * ~8 MiB of header; a 128-expert model with stacked experts has ~1,000 tensors) and bound the
 * memory a hostile header can make the reader use.
 */
export const GGUF_LIMITS = {
  /** Bytes from the start of the file to the end of the tensor infos. */
  maxHeaderBytes: 256 * 1024 * 1024,
  maxKeys: 65_536,
  maxTensors: 262_144,
  /** Bytes of one string (a chat template is tens of KiB). */
  maxStringBytes: 16 * 1024 * 1024,
  /** Elements of one array (vocabularies are up to ~260k tokens, merges ~500k). */
  maxArrayLength: 16 * 1024 * 1024,
  /** ggml's GGML_MAX_NAME is 64 including the terminating NUL. */
  maxTensorNameBytes: 63,
  /** ggml's GGML_MAX_DIMS. */
  maxDims: 4,
} as const;

/** Names of type ids ggml defines that this reader does not decode, for a clearer refusal. */
const UNSUPPORTED_TYPE_NAMES: Readonly<Record<number, string>> = {
  4: 'Q4_2 (removed from ggml)',
  5: 'Q4_3 (removed from ggml)',
  16: 'IQ2_XXS',
  17: 'IQ2_XS',
  18: 'IQ3_XXS',
  19: 'IQ1_S',
  21: 'IQ3_S',
  22: 'IQ2_S',
  24: 'I8',
  25: 'I16',
  26: 'I32',
  27: 'I64',
  28: 'F64',
  29: 'IQ1_M',
  34: 'TQ1_0',
  35: 'TQ2_0',
  39: 'MXFP4',
};

/** One tensor of a GGUF file. */
export interface GgufTensorInfo {
  readonly name: string;
  readonly type: GgmlTypeName;
  /** ggml order: `dims[0]` is the innermost (contiguous) dimension, the reverse of PyTorch's shape. */
  readonly dims: readonly number[];
  readonly elements: number;
  /** Absolute offset of the tensor's bytes in the file. */
  readonly byteOffset: number;
  readonly byteLength: number;
}

/** A parsed, validated header. */
export interface GgufHeader {
  readonly version: number;
  readonly metadata: GgufMetadata;
  /** Tensors in the order the header lists them. */
  readonly tensors: readonly GgufTensorInfo[];
  readonly alignment: number;
  /** Absolute offset of the data section. */
  readonly dataOffset: number;
  /** Bytes of the header proper (magic to the end of the tensor infos, before padding). */
  readonly headerBytes: number;
}

/** Thrown inside the parser when the bytes given end before the header does but the file goes on. */
export class NeedMoreBytes {
  constructor(readonly atLeast: number) {}
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** A bounds-checked little-endian cursor over a prefix of the file. */
class Cursor {
  pos = 0;
  private readonly view: DataView;
  constructor(
    private readonly bytes: Uint8Array,
    private readonly fileSize: number,
    private readonly path: string,
  ) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  /** Bytes of the file after the cursor. */
  get fileLeft(): number {
    return this.fileSize - this.pos;
  }

  need(n: number, what: string, where: { key?: string; tensor?: string } = {}): void {
    if (this.pos + n <= this.bytes.byteLength) return;
    if (this.pos + n > this.fileSize) {
      throw new GgufError('TRUNCATED', this.path, `${what} at byte ${this.pos} needs ${n} bytes, but the file ends at byte ${this.fileSize}`, where);
    }
    if (this.pos + n > GGUF_LIMITS.maxHeaderBytes) {
      throw new GgufError('HEADER_TOO_LARGE', this.path, `the header runs past ${GGUF_LIMITS.maxHeaderBytes} bytes (the cap on metadata and tensor infos)`, where);
    }
    throw new NeedMoreBytes(this.pos + n);
  }

  u8(): number {
    const v = this.view.getUint8(this.pos);
    this.pos += 1;
    return v;
  }
  u32(): number {
    const v = this.view.getUint32(this.pos, true);
    this.pos += 4;
    return v;
  }
  u64(): bigint {
    const v = this.view.getBigUint64(this.pos, true);
    this.pos += 8;
    return v;
  }

  scalar(type: Exclude<GgufScalarType, 'STRING'>): GgufScalar {
    const p = this.pos;
    this.pos += GGUF_SCALAR_BYTES[type];
    switch (type) {
      case 'UINT8':
        return this.view.getUint8(p);
      case 'INT8':
        return this.view.getInt8(p);
      case 'UINT16':
        return this.view.getUint16(p, true);
      case 'INT16':
        return this.view.getInt16(p, true);
      case 'UINT32':
        return this.view.getUint32(p, true);
      case 'INT32':
        return this.view.getInt32(p, true);
      case 'FLOAT32':
        return this.view.getFloat32(p, true);
      case 'BOOL':
        return this.view.getUint8(p) !== 0;
      case 'UINT64':
        return this.view.getBigUint64(p, true);
      case 'INT64':
        return this.view.getBigInt64(p, true);
      case 'FLOAT64':
        return this.view.getFloat64(p, true);
    }
  }

  /** A length-prefixed UTF-8 string of at most `cap` bytes. */
  string(what: string, cap: number, where: { key?: string; tensor?: string } = {}): string {
    this.need(8, `length of ${what}`, where);
    const len = this.u64();
    if (len > BigInt(cap)) throw new GgufError('STRING_TOO_LONG', this.path, `${what} claims ${len} bytes (the cap is ${cap})`, where);
    const n = Number(len);
    this.need(n, what, where);
    const raw = this.bytes.subarray(this.pos, this.pos + n);
    this.pos += n;
    try {
      return utf8.decode(raw);
    } catch {
      throw new GgufError('BAD_STRING', this.path, `${what} is not valid UTF-8`, where);
    }
  }
}

/**
 * Parse and validate the header of a GGUF file from `bytes`, a prefix of the file (or all of it)
 * whose full size is `fileSize`. Throws {@link NeedMoreBytes} when the prefix ends inside the
 * header but the file goes on (the caller reads more and calls again), and {@link GgufError} for
 * anything malformed: TRUNCATED, BAD_MAGIC, BAD_VERSION, HEADER_TOO_LARGE, TOO_MANY_KEYS,
 * TOO_MANY_TENSORS, STRING_TOO_LONG, BAD_STRING, ARRAY_TOO_LONG, UNKNOWN_VALUE_TYPE, NESTED_ARRAY,
 * DUPLICATE_KEY, BAD_ALIGNMENT, BAD_TENSOR_NAME, DUPLICATE_TENSOR, BAD_DIMS, DIMS_OVERFLOW,
 * UNKNOWN_TYPE, NOT_BLOCK_MULTIPLE, MISALIGNED, OUT_OF_RANGE or OVERLAP.
 */
export function parseGgufHeader(bytes: Uint8Array, fileSize = bytes.byteLength, path = '<gguf>'): GgufHeader {
  const c = new Cursor(bytes, fileSize, path);
  c.need(4, 'magic');
  const magic = c.u32();
  if (magic !== GGUF_MAGIC) {
    const shown = [...bytes.subarray(0, 4)].map((b) => b.toString(16).padStart(2, '0')).join(' ');
    throw new GgufError('BAD_MAGIC', path, `not a GGUF file: the first bytes are ${shown}, not "GGUF" (47 47 55 46)`);
  }
  c.need(4, 'version');
  const version = c.u32();
  if (!GGUF_VERSIONS.includes(version)) {
    const swapped = ((version & 0xff) << 24) | ((version & 0xff00) << 8) | ((version >>> 8) & 0xff00) | (version >>> 24);
    const hint = GGUF_VERSIONS.includes(swapped >>> 0) ? ' (a big-endian file, which is not supported)' : version === 1 ? ' (v1 is obsolete)' : '';
    throw new GgufError('BAD_VERSION', path, `GGUF version ${version} is not supported${hint}; supported: ${GGUF_VERSIONS.join(', ')}`);
  }
  c.need(16, 'tensor and key counts');
  const tensorCount = c.u64();
  const kvCount = c.u64();
  if (kvCount > BigInt(GGUF_LIMITS.maxKeys)) throw new GgufError('TOO_MANY_KEYS', path, `the header claims ${kvCount} metadata keys (the cap is ${GGUF_LIMITS.maxKeys})`);
  if (tensorCount > BigInt(GGUF_LIMITS.maxTensors)) {
    throw new GgufError('TOO_MANY_TENSORS', path, `the header claims ${tensorCount} tensors (the cap is ${GGUF_LIMITS.maxTensors})`);
  }
  // A key takes at least 13 bytes (length, type, one byte of value) and a tensor info 24: a count
  // the rest of the file cannot hold is refused before any loop or allocation sized by it.
  const nKv = Number(kvCount);
  const nTensors = Number(tensorCount);
  if (nKv * 13 + nTensors * 24 > c.fileLeft) {
    throw new GgufError('TRUNCATED', path, `${nKv} keys and ${nTensors} tensor infos cannot fit in the ${c.fileLeft} bytes left in the file`);
  }

  const metadata = new Map<string, GgufValue>();
  for (let i = 0; i < nKv; i++) {
    const key = c.string(`metadata key #${i}`, 65_535);
    if (key.length === 0) throw new GgufError('BAD_METADATA', path, `metadata key #${i} is empty`);
    if (metadata.has(key)) throw new GgufError('DUPLICATE_KEY', path, 'appears twice in the metadata', { key });
    metadata.set(key, readValue(c, key, path));
  }

  let alignment = GGUF_DEFAULT_ALIGNMENT;
  const al = metadata.get('general.alignment');
  if (al !== undefined) {
    if (al.type !== 'UINT32') throw new GgufError('BAD_ALIGNMENT', path, `must be a UINT32, found ${al.type}`, { key: 'general.alignment' });
    const a = al.value as number;
    if (a === 0 || (a & (a - 1)) !== 0) throw new GgufError('BAD_ALIGNMENT', path, `${a} is not a power of two`, { key: 'general.alignment' });
    alignment = a;
  }

  const tensors: GgufTensorInfo[] = [];
  const names = new Set<string>();
  const rel: { name: string; offset: number; byteLength: number }[] = [];
  for (let i = 0; i < nTensors; i++) {
    const name = c.string(`name of tensor #${i}`, 1 << 16);
    if (name.length === 0) throw new GgufError('BAD_TENSOR_NAME', path, `tensor #${i} has an empty name`);
    const nameBytes = Buffer.byteLength(name, 'utf8');
    if (nameBytes > GGUF_LIMITS.maxTensorNameBytes) {
      throw new GgufError('BAD_TENSOR_NAME', path, `name is ${nameBytes} bytes; ggml allows at most ${GGUF_LIMITS.maxTensorNameBytes}`, { tensor: name });
    }
    if (names.has(name)) throw new GgufError('DUPLICATE_TENSOR', path, 'appears twice in the tensor infos', { tensor: name });
    names.add(name);
    c.need(4, 'dimension count', { tensor: name });
    const nDims = c.u32();
    if (nDims < 1 || nDims > GGUF_LIMITS.maxDims) {
      throw new GgufError('BAD_DIMS', path, `has ${nDims} dimensions; ggml tensors have 1 to ${GGUF_LIMITS.maxDims}`, { tensor: name });
    }
    c.need(8 * nDims + 12, 'dimensions, type and offset', { tensor: name });
    const dims: number[] = [];
    let elements = 1n;
    for (let d = 0; d < nDims; d++) {
      const ne = c.u64();
      elements *= ne;
      // Element counts stay exact in a double, and byte lengths with them.
      if (ne > BigInt(Number.MAX_SAFE_INTEGER) || elements > BigInt(Number.MAX_SAFE_INTEGER)) {
        throw new GgufError('DIMS_OVERFLOW', path, `dimensions [${[...dims, ne].join(', ')}...] overflow 2^53 elements`, { tensor: name });
      }
      dims.push(Number(ne));
    }
    const typeId = c.u32();
    const type = ggmlTypeName(typeId);
    if (type === undefined) {
      const known = UNSUPPORTED_TYPE_NAMES[typeId];
      throw new GgufError(
        'UNKNOWN_TYPE',
        path,
        known !== undefined ? `ggml type ${typeId} (${known}) is not supported` : `unknown ggml type id ${typeId}`,
        { tensor: name },
      );
    }
    const { blockSize, typeSize } = GGML_TYPES[type];
    if (dims[0] % blockSize !== 0) {
      throw new GgufError('NOT_BLOCK_MULTIPLE', path, `innermost dimension ${dims[0]} is not a multiple of the ${type} block size ${blockSize}`, { tensor: name });
    }
    const offset = c.u64();
    const n = Number(elements);
    const byteLength = (n / blockSize) * typeSize;
    if (!Number.isSafeInteger(byteLength)) throw new GgufError('DIMS_OVERFLOW', path, `${n} elements of ${type} overflow a byte length`, { tensor: name });
    if (offset % BigInt(alignment) !== 0n) {
      throw new GgufError('MISALIGNED', path, `data offset ${offset} is not a multiple of the alignment ${alignment}`, { tensor: name });
    }
    if (offset > BigInt(fileSize)) throw new GgufError('OUT_OF_RANGE', path, `data offset ${offset} lies past the end of the ${fileSize}-byte file`, { tensor: name });
    rel.push({ name, offset: Number(offset), byteLength });
    tensors.push({ name, type, dims, elements: n, byteOffset: Number(offset), byteLength });
  }
  const headerBytes = c.pos;
  const dataOffset = Math.ceil(headerBytes / alignment) * alignment;
  const dataSize = fileSize - dataOffset;
  for (const t of rel) {
    if (t.byteLength > 0 && (dataSize < 0 || t.offset + t.byteLength > dataSize)) {
      throw new GgufError(
        'OUT_OF_RANGE',
        path,
        `bytes [${t.offset}, ${t.offset + t.byteLength}) of the data section run past its end (${Math.max(0, dataSize)} bytes from offset ${dataOffset})`,
        { tensor: t.name },
      );
    }
  }
  // Overlapping tensors would alias each other's bytes; empty tensors occupy nothing.
  const spans = rel.filter((t) => t.byteLength > 0).sort((a, b) => a.offset - b.offset);
  for (let i = 1; i < spans.length; i++) {
    const p = spans[i - 1];
    const s = spans[i];
    if (s.offset < p.offset + p.byteLength) {
      throw new GgufError('OVERLAP', path, `bytes [${s.offset}, ${s.offset + s.byteLength}) overlap tensor "${p.name}" [${p.offset}, ${p.offset + p.byteLength})`, { tensor: s.name });
    }
  }
  return {
    version,
    metadata,
    tensors: tensors.map((t) => Object.freeze({ ...t, dims: Object.freeze(t.dims), byteOffset: dataOffset + t.byteOffset })),
    alignment,
    dataOffset,
    headerBytes,
  };
}

function readValue(c: Cursor, key: string, path: string): GgufValue {
  c.need(4, 'value type', { key });
  const typeId = c.u32();
  const type = ggufValueTypeName(typeId);
  if (type === undefined) throw new GgufError('UNKNOWN_VALUE_TYPE', path, `unknown value type id ${typeId}`, { key });
  if (type === 'STRING') return { type, value: c.string('string value', GGUF_LIMITS.maxStringBytes, { key }) };
  if (type !== 'ARRAY') {
    c.need(GGUF_SCALAR_BYTES[type], `${type} value`, { key });
    return { type, value: c.scalar(type) };
  }
  c.need(12, 'array element type and length', { key });
  const itemId = c.u32();
  const itemType = ggufValueTypeName(itemId);
  if (itemType === undefined) throw new GgufError('UNKNOWN_VALUE_TYPE', path, `unknown array element type id ${itemId}`, { key });
  if (itemType === 'ARRAY') throw new GgufError('NESTED_ARRAY', path, 'arrays of arrays are not supported', { key });
  const len = c.u64();
  if (len > BigInt(GGUF_LIMITS.maxArrayLength)) throw new GgufError('ARRAY_TOO_LONG', path, `array claims ${len} elements (the cap is ${GGUF_LIMITS.maxArrayLength})`, { key });
  const n = Number(len);
  const minItem = itemType === 'STRING' ? 8 : GGUF_SCALAR_BYTES[itemType];
  // Checked against the file before the element array is allocated.
  if (n * minItem > c.fileLeft) {
    throw new GgufError('TRUNCATED', path, `array of ${n} ${itemType} elements needs at least ${n * minItem} bytes, but ${c.fileLeft} are left in the file`, { key });
  }
  const items: GgufScalar[] = new Array<GgufScalar>(n);
  if (itemType === 'STRING') {
    for (let i = 0; i < n; i++) items[i] = c.string(`array element #${i}`, GGUF_LIMITS.maxStringBytes, { key });
  } else {
    c.need(n * minItem, `${n} ${itemType} elements`, { key });
    for (let i = 0; i < n; i++) items[i] = c.scalar(itemType);
  }
  const value: GgufArray = { itemType, items };
  return { type, value };
}
