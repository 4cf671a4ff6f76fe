import { open as openFile, type FileHandle } from 'node:fs/promises';
import { GgufError } from './gguf-error.js';
import { GGUF_LIMITS, NeedMoreBytes, parseGgufHeader, type GgufHeader, type GgufTensorInfo } from './gguf-header.js';
import type { GgufMetadata, GgufValue } from './gguf-value.js';

/** fs.read moves at most ~2 GiB per call; stay well under it. */
const READ_CHUNK = 256 * 1024 * 1024;
/** First read of the header; grown 4x while the header goes on (most headers fit in 8 MiB). */
const FIRST_HEADER_READ = 1024 * 1024;

/** One file of a model: the whole model, or one split of it. */
interface Part {
  readonly path: string;
  readonly fh: FileHandle;
  readonly size: number;
  readonly header: GgufHeader;
}

/** llama.cpp's split naming (`llama_split_path`): PREFIX-00001-of-00003.gguf. */
const SPLIT_NAME = /^(.*)-(\d{5})-of-(\d{5})\.gguf$/;

/**
 * One `.gguf` model, opened for bounded range reads. Opening reads and validates only the header
 * (metadata and tensor infos, see {@link parseGgufHeader}); tensor bytes are read on demand, one
 * tensor at a time, through the file handle. A model split by llama.cpp's `gguf-split` (files
 * `PREFIX-0000i-of-0000N.gguf`, the first holding the metadata, each a `split.no`) is opened from
 * its first file: its tensors are those of every split, each read from the file that holds it.
 */
export class GgufFile {
  private closed = false;
  private readonly byName: ReadonlyMap<string, { readonly t: GgufTensorInfo; readonly part: Part }>;
  /** Tensors in header order, split after split. */
  readonly tensors: readonly GgufTensorInfo[];

  private constructor(
    /** Path the model was opened from (its first split when split). */
    readonly path: string,
    private readonly parts: readonly Part[],
  ) {
    const byName = new Map<string, { t: GgufTensorInfo; part: Part }>();
    for (const part of parts) {
      for (const t of part.header.tensors) {
        if (byName.has(t.name)) throw new GgufError('DUPLICATE_TENSOR', part.path, `also in ${byName.get(t.name)!.part.path}`, { tensor: t.name });
        byName.set(t.name, { t, part });
      }
    }
    this.byName = byName;
    this.tensors = parts.flatMap((p) => p.header.tensors);
  }

  /**
   * Open and validate `path` (and, for the first file of a split model, the other splits).
   * Throws {@link GgufError}: NOT_FOUND or IO when a file cannot be opened, any code of
   * {@link parseGgufHeader} for a malformed header, BAD_METADATA for split keys that disagree
   * (or a split other than the first opened), DUPLICATE_TENSOR for a tensor in two splits.
   */
  static async open(path: string): Promise<GgufFile> {
    const first = await openPart(path);
    const parts = [first];
    try {
      const count = splitKey(first, 'split.count');
      if (count === undefined || count <= 1) return new GgufFile(path, parts);
      const no = splitKey(first, 'split.no');
      const m = SPLIT_NAME.exec(path);
      if (no !== 0 || !m || Number(m[2]) !== 1 || Number(m[3]) !== count) {
        throw new GgufError('BAD_METADATA', path, `split ${no ?? '?'} of ${count}: open the first split, named PREFIX-00001-of-${String(count).padStart(5, '0')}.gguf`, { key: 'split.no' });
      }
      for (let i = 1; i < count; i++) {
        const p = await openPart(`${m[1]}-${String(i + 1).padStart(5, '0')}-of-${m[3]}.gguf`);
        parts.push(p);
        if (splitKey(p, 'split.no') !== i || splitKey(p, 'split.count') !== count) {
          throw new GgufError('BAD_METADATA', p.path, `split.no / split.count must be ${i} / ${count}`, { key: 'split.no' });
        }
      }
      const file = new GgufFile(path, parts);
      const total = splitKey(first, 'split.tensors.count');
      if (total !== undefined && total !== file.tensors.length) {
        throw new GgufError('BAD_METADATA', path, `split.tensors.count is ${total}, the splits hold ${file.tensors.length} tensors`, { key: 'split.tensors.count' });
      }
      return file;
    } catch (e) {
      for (const p of parts) await p.fh.close().catch(() => undefined);
      throw e;
    }
  }

  /** The first file's validated header: the model's metadata (and that file's own tensors). */
  get header(): GgufHeader {
    return this.parts[0].header;
  }

  /** Bytes of the model's files together. */
  get fileSize(): number {
    return this.parts.reduce((n, p) => n + p.size, 0);
  }

