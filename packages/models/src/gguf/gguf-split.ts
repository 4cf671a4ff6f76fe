/**
 * Models written as several GGUF files, in llama.cpp's `gguf-split` form: files
 * `PREFIX-0000i-of-0000N.gguf`, each a complete GGUF file holding whole tensors in order, the
 * first with the model's metadata; every file carries `split.no` (u16), `split.count` (u16) and
 * `split.tensors.count` (i32). llama.cpp (and {@link GgufFile.open}) loads the model from the first.
 * Model hubs cap the size of one file (50 GB on Hugging Face), which large models exceed.
 */
import { unlink } from 'node:fs/promises';
import { GgufError } from './gguf-error.js';
import { ggufValue, type GgufValue } from './gguf-value.js';
import { ggufTensorBytes, writeGguf, type GgufWriteOptions, type GgufWriteTensor } from './gguf-writer.js';

export interface GgufSplitWriteOptions extends GgufWriteOptions {
  /** Most tensor data bytes a file holds (a larger tensor gets a file of its own); absent: one file. */
  readonly splitMaxBytes?: number;
}

export interface GgufSplitWriteResult {
  /** The files written, in order: `path` itself when one file holds the model. */
  readonly paths: readonly string[];
  /** Bytes of all of them. */
  readonly bytes: number;
}

/** llama.cpp's name of split `i` (0-based) of `count` of the model at `path` (which ends in `.gguf`). */
export function ggufSplitPath(path: string, i: number, count: number): string {
  const pad = (n: number) => String(n).padStart(5, '0');
  return `${path.slice(0, -'.gguf'.length)}-${pad(i + 1)}-of-${pad(count)}.gguf`;
}

/**
 * Write a model as one GGUF file at `path`, or, when its tensor data exceeds `splitMaxBytes`, as
 * llama.cpp's splits of `path` (tensors in order, each file filled up to the limit). Each file is
 * written as {@link writeGguf} writes one; on failure, files already written are removed. Throws
 * {@link GgufError}: BAD_INPUT for a limit that is not a positive integer or a split `path` not
 * ending in `.gguf`, EXISTS when a file to write exists and `overwrite` is not set, and every
 * code of {@link writeGguf}.
 */
export async function writeGgufSplits(path: string, opts: GgufSplitWriteOptions): Promise<GgufSplitWriteResult> {
  const max = opts.splitMaxBytes;
  if (max === undefined) {
    const r = await writeGguf(path, opts);
    return { paths: [path], bytes: r.bytes };
  }
  if (!(Number.isSafeInteger(max) && max > 0)) throw new GgufError('BAD_INPUT', path, `split size must be a positive whole number of bytes, got ${String(max)}`);
  if (!path.endsWith('.gguf')) throw new GgufError('BAD_INPUT', path, 'a split model is named PREFIX.gguf (its files PREFIX-00001-of-0000N.gguf)');
  const groups: { tensors: GgufWriteTensor[]; bytes: number }[] = [];
  for (const t of opts.tensors) {
    const size = ggufTensorBytes(path, t);
    const last = groups.at(-1);
    if (last && last.bytes + size <= max) {
      last.tensors.push(t);
      last.bytes += size;
    } else groups.push({ tensors: [t], bytes: size });
  }
  if (groups.length <= 1) {
    const r = await writeGguf(path, opts);
    return { paths: [path], bytes: r.bytes };
  }
  const count = groups.length;
  if (count > 0xffff) throw new GgufError('BAD_INPUT', path, `${count} splits: split.count is a u16`);
  const paths = groups.map((_, i) => ggufSplitPath(path, i, count));
  const total = groups.reduce((n, g) => n + g.bytes, 0);
  const written: string[] = [];
  let before = 0;
  let bytes = 0;
  try {
    for (let i = 0; i < count; i++) {
      const keys: [string, GgufValue][] = [
        ['split.no', ggufValue.u16(i)],
        ['split.count', ggufValue.u16(count)],
        ['split.tensors.count', ggufValue.i32(opts.tensors.length)],
      ];
      const base = before;
      const r = await writeGguf(paths[i], {
        metadata: i === 0 ? [...opts.metadata, ...keys] : keys,
        tensors: groups[i].tensors,
        ...(opts.alignment !== undefined && { alignment: opts.alignment }),
        ...(opts.overwrite !== undefined && { overwrite: opts.overwrite }),
        ...(opts.onProgress && { onProgress: (done: number, _: number, tensor: string) => opts.onProgress!(base + done, total, tensor) }),
      });
      written.push(paths[i]);
      before += groups[i].bytes;
      bytes += r.bytes;
    }
    return { paths, bytes };
  } catch (e) {
    for (const p of written) await unlink(p).catch(() => undefined);
    throw e;
  }
}
