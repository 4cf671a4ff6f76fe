import { open, realpath } from 'node:fs/promises';
import { basename, dirname, isAbsolute, join, relative, sep } from 'node:path';
import { NervaError } from '@nerva/core';

/**
 * Reading the files of a model folder that may come from anyone (a downloaded repository): a
 * file is resolved with `realpath` and must stay inside the folder, so a symlinked
 * `chat_template.jinja` cannot make the server read (and echo back as prompt tokens) any file
 * on the machine; and every JSON or text file has a size cap, so a huge file cannot exhaust
 * memory. A Hugging Face cache snapshot is the exception that proves the rule: its files are
 * symlinks into the repository's `blobs/`, so there the confinement root is the repository.
 */

/** Caps, by file: generous for real models (Qwen's tokenizer.json is 7 MiB, Gemma's 33 MiB). */
export const MODEL_FILE_CAPS = {
  'config.json': 4 << 20,
  'generation_config.json': 1 << 20,
  'tokenizer.json': 128 << 20,
  'tokenizer_config.json': 32 << 20,
  'chat_template.jinja': 4 << 20,
  'model.safetensors.index.json': 64 << 20,
} as const;

/** Why a model-folder file was refused. */
export type ModelFileErrorCode = 'NOT_FOUND' | 'OUTSIDE_MODEL_DIR' | 'TOO_LARGE' | 'NOT_A_FILE' | 'IO';

export class ModelFileError extends NervaError {
  declare readonly code: ModelFileErrorCode;
  constructor(
    code: ModelFileErrorCode,
    readonly file: string,
    detail: string,
    options?: { cause?: unknown },
  ) {
    super(code, `${file}: ${detail} [${code}]`, options);
  }
}

/** The folder files of `dir` must resolve into: its real path, or a cache snapshot's repository. */
export async function confinementRoot(dir: string): Promise<string> {
  const real = await realpath(dir);
  // <cache>/models--org--name/snapshots/<revision>: files link to <cache>/models--org--name/blobs/<hash>.
  const up = dirname(real);
  if (basename(up) === 'snapshots' && basename(dirname(up)).startsWith('models--')) return dirname(up);
  return real;
}

function within(path: string, root: string): boolean {
  const r = relative(root, path);
  return r === '' || (!r.startsWith(`..${sep}`) && r !== '..' && !isAbsolute(r));
}

/**
 * The real path of `name` in model folder `dir`, refused when it resolves outside the folder.
 * Throws {@link ModelFileError} NOT_FOUND when it does not exist.
 */
export async function confinedPath(dir: string, name: string, root?: string): Promise<string> {
  const path = join(dir, name);
  let real: string;
  try {
    real = await realpath(path);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new ModelFileError(code === 'ENOENT' ? 'NOT_FOUND' : 'IO', path, `cannot resolve: ${(e as Error).message}`, { cause: e });
  }
  const top = root ?? (await confinementRoot(dir));
  if (!within(real, top)) throw new ModelFileError('OUTSIDE_MODEL_DIR', path, `resolves to ${real}, outside the model folder ${top}`);
  return real;
}

/**
 * Read `name` of model folder `dir` as UTF-8 text: confined to the folder and at most `maxBytes`
 * (default: the file's cap in {@link MODEL_FILE_CAPS}, else 4 MiB). The size is checked on the
 * opened file, so a file swapped after the check cannot slip past it.
 */
export async function readModelText(dir: string, name: string, maxBytes?: number): Promise<string> {
  const real = await confinedPath(dir, name);
  const cap = maxBytes ?? (MODEL_FILE_CAPS as Record<string, number>)[basename(name)] ?? 4 << 20;
  const fh = await open(real, 'r').catch((e: Error) => {
    throw new ModelFileError('IO', real, `cannot open: ${e.message}`, { cause: e });
  });
  try {
    const st = await fh.stat();
    if (!st.isFile()) throw new ModelFileError('NOT_A_FILE', real, 'not a regular file');
    if (st.size > cap) throw new ModelFileError('TOO_LARGE', real, `${st.size} bytes exceeds the ${cap}-byte cap for this file`);
    const buf = Buffer.alloc(st.size);
    let off = 0;
    while (off < st.size) {
      const { bytesRead } = await fh.read(buf, off, st.size - off, off);
      if (bytesRead === 0) break;
      off += bytesRead;
    }
    return buf.subarray(0, off).toString('utf8');
  } finally {
    await fh.close();
  }
}

/** {@link readModelText}, or undefined when the file does not exist. */
export async function readOptionalModelText(dir: string, name: string, maxBytes?: number): Promise<string | undefined> {
  try {
    return await readModelText(dir, name, maxBytes);
  } catch (e) {
    if (e instanceof ModelFileError && e.code === 'NOT_FOUND') return undefined;
    throw e;
  }
}
