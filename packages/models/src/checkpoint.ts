import { stat } from 'node:fs/promises';
import { basename, dirname, isAbsolute, join, normalize, sep } from 'node:path';
import { CheckpointError } from './errors.js';
import { confinedPath, confinementRoot, readModelText } from './model-file.js';
import { SafetensorsFile } from './safetensors.js';
import type { CheckpointTensorInfo, WeightStore } from './weight-store.js';

/** File names of the Hugging Face layout. */
export const SINGLE_FILE = 'model.safetensors';
export const SHARD_INDEX = 'model.safetensors.index.json';

/**
 * A model's weights: one `model.safetensors`, or shards listed by `model.safetensors.index.json`.
 * Every shard is opened and validated up front, so a checkpoint that opens is complete.
 */
export class Checkpoint implements WeightStore {
  private constructor(
    /** Directory the checkpoint was opened from. */
    readonly dir: string,
    /** The open shard files (one for a single-file checkpoint). */
    readonly files: readonly SafetensorsFile[],
    private readonly map: ReadonlyMap<string, SafetensorsFile>,
    /** Path of the shard index, when sharded. */
    readonly indexPath?: string,
  ) {}

  /**
   * Open the checkpoint in `dir` (or a single `.safetensors` file path): `model.safetensors` when
   * present, else the shards of `model.safetensors.index.json`. Throws
   * {@link CheckpointError}: NOT_FOUND when there is neither index nor single file, BAD_INDEX for
   * a malformed index, MISSING_SHARD naming a shard the index lists that does not exist,
   * MISSING_TENSOR when a mapped tensor is not in its shard, plus any per-file validation error.
   */
  static async open(dir: string): Promise<Checkpoint> {
    if (dir.endsWith('.safetensors') && (await isFile(dir))) {
      const f = await SafetensorsFile.open(dir);
      return new Checkpoint(dirname(dir), [f], new Map(f.names().map((n) => [n, f])));
    }
    // Same precedence as transformers: a single model.safetensors wins over an index.
    const single = join(dir, SINGLE_FILE);
    if (await isFile(single)) {
      const f = await SafetensorsFile.open(await confinedPath(dir, SINGLE_FILE));
      return new Checkpoint(dir, [f], new Map(f.names().map((n) => [n, f])));
    }
    const indexPath = join(dir, SHARD_INDEX);
    if (await isFile(indexPath)) return Checkpoint.openSharded(dir, indexPath);
    throw new CheckpointError('NOT_FOUND', dir, `no ${SHARD_INDEX} and no ${SINGLE_FILE} in this directory`);
  }

  private static async openSharded(dir: string, indexPath: string): Promise<Checkpoint> {
    let index: unknown;
    const text = await readModelText(dir, basename(indexPath));
    try {
      index = JSON.parse(text);
    } catch (e) {
      throw new CheckpointError('BAD_INDEX', indexPath, `not valid JSON: ${(e as Error).message}`, undefined, { cause: e });
    }
    const weightMap = (index as { weight_map?: unknown } | null)?.weight_map;
    if (typeof weightMap !== 'object' || weightMap === null || Array.isArray(weightMap)) {
      throw new CheckpointError('BAD_INDEX', indexPath, '"weight_map" is missing or not an object');
    }
    const shardNames = new Set<string>();
    for (const [tensor, shard] of Object.entries(weightMap)) {
      if (typeof shard !== 'string' || shard === '') throw new CheckpointError('BAD_INDEX', indexPath, 'shard name is not a non-empty string', tensor);
      // The index must not send reads outside the checkpoint directory.
      if (isAbsolute(shard) || normalize(shard).split(sep).includes('..')) {
        throw new CheckpointError('BAD_INDEX', indexPath, `shard "${shard}" points outside the checkpoint directory`, tensor);
      }
      shardNames.add(shard);
    }
    if (shardNames.size === 0) throw new CheckpointError('BAD_INDEX', indexPath, '"weight_map" is empty');
    for (const shard of shardNames) {
      if (!(await isFile(join(dir, shard)))) {
        throw new CheckpointError('MISSING_SHARD', indexPath, `shard "${shard}" listed in weight_map does not exist in ${dir}`);
      }
    }
    const opened = new Map<string, SafetensorsFile>();
    try {
      // Each shard resolved with realpath and kept inside the folder (a symlinked shard may not point elsewhere).
      const root = await confinementRoot(dir);
      for (const shard of shardNames) opened.set(shard, await SafetensorsFile.open(await confinedPath(dir, shard, root)));
      const map = new Map<string, SafetensorsFile>();
      for (const [tensor, shard] of Object.entries(weightMap as Record<string, string>)) {
        const f = opened.get(shard)!;
        if (!f.has(tensor)) {
          throw new CheckpointError('MISSING_TENSOR', f.path, `listed in ${basename(indexPath)} for shard "${shard}" but not present in it`, tensor);
        }
        map.set(tensor, f);
      }
      return new Checkpoint(dir, [...opened.values()], map, indexPath);
    } catch (e) {
      await Promise.all([...opened.values()].map((f) => f.close().catch(() => undefined)));
      throw e;
    }
  }

  /** The shard index, the single file, or the folder: what errors name. */
  get source(): string {
    return this.indexPath ?? this.files[0]?.path ?? this.dir;
  }

  /** Every tensor name in the checkpoint. */
  names(): string[] {
    return [...this.map.keys()];
  }

  has(name: string): boolean {
    return this.map.has(name);
  }

  /** Where `name` lives; throws MISSING_TENSOR naming the checkpoint when absent. */
  info(name: string): CheckpointTensorInfo {
    const f = this.fileOf(name);
    return { ...f.info(name), file: f.path };
  }

  readRaw(name: string): Promise<Uint8Array> {
    return this.fileOf(name).readRaw(name);
  }

  readRawInto(name: string, dst: Uint8Array): Promise<void> {
    return this.fileOf(name).readRawInto(name, dst);
  }

  readF32(name: string): Promise<Float32Array> {
    return this.fileOf(name).readF32(name);
  }

  /** Bytes of all tensors in the checkpoint. */
  get totalBytes(): number {
    let n = 0;
    for (const [name, f] of this.map) n += f.info(name).byteLength;
    return n;
  }

  async close(): Promise<void> {
    await Promise.all(this.files.map((f) => f.close()));
  }

  private fileOf(name: string): SafetensorsFile {
    const f = this.map.get(name);
    if (!f) throw new CheckpointError('MISSING_TENSOR', this.indexPath ?? this.files[0]?.path ?? this.dir, 'not in this checkpoint', name);
    return f;
  }
}

async function isFile(p: string): Promise<boolean> {
  try {
    return (await stat(p)).isFile();
  } catch {
    return false;
  }
}
