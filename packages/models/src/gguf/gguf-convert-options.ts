/** Options and result of a conversion to GGUF, and the check both conversions make before writing. */
import { GGML_TYPES, quantize, type GgmlTypeName } from '@nerva/core';
import { GgufError } from './gguf-error.js';
import type { GgufConvertType } from './gguf-type-plan.js';

export interface ConvertToGgufOptions {
  /** A Hugging Face model folder (config.json + safetensors [+ tokenizer.json]), or a `.gguf` file to write again at `type`. */
  readonly source: string;
  /** The GGUF file to write. */
  readonly out: string;
  readonly type: GgufConvertType;
  /** `general.name` (default: the folder's name; a GGUF source's own). */
  readonly name?: string;
  /** A GGUF source: re-encode tensors that are already block-quantized (default false: BAD_INPUT). */
  readonly allowRequantize?: boolean;
  /** Replace an existing `out` (default false: EXISTS). */
  readonly overwrite?: boolean;
  /**
   * Most tensor data bytes one file holds: a larger model is written as llama.cpp's splits of
   * `out` (`PREFIX-00001-of-0000N.gguf`...; see `writeGgufSplits`). Absent: one file.
   */
  readonly splitMaxBytes?: number;
  /** Bytes of tensor data written so far, of the total, and the tensor being written. */
  readonly onProgress?: (done: number, total: number, tensor: string) => void;
}

/** One tensor of the written file. */
export interface ConvertedTensor {
  readonly name: string;
  readonly type: GgmlTypeName;
  readonly dims: readonly number[];
}

export interface ConvertToGgufResult {
  /** The file to load the model from: `out`, or its first split. */
  readonly out: string;
  /** Every file written, in order. */
  readonly files: readonly string[];
  /** Bytes of all of them. */
  readonly bytes: number;
  /** `general.file_type`. */
  readonly fileType: number;
  readonly tensors: readonly ConvertedTensor[];
  /** False when the folder has no tokenizer.json or the GGUF source no vocabulary (the file then carries none). */
  readonly tokenizer: boolean;
}

/**
 * Refuses (UNSUPPORTED_TYPE) a plan that puts tensors in a type with no encoder, before anything
 * is written.
 */
export function assertQuantizable(types: ReadonlyMap<string, GgmlTypeName>, fileType: string, out: string): void {
  for (const q of new Set(types.values())) {
    try {
      quantize(q, new Float32Array(GGML_TYPES[q].blockSize));
    } catch (e) {
      const users = [...types].filter(([, t]) => t === q).map(([n]) => n);
      throw new GgufError('UNSUPPORTED_TYPE', out, `${fileType} puts ${users.length} tensors (e.g. ${users[0]}) in ${q}, whose quantization is not available: ${(e as Error).message}`, {}, { cause: e });
    }
  }
}

