import { dequantize, GGML_TYPES, type GgmlTypeName } from '@nerva/core';
import { rawToF32, type WeightDType } from '../safetensors.js';
import type { ModelSpec } from '../config.js';
import type { CheckpointTensorInfo, WeightStore } from '../weight-store.js';
import { GgufError } from './gguf-error.js';
import { GgufFile } from './gguf-file.js';
import type { GgufTensorInfo } from './gguf-header.js';
import { hfNamesOf, permuteRopeRows, ropePermutedHeads } from './gguf-names.js';
import { ggufModelSpec, ROPE_FREQS_TENSOR } from './gguf-spec.js';

/** A tensor as a {@link GgufCheckpoint} serves it, with where its stored form lives. */
export interface GgufCheckpointTensorInfo extends CheckpointTensorInfo {
  /** The ggml type it is stored as. Not F32/F16/BF16: it is served dequantized (`dtype` 'F32'). */
  readonly ggmlType: GgmlTypeName;
  /** Bytes of its stored (block) form: what {@link GgufCheckpoint.readBlocks} returns. */
  readonly rawByteLength: number;
  /** The GGUF tensor holding it. */
  readonly ggufName: string;
  /** Its index in a stacked expert tensor (`blk.N.ffn_*_exps`), when it is one expert's slice. */
  readonly expert?: number;
}

interface Served {
  readonly info: GgufCheckpointTensorInfo;
  readonly tensor: GgufTensorInfo;
  /** Start of its stored bytes within the GGUF tensor. */
  readonly start: number;
  /** Rotary heads whose rows llama.cpp reordered (0: none). */
  readonly heads: number;
  readonly elements: number;
}

const FLOAT_TYPES: ReadonlySet<GgmlTypeName> = new Set(['F32', 'F16', 'BF16']);
/** `rope_freqs` has head_dim / 2 entries; anything larger is not that tensor. */
const MAX_ROPE_FREQS = 4096;

/**
 * A GGUF model file served through the same surface as a safetensors {@link Checkpoint}: tensors
 * by their Hugging Face names and shapes, q/k rows back in HF order (llama.cpp's `llama` converter
 * reorders them), one tensor per expert (GGUF stacks them). F32/F16/BF16 tensors are served as
 * stored. Quantized tensors are served dequantized to float32 (`info().dtype` 'F32',
 * `byteLength` = elements × 4, {@link readRaw} returns the float32 bytes), which every backend
 * runs today; their block form stays reachable through `info().ggmlType`,
 * `info().rawByteLength` and {@link readBlocks}: the hook a quantized engine path uses to upload
 * the blocks themselves.
 */
export class GgufCheckpoint implements WeightStore {
  private constructor(
    /** The open file (metadata through `file.metadata`). */
    readonly file: GgufFile,
    /** The model the file describes. */
    readonly spec: ModelSpec,
    private readonly served: ReadonlyMap<string, Served>,
  ) {}

  /**
   * Open `path`, validate its header, read its {@link ModelSpec} from the metadata and map its
   * tensors to HF names. Throws {@link GgufError}: every code of {@link GgufFile.open} and
   * {@link ggufModelSpec}, UNSUPPORTED_TYPE for a stored type that cannot be dequantized,
   * SHAPE_MISMATCH for a stacked expert tensor that is not 3-D or q/k rows that do not split
   * into heads, DUPLICATE_TENSOR when two tensors would serve one name.
   */
  static async open(path: string): Promise<GgufCheckpoint> {
    const file = await GgufFile.open(path);
    try {
      let ropeFreqs: Float32Array | undefined;
      if (file.has(ROPE_FREQS_TENSOR)) {
        const t = file.tensor(ROPE_FREQS_TENSOR);
        if (t.dims.length !== 1 || t.elements > MAX_ROPE_FREQS || !FLOAT_TYPES.has(t.type)) {
          throw new GgufError('SHAPE_MISMATCH', path, `must be a 1-D float tensor of at most ${MAX_ROPE_FREQS} values`, { tensor: ROPE_FREQS_TENSOR });
        }
        ropeFreqs = rawToF32(t.type as WeightDType, await file.readTensor(ROPE_FREQS_TENSOR));
      }
      const spec = ggufModelSpec({ path, metadata: file.metadata, tensors: file.tensors, ropeFreqs });
      return new GgufCheckpoint(file, spec, serveMap(file, spec));
    } catch (e) {
      await file.close().catch(() => undefined);
      throw e;
    }
  }

  /** The file's path. */
  get source(): string {
    return this.file.path;
  }

  names(): string[] {
    return [...this.served.keys()];
  }

  has(name: string): boolean {
    return this.served.has(name);
  }

  /** The tensor as served (dtype, HF shape, served bytes) and its stored form; throws MISSING_TENSOR. */
  info(name: string): GgufCheckpointTensorInfo {
    return this.entry(name).info;
  }

