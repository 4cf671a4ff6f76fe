import fs from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { type DType, DTYPE_BYTES, f32ToBf16, f32ToF16, isQuantDType, type HostArray } from '@nerva/core';
import { fmt, OffloadDirError } from './errors.js';

export interface SpillTensor {
  name: string;
  dtype: DType;
  length: number;
}

/** An offload dir must exist, be a directory, and be readable and writable: else one OffloadDirError. */
export function checkOffloadDir(dir: string): void {
  let st: fs.Stats;
  try {
    st = fs.statSync(dir);
  } catch (e) {
    throw new OffloadDirError(dir, `cannot be read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`, { cause: e });
  }
  if (!st.isDirectory()) throw new OffloadDirError(dir, 'is not a directory');
  try {
    fs.accessSync(dir, fs.constants.R_OK | fs.constants.W_OK);
  } catch (e) {
    throw new OffloadDirError(dir, `is not readable and writable (${(e as NodeJS.ErrnoException).code ?? 'EACCES'})`, { cause: e });
  }
}

/**
 * The disk tier: one spill file in the offload dir holding the blocks the host budget cannot,
 * in the backend's storage dtype, each tensor at a fixed offset. Checked before anything is
 * written (directory usable, enough free space); removed on dispose or on any write failure, so
 * a failed start leaves nothing half-written.
 */
export class DiskSpill {
  readonly file: string;
  private fd: number | undefined;
  private readonly offsets = new Map<string, { offset: number; tensor: SpillTensor }>();
  readonly bytes: number;
  readBytes = 0;
  readMs = 0;

  private constructor(file: string, fd: number, layout: ReadonlyMap<string, readonly SpillTensor[]>) {
    this.file = file;
    this.fd = fd;
    let off = 0;
    for (const [id, tensors] of layout) {
      for (const t of tensors) {
        this.offsets.set(`${id}\u0000${t.name}`, { offset: off, tensor: t });
        off += t.length * DTYPE_BYTES[t.dtype];
      }
    }
    this.bytes = off;
  }

  /**
   * Check the directory and the free space, then create the (empty) spill file: a new name,
   * created exclusively (no symlink followed) and private (0600), and unlinked at once where the
   * system allows it, so that no weights stay on disk after a crash.
   */
  static open(dir: string, layout: ReadonlyMap<string, readonly SpillTensor[]>): DiskSpill {
    checkOffloadDir(dir);
    let need = 0;
    for (const tensors of layout.values()) for (const t of tensors) need += t.length * DTYPE_BYTES[t.dtype];
    const fsStat = fs.statfsSync(dir);
    const free = fsStat.bavail * fsStat.bsize;
    if (free < need) throw new OffloadDirError(dir, `needs ${fmt(need)} for the disk tier, ${fmt(free)} free`);
    const file = path.join(dir, `nerva-spill-${process.pid}-${randomBytes(4).toString('hex')}.bin`);
    let fd: number;
    try {
      fd = fs.openSync(file, 'wx+', 0o600);
    } catch (e) {
      throw new OffloadDirError(dir, `cannot create a spill file (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`, { cause: e });
    }
    unlinkOpen(file);
    return new DiskSpill(file, fd, layout);
  }

  private where(id: string, name: string): { offset: number; tensor: SpillTensor } {
    const w = this.offsets.get(`${id}\u0000${name}`);
    if (!w) throw new RangeError(`spill: no tensor ${name} in block ${id}`);
    return w;
  }

  /** Store host data (backend.write's conventions: raw 16-bit bits or float32) at an element offset. */
  write(id: string, name: string, src: HostArray, elementOffset = 0): void {
    const { offset, tensor } = this.where(id, name);
    const eb = DTYPE_BYTES[tensor.dtype];
    // A quantized tensor takes its raw blocks (bytes), so its element count is bytes / eb.
    const quant = isQuantDType(tensor.dtype);
    const count = quant ? src.byteLength / eb : src.length;
    if (elementOffset < 0 || elementOffset + count > tensor.length) throw new RangeError(`spill: ${id}/${name} range [${elementOffset}, ${elementOffset + count}) outside ${tensor.length}`);
    let bytes: Uint8Array;
    if (quant) {
      if (!(src instanceof Uint8Array) || !Number.isInteger(count)) throw new TypeError(`spill: a ${tensor.dtype} tensor takes whole blocks as a Uint8Array`);
      bytes = src;
    } else if ((tensor.dtype === 'bf16' || tensor.dtype === 'f16') && src instanceof Float32Array) {
      const conv = tensor.dtype === 'bf16' ? f32ToBf16 : f32ToF16;
      const u = new Uint16Array(src.length);
      for (let i = 0; i < src.length; i++) u[i] = conv(src[i]);
      bytes = new Uint8Array(u.buffer);
    } else if (src.BYTES_PER_ELEMENT === eb) {
      bytes = new Uint8Array(src.buffer, src.byteOffset, src.byteLength);
    } else {
      throw new TypeError(`spill: a ${src.constructor.name} cannot be stored as ${tensor.dtype}`);
    }
    try {
      let done = 0;
      while (done < bytes.byteLength) done += fs.writeSync(this.fd!, bytes, done, bytes.byteLength - done, offset + elementOffset * eb + done);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      this.dispose();
      throw new OffloadDirError(path.dirname(this.file), code === 'ENOSPC' ? 'disk full while spilling weights' : `write failed (${code ?? (e as Error).message})`, { cause: e });
    }
  }

  /** Read one tensor into `dst` (its byte length). */
  readInto(id: string, name: string, dst: Uint8Array): void {
    const { offset, tensor } = this.where(id, name);
    const n = tensor.length * DTYPE_BYTES[tensor.dtype];
    if (dst.byteLength < n) throw new RangeError(`spill: destination of ${dst.byteLength} bytes for ${n}`);
    const t0 = performance.now();
    let done = 0;
    while (done < n) {
      const r = fs.readSync(this.fd!, dst, done, n - done, offset + done);
      if (r === 0) throw new OffloadDirError(path.dirname(this.file), `spill file ${this.file} is truncated`);
      done += r;
    }
    this.readBytes += n;
    this.readMs += performance.now() - t0;
  }

  dispose(): void {
    if (this.fd === undefined) return;
    try {
      fs.closeSync(this.fd);
    } finally {
      this.fd = undefined;
      fs.rmSync(this.file, { force: true });
    }
  }
}

/**
 * Remove the name of a file this process holds open: the data stays reachable through the fd
 * until it closes, and nothing is left behind however the process ends. Where an open file
 * cannot be unlinked (Windows) the name stays until dispose removes it.
 */
export function unlinkOpen(file: string): void {
  try {
    fs.unlinkSync(file);
  } catch {
    // removed on dispose instead
  }
}
