import { open as openFile, type FileHandle } from 'node:fs/promises';
import { GgufError } from './gguf-error.js';
import { GGUF_LIMITS, NeedMoreBytes, parseGgufHeader, type GgufHeader, type GgufTensorInfo } from './gguf-header.js';
import type { GgufMetadata, GgufValue } from './gguf-value.js';

/** fs.read moves at most ~2 GiB per call; stay well under it. */
const READ_CHUNK = 256 * 1024 * 1024;
/** First read of the header; grown 4x while the header goes on (most headers fit in 8 MiB). */
const FIRST_HEADER_READ = 1024 * 1024;

/**
 * One `.gguf` file, opened for bounded range reads. Opening reads and validates only the header
 * (metadata and tensor infos, see {@link parseGgufHeader}); tensor bytes are read on demand, one
 * tensor at a time, through the file handle.
 */
export class GgufFile {
  private closed = false;
  private readonly byName: ReadonlyMap<string, GgufTensorInfo>;

  private constructor(
    /** Path the file was opened from (named in every error). */
    readonly path: string,
    private readonly fh: FileHandle,
    /** Size of the whole file in bytes. */
    readonly fileSize: number,
    /** The validated header. */
    readonly header: GgufHeader,
  ) {
    this.byName = new Map(header.tensors.map((t) => [t.name, t]));
  }

  /**
   * Open and validate `path`. Throws {@link GgufError}: NOT_FOUND or IO when it cannot be opened,
   * and any code of {@link parseGgufHeader} for a malformed header.
   */
  static async open(path: string): Promise<GgufFile> {
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
          return new GgufFile(path, fh, size, parseGgufHeader(buf, size, path));
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

  get version(): number {
    return this.header.version;
  }

  get metadata(): GgufMetadata {
    return this.header.metadata;
  }

  /** Tensors in header order. */
  get tensors(): readonly GgufTensorInfo[] {
    return this.header.tensors;
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
    const t = this.byName.get(name);
    if (!t) throw new GgufError('MISSING_TENSOR', this.path, 'not in this file', { tensor: name });
    return t;
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
    const t = this.tensor(name);
    if (!(Number.isSafeInteger(start) && start >= 0 && start + dst.byteLength <= t.byteLength)) {
      throw new RangeError(`${this.path}: tensor "${name}": range [${start}, ${start + dst.byteLength}) outside its ${t.byteLength} bytes`);
    }
    await readExactly(this.fh, this.path, dst, t.byteOffset + start, name);
  }

  /** Release the file handle. Further reads throw CLOSED. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.fh.close();
  }

  private assertOpen(): void {
    if (this.closed) throw new GgufError('CLOSED', this.path, 'file was closed');
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
