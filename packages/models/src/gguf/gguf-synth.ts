/**
 * Random GGUF files at a real model's shapes, for benchmarks: the layout, type rules and metadata
 * `convertToGguf` writes, with random blocks in place of quantized weights (speed does not depend
 * on the values, and quantizing 8 billion values in JavaScript takes about an hour). No
 * vocabulary: the file carries llama.cpp's "none" tokenizer, prompts are token ids.
 */
import { resolve } from 'node:path';
import { GGML_TYPES, f32ToBf16, f32ToF16, randomQuantBlocks, type GgmlTypeName } from '@nerva/core';
import { parseModelConfig } from '../config.js';
import { GgufError } from './gguf-error.js';
import { ggufTensorLayout } from './gguf-convert.js';
import { ggufModelMetadata } from './gguf-spec.js';
import { GGUF_CONVERT_FILE_TYPES, GGUF_CONVERT_TYPES, planGgufTypes, type GgufConvertType } from './gguf-type-plan.js';
import { ggufValue } from './gguf-value.js';
import { writeGguf } from './gguf-writer.js';

export interface SyntheticGgufOptions {
  /** A config.json object (Hugging Face form). */
  readonly config: object;
  readonly out: string;
  readonly type: GgufConvertType;
  readonly seed?: number;
  readonly overwrite?: boolean;
  readonly onProgress?: (done: number, total: number, tensor: string) => void;
}

/** Rows a chunk of a tensor's data: bounded memory whatever the tensor's size. */
const CHUNK_ELEMENTS = 4 * 1024 * 1024;

/** Write a random GGUF file of `config`'s shapes at `type`; returns its path and bytes. */
export async function writeSyntheticGguf(opts: SyntheticGgufOptions): Promise<{ out: string; bytes: number; types: Record<string, number> }> {
  const out = resolve(opts.out);
  if (!(GGUF_CONVERT_TYPES as readonly string[]).includes(opts.type)) {
    throw new GgufError('BAD_INPUT', out, `unknown type "${String(opts.type)}"; one of ${GGUF_CONVERT_TYPES.join(', ')}`);
  }
  const spec = parseModelConfig(opts.config, out);
  const model = ggufModelMetadata(spec, { name: 'synthetic', fileType: GGUF_CONVERT_FILE_TYPES[opts.type] }, out);
  const metadata = [...model.metadata, ['tokenizer.ggml.model', ggufValue.str('none')] as const];
  const planned = ggufTensorLayout(spec);
  const types = planGgufTypes(planned, spec, opts.type);
  // xorshift32: cheap, and the same seed gives the same file.
  let state = ((opts.seed ?? 0) ^ 0x9e3779b9) >>> 0 || 1;
  const next = (): number => {
    state ^= state << 13;
    state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5;
    state >>>= 0;
    return state / 4294967296;
  };
  const counts: Record<string, number> = {};
  const tensors = planned.map((p) => {
    const type = types.get(p.name)!;
    counts[type] = (counts[type] ?? 0) + 1;
    const elements = p.dims.reduce((a, b) => a * b, 1);
    const isNorm = p.dims.length === 1;
    return {
      name: p.name,
      type,
      dims: p.dims,
      data: async function* (): AsyncGenerator<Uint8Array> {
        const block = GGML_TYPES[type].blockSize;
        const step = Math.max(block, Math.floor(CHUNK_ELEMENTS / block) * block);
        for (let at = 0; at < elements; at += step) yield chunk(type, Math.min(step, elements - at), isNorm, next);
      },
    };
  });
  const written = await writeGguf(out, { metadata, tensors, overwrite: opts.overwrite ?? false, ...(opts.onProgress && { onProgress: opts.onProgress }) });
  return { out, bytes: written.bytes, types: counts };
}

/** `n` random values of `type`: norms near 1, matrices at 0.02 (the scale of synthetic safetensors). */
function chunk(type: GgmlTypeName, n: number, isNorm: boolean, next: () => number): Uint8Array {
  if (GGML_TYPES[type].blockSize > 1) return randomQuantBlocks(type, n, 0.02, next);
  const v = (): number => (isNorm ? 1 : 0) + 0.02 * (2 * next() - 1) * 1.7;
  if (type === 'F32') {
    const f = new Float32Array(n);
    for (let i = 0; i < n; i++) f[i] = v();
    return new Uint8Array(f.buffer);
  }
  const h = new Uint16Array(n);
  const conv = type === 'BF16' ? f32ToBf16 : f32ToF16;
  for (let i = 0; i < n; i++) h[i] = conv(v());
  return new Uint8Array(h.buffer);
}
