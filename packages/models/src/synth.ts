import { mkdir, open as openFile, readFile, readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { f32ToBf16, f32ToF16 } from '@nerva/core';
import { SHARD_INDEX, SINGLE_FILE } from './checkpoint.js';
import { parseModelConfig, type ModelSpec } from './config.js';
import { ConfigError } from './errors.js';
import { canonicalWeightNames, listWeightSlots, type WeightSlot } from './weights.js';

export type SynthDType = 'bf16' | 'f16' | 'f32';

export interface SynthOptions {
  /** A config.json object, or a path to a config.json file or to a directory holding one. */
  config: object | string;
  outDir: string;
  /** PRNG seed; the same seed gives byte-identical tensors whatever the sharding. Default 0. */
  seed?: number;
  /** Upper bound on a shard's tensor bytes (a larger single tensor gets a shard of its own). Default 2 GiB. */
  shardBytes?: number;
  /** Stored dtype. Default 'bf16'. */
  dtype?: SynthDType;
  /** Called after each written chunk with bytes written so far and the total. */
  onProgress?: (done: number, total: number) => void;
}

export interface SynthResult {
  dir: string;
  spec: ModelSpec;
  /** Paths of the safetensors files written. */
  files: string[];
  /** Path of the shard index, when more than one shard was written. */
  indexPath?: string;
  /** Tensor bytes written (headers excluded). */
  totalBytes: number;
  numTensors: number;
}

/** Weight init: matrices, embeddings and biases ~ N(0, 0.02); norm weights ~ N(1, 0.02). */
const MATRIX_STD = 0.02;
const NORM_MEAN = 1.0;
const NORM_STD = 0.02;

const CHUNK_BYTES = 8 * 1024 * 1024;
const ST_DTYPE: Record<SynthDType, string> = { bf16: 'BF16', f16: 'F16', f32: 'F32' };
const ELEM_BYTES: Record<SynthDType, number> = { bf16: 2, f16: 2, f32: 4 };

/**
 * Write a random checkpoint with the real tensor names, shapes and HF layout of `config`:
 * `config.json`, then either `model.safetensors` or `model-0000i-of-0000N.safetensors` shards
 * plus `model.safetensors.index.json`. Values are deterministic from `seed` and streamed in
 * chunks, so a 16 GB model needs only a few MiB of memory. Existing weight files in `outDir`
 * are replaced; each shard appears under its final name only once complete.
 */
export async function writeSyntheticCheckpoint(opts: SynthOptions): Promise<SynthResult> {
  const dtype = opts.dtype ?? 'bf16';
  if (!(dtype in ST_DTYPE)) throw new RangeError(`synthetic checkpoint dtype must be bf16, f16 or f32, got ${String(dtype)}`);
  const shardBytes = opts.shardBytes ?? 2 * 1024 ** 3;
  if (!(shardBytes > 0)) throw new RangeError(`shardBytes must be positive, got ${shardBytes}`);
  const seed = (opts.seed ?? 0) >>> 0;

  const { json: configJson, text: configText, source } = await loadConfigInput(opts.config);
  const spec = parseModelConfig(configJson, source);
  const plan = planSyntheticCheckpoint(spec, { shardBytes, dtype });
  const elem = ELEM_BYTES[dtype];
  const sizeOf = (t: WeightSlot) => t.shape.reduce((a, b) => a * b, 1) * elem;

  await mkdir(opts.outDir, { recursive: true });
  await removeOldWeights(opts.outDir);
  await writeFile(join(opts.outDir, 'config.json'), configText);

  const { totalBytes } = plan;
  const shards = plan.shards.map((p) => p.tensors);
  const fileNames = plan.shards.map((p) => p.file);
  const gen = new ValueGenerator(dtype);
  const chunks = [new Uint8Array(new ArrayBuffer(CHUNK_BYTES)), new Uint8Array(new ArrayBuffer(CHUNK_BYTES))];
  let done = 0;
  const weightMap: Record<string, string> = {};
  const files: string[] = [];

  for (let si = 0; si < shards.length; si++) {
    const path = join(opts.outDir, fileNames[si]);
    const tmp = `${path}.partial`;
    const header: Record<string, unknown> = { __metadata__: { format: 'pt' } };
    let off = 0;
    for (const s of shards[si]) {
      const n = sizeOf(s);
      header[s.name] = { dtype: ST_DTYPE[dtype], shape: s.shape, data_offsets: [off, off + n] };
      off += n;
      weightMap[s.name] = fileNames[si];
    }
    let headerText = JSON.stringify(header);
    // Pad with spaces to 8-byte alignment so the data section is aligned for any dtype.
    headerText += ' '.repeat((8 - ((Buffer.byteLength(headerText) + 8) % 8)) % 8);
    const headerBytes = Buffer.from(headerText, 'utf8');
    const prefix = Buffer.alloc(8 + headerBytes.length);
    prefix.writeBigUInt64LE(BigInt(headerBytes.length), 0);
    headerBytes.copy(prefix, 8);

    const fh = await openFile(tmp, 'w');
    try {
      let pos = 0;
      await fh.write(prefix, 0, prefix.length, pos);
      pos += prefix.length;
      // Two chunks: the next one is generated while the previous one is being written.
      let inFlight: Promise<void> = Promise.resolve();
      let which = 0;
      for (const s of shards[si]) {
        const isNorm = s.shape.length === 1 && /norm\.weight$/.test(s.name);
        gen.start(tensorSeed(seed, s.name), isNorm ? NORM_MEAN : 0, isNorm ? NORM_STD : MATRIX_STD);
        let left = sizeOf(s);
        while (left > 0) {
          const n = Math.min(left, CHUNK_BYTES);
          const buf = chunks[which].subarray(0, n);
          which ^= 1;
          gen.fill(buf);
          await inFlight;
          const at = pos;
          inFlight = writeAll(fh, buf, at).then(() => {
            done += n;
            opts.onProgress?.(done, totalBytes);
          });
          pos += n;
          left -= n;
        }
      }
      await inFlight;
    } finally {
      await fh.close();
    }
    await rename(tmp, path);
    files.push(path);
  }

  let indexPath: string | undefined;
  if (shards.length > 1) {
    indexPath = join(opts.outDir, SHARD_INDEX);
    const params = totalBytes / elem;
    await writeFile(indexPath, JSON.stringify({ metadata: { total_parameters: params, total_size: totalBytes }, weight_map: weightMap }, null, 2));
  }
  return { dir: opts.outDir, spec, files, indexPath, totalBytes, numTensors: plan.numTensors };
}

/** One file of a synthetic checkpoint. */
export interface ShardPlan {
  file: string;
  tensors: WeightSlot[];
  bytes: number;
}

/** How {@link writeSyntheticCheckpoint} lays `spec` out, without writing anything. */
export interface CheckpointPlan {
  shards: ShardPlan[];
  totalBytes: number;
  numTensors: number;
}

/**
 * Shard layout for `spec`: tensors in load order, packed greedily into shards of at most
 * `shardBytes` (HF's rule; a tensor larger than that gets a shard of its own). One shard is
 * named `model.safetensors`, several `model-0000i-of-0000N.safetensors`.
 */
export function planSyntheticCheckpoint(spec: ModelSpec, opts: { shardBytes?: number; dtype?: SynthDType } = {}): CheckpointPlan {
  const elem = ELEM_BYTES[opts.dtype ?? 'bf16'];
  const shardBytes = opts.shardBytes ?? 2 * 1024 ** 3;
  const slots = listWeightSlots(canonicalWeightNames(spec));
  const groups: { tensors: WeightSlot[]; bytes: number }[] = [];
  let cur: { tensors: WeightSlot[]; bytes: number } | undefined;
  let total = 0;
  for (const t of slots) {
    const n = t.shape.reduce((a, b) => a * b, 1) * elem;
    if (!cur || (cur.tensors.length > 0 && cur.bytes + n > shardBytes)) {
      cur = { tensors: [], bytes: 0 };
      groups.push(cur);
    }
    cur.tensors.push(t);
    cur.bytes += n;
    total += n;
  }
  const pad = (i: number) => String(i).padStart(5, '0');
  const shards = groups.map((g, i) => ({ file: groups.length === 1 ? SINGLE_FILE : `model-${pad(i + 1)}-of-${pad(groups.length)}.safetensors`, ...g }));
  return { shards, totalBytes: total, numTensors: slots.length };
}

async function loadConfigInput(config: object | string): Promise<{ json: unknown; text: string; source: string }> {
  if (typeof config !== 'string') return { json: config, text: JSON.stringify(config, null, 2), source: 'config object' };
  let path = config;
  try {
    if ((await stat(path)).isDirectory()) path = join(path, 'config.json');
  } catch {
    // Fall through: readFile reports the missing path.
  }
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (e) {
    throw new ConfigError('NOT_FOUND', path, `cannot read model config: ${(e as Error).message}`);
  }
  try {
    return { json: JSON.parse(text), text, source: path };
  } catch (e) {
    throw new ConfigError('NOT_JSON', path, `not valid JSON: ${(e as Error).message}`);
  }
}

async function removeOldWeights(dir: string): Promise<void> {
  // A stale index or shard from an earlier run would shadow or mix with the new files.
  for (const name of await readdir(dir)) {
    if (name === SINGLE_FILE || name === SHARD_INDEX || /^model-\d+-of-\d+\.safetensors(\.partial)?$/.test(name) || name === `${SINGLE_FILE}.partial`) {
      await rm(join(dir, name), { force: true });
    }
  }
}

async function writeAll(fh: import('node:fs/promises').FileHandle, buf: Uint8Array, pos: number): Promise<void> {
  let off = 0;
  while (off < buf.length) {
    const { bytesWritten } = await fh.write(buf, off, buf.length - off, pos + off);
    off += bytesWritten;
  }
}

/** FNV-1a of the tensor name mixed with the seed: each tensor has its own stream. */
function tensorSeed(seed: number, name: string): number {
  let h = 0x811c9dc5 ^ seed;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

/** Standard normal quantile (inverse CDF), Acklam's rational approximation (rel. error < 1.2e-9). */
function normalQuantile(p: number): number {
  const a = [-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.357751867269, -30.66479806614716, 2.506628277459239];
  const b = [-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972, -13.28068155288572];
  const c = [-0.007784894002430293, -0.3223964580411365, -2.400758277161838, -2.549732539343734, 4.374664141464968, 2.938163982698783];
  const d = [0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416];
  const lo = 0.02425;
  if (p < lo) {
    const q = Math.sqrt(-2 * Math.log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > 1 - lo) return -normalQuantile(1 - p);
  const q = p - 0.5;
  const r = q * q;
  return ((((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q) / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

let standardNormalTable: Float64Array | undefined;

/** 65536 equiprobable normal quantiles: a 16-bit random index then samples N(0, 1) by table lookup. */
function normalTable(): Float64Array {
  if (!standardNormalTable) {
    standardNormalTable = new Float64Array(65536);
    for (let i = 0; i < 65536; i++) standardNormalTable[i] = normalQuantile((i + 0.5) / 65536);
  }
  return standardNormalTable;
}

/**
 * Streams normal-distributed values in the target encoding. Values come from a per-(mean, std)
 * table of pre-encoded quantiles indexed by xorshift128 output, so generating gigabytes costs a
 * shift and a load per value rather than a log and a cosine.
 */
class ValueGenerator {
  private readonly tables = new Map<string, Uint16Array | Float32Array>();
  private table!: Uint16Array | Float32Array;
  private x = 0;
  private y = 0;
  private z = 0;
  private w = 0;

  constructor(private readonly dtype: SynthDType) {}

  start(seed: number, mean: number, std: number): void {
    const key = `${mean}:${std}`;
    let t = this.tables.get(key);
    if (!t) {
      const n = normalTable();
      if (this.dtype === 'f32') t = Float32Array.from(n, (v) => mean + std * v);
      else {
        const enc = this.dtype === 'bf16' ? f32ToBf16 : f32ToF16;
        t = Uint16Array.from(n, (v) => enc(mean + std * v));
      }
      this.tables.set(key, t);
    }
    this.table = t;
    // SplitMix32-style scrambling so that nearby seeds give unrelated streams.
    let s = seed >>> 0;
    const next = () => {
      s = (s + 0x9e3779b9) >>> 0;
      let z = s;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.x = next();
    this.y = next();
    this.z = next();
    this.w = next() | 1; // xorshift128 state must not be all zero
  }

  /** Fill `out` (whose length is a multiple of the element size) with the next values. */
  fill(out: Uint8Array): void {
    const f32 = this.dtype === 'f32';
    const dst = f32 ? new Float32Array(out.buffer, out.byteOffset, out.byteLength / 4) : new Uint16Array(out.buffer, out.byteOffset, out.byteLength / 2);
    const t = this.table;
    // xorshift128 with the state in locals: this loop runs once per two values of the whole model.
    let { x, y, z, w } = this;
    const n = dst.length;
    for (let i = 0; i < n; i += 2) {
      const s = x ^ (x << 11);
      x = y;
      y = z;
      z = w;
      w = w ^ (w >>> 19) ^ (s ^ (s >>> 8));
      const r = w >>> 0;
      dst[i] = t[r & 0xffff];
      if (i + 1 < n) dst[i + 1] = t[r >>> 16];
    }
    this.x = x;
    this.y = y;
    this.z = z;
    this.w = w;
  }
}