  /** The model's files: one, or every split in order. */
  get paths(): readonly string[] {
    return this.parts.map((p) => p.path);
  }

  get version(): number {
    return this.header.version;
  }

  get metadata(): GgufMetadata {
    return this.header.metadata;
  }

  /** The metadata value of `key`, or undefined. */
  get(key: string): GgufValue | undefined {
    return this.header.metadata.get(key);
  }

  has(name: string): boolean {
    return this.byName.has(name);
  }

  /** The tensor `name`; throws MISSING_TENSOR when absent. */
  tensor(name: string): GgufTensorInfo {
    return this.located(name).t;
  }

  /** The file holding tensor `name` (`tensor(name).byteOffset` is within it). */
  pathOf(name: string): string {
    return this.located(name).part.path;
  }

  /** The stored bytes of tensor `name` (ggml blocks as written), in a fresh 8-byte-aligned buffer. */
  async readTensor(name: string): Promise<Uint8Array> {
    const t = this.tensor(name);
    const out = new Uint8Array(new ArrayBuffer(t.byteLength));
    await this.readTensorRange(name, 0, out);
    return out;
  }

  /**
   * Read `dst.byteLength` stored bytes of tensor `name` starting `start` bytes into it: a bounded
   * read of part of a tensor (one expert of a stacked expert tensor, a band of rows).
   */
  async readTensorRange(name: string, start: number, dst: Uint8Array): Promise<void> {
    this.assertOpen();
    const { t, part } = this.located(name);
    if (!(Number.isSafeInteger(start) && start >= 0 && start + dst.byteLength <= t.byteLength)) {
      throw new RangeError(`${part.path}: tensor "${name}": range [${start}, ${start + dst.byteLength}) outside its ${t.byteLength} bytes`);
    }
    await readExactly(part.fh, part.path, dst, t.byteOffset + start, name);
  }

  /** Release the file handles. Further reads throw CLOSED. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const p of this.parts) await p.fh.close();
  }

  private located(name: string): { readonly t: GgufTensorInfo; readonly part: Part } {
    const l = this.byName.get(name);
    if (!l) throw new GgufError('MISSING_TENSOR', this.path, 'not in this file', { tensor: name });
    return l;
  }

  private assertOpen(): void {
    if (this.closed) throw new GgufError('CLOSED', this.path, 'file was closed');
  }
}

/** A split key's integer value (llama.cpp writes u16 / i32), or undefined when absent. */
function splitKey(p: Part, key: string): number | undefined {
  const v = p.header.metadata.get(key);
  if (v === undefined) return undefined;
  if (v.type === 'ARRAY' || v.type === 'STRING' || v.type === 'BOOL' || typeof v.value === 'bigint' || !Number.isInteger(v.value) || (v.value as number) < 0) {
    throw new GgufError('BAD_METADATA', p.path, 'must be a non-negative integer', { key });
  }
  return v.value as number;
}

/** Open one file and validate its header. */
async function openPart(path: string): Promise<Part> {
  let fh: FileHandle;
  try {
    fh = await openFile(path, 'r');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new GgufError(code === 'ENOENT' ? 'NOT_FOUND' : 'IO', path, `cannot open: ${(e as Error).message}`, {}, { cause: e });
  }
  try {
    const st = await fh.stat();
    if (!st.isFile()) throw new GgufError('IO', path, 'not a regular file');
    const size = st.size;
    let want = Math.min(size, FIRST_HEADER_READ);
    let buf = new Uint8Array(0);
    for (;;) {
      if (want > buf.byteLength) {
        const next = new Uint8Array(want);
        next.set(buf);
        await readExactly(fh, path, next.subarray(buf.byteLength), buf.byteLength);
        buf = next;
      }
      try {
        return { path, fh, size, header: parseGgufHeader(buf, size, path) };
      } catch (e) {
        if (!(e instanceof NeedMoreBytes)) throw e;
        want = Math.min(size, GGUF_LIMITS.maxHeaderBytes, Math.max(e.atLeast, buf.byteLength * 4));
      }
    }
  } catch (e) {
    await fh.close().catch(() => undefined);
    throw e;
  }
}

async function readExactly(fh: FileHandle, path: string, dst: Uint8Array, position: number, tensor?: string): Promise<void> {
  let done = 0;
  while (done < dst.byteLength) {
    const want = Math.min(READ_CHUNK, dst.byteLength - done);
    const { bytesRead } = await fh.read(dst, done, want, position + done);
    if (bytesRead === 0) {
      // The file shrank after its header was validated.
      throw new GgufError('TRUNCATED', path, `unexpected end of file at byte ${position + done}`, tensor !== undefined ? { tensor } : {});
    }
    done += bytesRead;
  }
}