  /** Bytes of every tensor as served. */
  get totalBytes(): number {
    let n = 0;
    for (const s of this.served.values()) n += s.info.byteLength;
    return n;
  }

  /**
   * The stored ggml blocks of `name`, rows in HF order: what a quantized kernel uploads. For
   * F32/F16/BF16 tensors the same bytes as {@link readRaw}.
   */
  async readBlocks(name: string): Promise<Uint8Array> {
    const s = this.entry(name);
    const raw = new Uint8Array(new ArrayBuffer(s.info.rawByteLength));
    await this.file.readTensorRange(s.tensor.name, s.start, raw);
    return s.heads > 0 ? permuteRopeRows(raw, s.info.shape[0], s.heads, false) : raw;
  }

  /** The bytes of `name` as served: stored floats as they are, quantized blocks dequantized to float32. */
  async readRaw(name: string): Promise<Uint8Array> {
    const s = this.entry(name);
    const blocks = await this.readBlocks(name);
    if (FLOAT_TYPES.has(s.info.ggmlType)) return blocks;
    const f = dequantize(s.info.ggmlType, blocks, s.elements);
    return new Uint8Array(f.buffer, f.byteOffset, f.byteLength);
  }

  async readRawInto(name: string, dst: Uint8Array): Promise<void> {
    const s = this.entry(name);
    if (dst.byteLength < s.info.byteLength) {
      throw new RangeError(`${this.source}: tensor "${name}" needs ${s.info.byteLength} bytes, destination has ${dst.byteLength}`);
    }
    dst.set(await this.readRaw(name));
  }

  async readF32(name: string): Promise<Float32Array> {
    const s = this.entry(name);
    const blocks = await this.readBlocks(name);
    if (FLOAT_TYPES.has(s.info.ggmlType)) return rawToF32(s.info.ggmlType as WeightDType, blocks);
    return dequantize(s.info.ggmlType, blocks, s.elements);
  }

  async close(): Promise<void> {
    await this.file.close();
  }

  private entry(name: string): Served {
    const s = this.served.get(name);
    if (!s) throw new GgufError('MISSING_TENSOR', this.source, 'not in this file', { tensor: name });
    return s;
  }
}

function serveMap(file: GgufFile, spec: ModelSpec): Map<string, Served> {
  const path = file.path;
  const out = new Map<string, Served>();
  for (const t of file.tensors) {
    if (!FLOAT_TYPES.has(t.type)) {
      const { blockSize, typeSize } = GGML_TYPES[t.type];
      try {
        dequantize(t.type, new Uint8Array(typeSize), blockSize);
      } catch (e) {
        throw new GgufError('UNSUPPORTED_TYPE', path, `stored as ${t.type}, which cannot be dequantized yet (${(e as Error).message})`, { tensor: t.name }, { cause: e });
      }
    }
    const stacked = /^blk\.\d+\.ffn_(gate|up|down)_exps\.weight$/.test(t.name);
    if (stacked && t.dims.length !== 3) {
      throw new GgufError('SHAPE_MISMATCH', path, `a stacked expert tensor must be 3-D, found dims [${t.dims.join(', ')}]`, { tensor: t.name });
    }
    const experts = stacked ? t.dims[2] : 0;
    const names = hfNamesOf(t.name, experts) ?? [t.name];
    const shape = stacked ? [t.dims[1], t.dims[0]] : [...t.dims].reverse();
    const elements = stacked ? t.dims[0] * t.dims[1] : t.elements;
    const rawByteLength = stacked ? t.byteLength / experts : t.byteLength;
    const heads = ropePermutedHeads(spec.arch, t.name, spec.numHeads, spec.numKvHeads);
    if (heads > 0 && (shape[0] % heads !== 0 || (shape[0] / heads) % 2 !== 0)) {
      throw new GgufError('SHAPE_MISMATCH', path, `${shape[0]} rows do not split into ${heads} rotary heads of even size`, { tensor: t.name });
    }
    const float = FLOAT_TYPES.has(t.type);
    names.forEach((name, i) => {
      if (out.has(name)) throw new GgufError('DUPLICATE_TENSOR', path, `two tensors would both serve "${name}"`, { tensor: t.name });
      const start = i * rawByteLength;
      const info: GgufCheckpointTensorInfo = {
        dtype: float ? (t.type as WeightDType) : 'F32',
        shape: Object.freeze([...shape]),
        byteOffset: t.byteOffset + start,
        byteLength: float ? rawByteLength : elements * 4,
        file: file.pathOf(t.name),
        ggmlType: t.type,
        rawByteLength,
        ggufName: t.name,
        ...(stacked && { expert: i }),
      };
      out.set(name, { info: Object.freeze(info), tensor: t, start, heads, elements });
    });
  }
  return out;
}
