import type { CheckpointTensorInfo } from './checkpoint.js';

/**
 * Where a model's weights are read from, by Hugging Face tensor name: a safetensors
 * {@link Checkpoint} or a GGUF file ({@link GgufCheckpoint}). The engine reads weights only
 * through this surface.
 */
export interface WeightStore {
  /** What the weights were opened from (a folder, a shard index, a .safetensors or .gguf file), named in errors. */
  readonly source: string;
  /** Every tensor name the store serves. */
  names(): string[];
  has(name: string): boolean;
  /** The tensor's dtype, shape (HF layout) and bytes as served; throws MISSING_TENSOR when absent. */
  info(name: string): CheckpointTensorInfo;
  /** The tensor's bytes as served (`info(name).byteLength` of `info(name).dtype`). */
  readRaw(name: string): Promise<Uint8Array>;
  /** {@link readRaw} into a caller's buffer of at least `byteLength` bytes. */
  readRawInto(name: string, dst: Uint8Array): Promise<void>;
  /** The tensor widened to float32. */
  readF32(name: string): Promise<Float32Array>;
  /** Bytes of all tensors as served. */
  readonly totalBytes: number;
  close(): Promise<void>;
}
