import type { GgmlTypeName } from '@nerva/core';
import type { TensorInfo } from './safetensors.js';

/** A tensor's location: its file plus where it lives in it. */
export interface CheckpointTensorInfo extends TensorInfo {
  /** Absolute path of the file (a safetensors shard, a GGUF file) holding the tensor. */
  readonly file: string;
}

/** A tensor as a {@link WeightStore} serves it; GGUF stores also say how it is stored. */
export interface WeightTensorInfo extends CheckpointTensorInfo {
  /** GGUF only: the ggml type the tensor is stored as (a block type is served dequantized, `dtype` 'F32'). */
  readonly ggmlType?: GgmlTypeName;
  /** GGUF only: bytes of the stored (block) form, what `readBlocks` returns. */
  readonly rawByteLength?: number;
}

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
  info(name: string): WeightTensorInfo;
  /** The tensor's bytes as served (`info(name).byteLength` of `info(name).dtype`). */
  readRaw(name: string): Promise<Uint8Array>;
  /** {@link readRaw} into a caller's buffer of at least `byteLength` bytes. */
  readRawInto(name: string, dst: Uint8Array): Promise<void>;
  /** The tensor widened to float32. */
  readF32(name: string): Promise<Float32Array>;
  /** Bytes of all tensors as served. */
  readonly totalBytes: number;
  /**
   * GGUF only: the stored ggml blocks of `name` (`info(name).rawByteLength` bytes), rows in HF
   * order: what a quantized engine path uploads instead of the dequantized floats.
   */
  readBlocks?(name: string): Promise<Uint8Array>;
  close(): Promise<void>;
}
