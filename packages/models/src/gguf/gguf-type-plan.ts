/**
 * Which ggml type each tensor gets when converting to a GGUF file type, by llama.cpp's rules:
 * its HF converter's (norms, 1-D tensors, biases and the MoE router stay F32) and, for the
 * quantized file types, its quantizer's (`llama_tensor_get_type`): the output matrix (and a tied
 * embedding) at Q6_K, each k-quant mix's extra bits on attn_v, attn_output and ffn_down (by
 * layer: the `use_more_bits` layers for Q4_K_M / Q5_K_M, the first layers for Q3_K_M / Q4_K_S),
 * 8-expert models' attn_v / attn_k at Q8_0 and attn_output at Q5_K, and the fallbacks for rows
 * that are not a whole number of blocks.
 */
import type { ModelSpec } from '../config.js';
import { GGML_TYPES, GGUF_FILE_TYPES, type GgmlTypeName } from '@nerva/core';

/**
 * The file types `nerva convert` writes: llama.cpp's `llama-quantize` names (without an
 * importance matrix; of the i-quants, the two that need none), plus `Q4_K`, every quantizable
 * tensor at Q4_K.
 */
export const GGUF_CONVERT_TYPES = [
  'F32',
  'F16',
  'BF16',
  'Q8_0',
  'Q4_0',
  'Q4_1',
  'Q5_0',
  'Q5_1',
  'Q2_K',
  'Q3_K_S',
  'Q3_K_M',
  'Q3_K_L',
  'Q4_K',
  'Q4_K_S',
  'Q4_K_M',
  'Q5_K_S',
  'Q5_K_M',
  'Q6_K',
  'IQ4_NL',
  'IQ4_XS',
] as const;
export type GgufConvertType = (typeof GGUF_CONVERT_TYPES)[number];

/**
 * `general.file_type` of each. `Q4_K` is every quantizable tensor at Q4_K with no mix (what
 * llama.cpp's `--pure` Q4_K_S writes, and numbers as Q4_K_S).
 */
export const GGUF_CONVERT_FILE_TYPES: Readonly<Record<GgufConvertType, number>> = {
  F32: GGUF_FILE_TYPES.ALL_F32,
  F16: GGUF_FILE_TYPES.MOSTLY_F16,
  BF16: GGUF_FILE_TYPES.MOSTLY_BF16,
  Q8_0: GGUF_FILE_TYPES.MOSTLY_Q8_0,
  Q4_0: GGUF_FILE_TYPES.MOSTLY_Q4_0,
  Q4_1: GGUF_FILE_TYPES.MOSTLY_Q4_1,
  Q5_0: GGUF_FILE_TYPES.MOSTLY_Q5_0,
  Q5_1: GGUF_FILE_TYPES.MOSTLY_Q5_1,
  Q2_K: GGUF_FILE_TYPES.MOSTLY_Q2_K,
  Q3_K_S: GGUF_FILE_TYPES.MOSTLY_Q3_K_S,
  Q3_K_M: GGUF_FILE_TYPES.MOSTLY_Q3_K_M,
  Q3_K_L: GGUF_FILE_TYPES.MOSTLY_Q3_K_L,
  Q4_K: GGUF_FILE_TYPES.MOSTLY_Q4_K_S,
  Q4_K_S: GGUF_FILE_TYPES.MOSTLY_Q4_K_S,
  Q4_K_M: GGUF_FILE_TYPES.MOSTLY_Q4_K_M,
  Q5_K_S: GGUF_FILE_TYPES.MOSTLY_Q5_K_S,
  Q5_K_M: GGUF_FILE_TYPES.MOSTLY_Q5_K_M,
  Q6_K: GGUF_FILE_TYPES.MOSTLY_Q6_K,
  IQ4_NL: GGUF_FILE_TYPES.MOSTLY_IQ4_NL,
  IQ4_XS: GGUF_FILE_TYPES.MOSTLY_IQ4_XS,
};

type QuantizedConvertType = Exclude<GgufConvertType, 'F32' | 'F16' | 'BF16'>;

/** Each quantized file type's base tensor type (llama.cpp's `llama_ftype_get_default_type`). */
const DEFAULT_TYPE: Readonly<Record<QuantizedConvertType, GgmlTypeName>> = {
  Q8_0: 'Q8_0',
  Q4_0: 'Q4_0',
  Q4_1: 'Q4_1',
  Q5_0: 'Q5_0',
  Q5_1: 'Q5_1',
  Q2_K: 'Q2_K',
  Q3_K_S: 'Q3_K',
  Q3_K_M: 'Q3_K',
  Q3_K_L: 'Q3_K',
  Q4_K: 'Q4_K',
  Q4_K_S: 'Q4_K',
  Q4_K_M: 'Q4_K',
  Q5_K_S: 'Q5_K',
  Q5_K_M: 'Q5_K',
  Q6_K: 'Q6_K',
  IQ4_NL: 'IQ4_NL',
  IQ4_XS: 'IQ4_XS',
};

/** A tensor to type: its GGUF name and ggml dims. */
export interface TypedTensorShape {
  readonly name: string;
  readonly dims: readonly number[];
}

/** The model facts the rules read. */
export type TypePlanModel = Pick<ModelSpec, 'arch' | 'numLayers' | 'numHeads' | 'numKvHeads'> & { readonly moe?: { readonly numExperts: number } };

/** Tensors llama.cpp's HF converter always writes as F32. */
function keptF32(t: TypedTensorShape): boolean {
  return t.dims.length <= 1 || t.name.endsWith('_norm.weight') || t.name.includes('ffn_gate_inp.weight') || !t.name.endsWith('.weight');
}

/** llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third between. */
export function useMoreBits(layer: number, layers: number): boolean {
  const e = Math.floor(layers / 8);
  return layer < e || layer >= Math.floor((7 * layers) / 8) || (layer - e) % 3 === 2;
}

type Category = 'output' | 'token_embd' | 'attn_v' | 'attn_k' | 'attn_output' | 'ffn_down' | 'other';

function category(name: string): Category {
  if (name === 'output.weight') return 'output';
  if (name === 'token_embd.weight') return 'token_embd';
  if (name.includes('attn_v.weight')) return 'attn_v';
  if (name.includes('attn_k.weight')) return 'attn_k';
  if (name.includes('attn_output.weight')) return 'attn_output';
  if (name.includes('ffn_down')) return 'ffn_down';
  return 'other';
}

function layerOf(name: string): number {
  const m = /^blk\.(\d+)\./.exec(name);
  return m ? Number(m[1]) : -1;
}

/** llama.cpp sizes 80-layer Llama-2/3 and Qwen2 models as "70B" and gives their attn_v a bit more. */
function is70B(m: TypePlanModel): boolean {
  return m.numLayers === 80 && ((m.arch === 'llama' && m.numHeads !== m.numKvHeads) || m.arch === 'qwen2');
}

/**
 * The type of every tensor of `tensors` (all the tensors of the file: a missing `output.weight`
 * means a tied embedding) when converting to `type`. Rows that are not a whole number of blocks
 * fall back as llama.cpp's quantizer does (Q2_K / Q3_K → Q4_0, Q4_K → Q5_0, Q5_K → Q5_1,
 * Q6_K → Q8_0, IQ4_XS → IQ4_NL, and F16 when even that does not divide them); where llama.cpp has
 * no fallback (Q4_0, Q8_0, IQ4_NL and the other 32-blocks) its HF converter's applies: F16.
 */
export function planGgufTypes(tensors: readonly TypedTensorShape[], model: TypePlanModel, type: GgufConvertType): Map<string, GgmlTypeName> {
  const tied = !tensors.some((t) => t.name === 'output.weight');
  const out = new Map<string, GgmlTypeName>();
  for (const t of tensors) {
    if (keptF32(t)) out.set(t.name, 'F32');
    else if (type === 'F32' || type === 'F16' || type === 'BF16') out.set(t.name, type);
    else out.set(t.name, fallback(type === 'Q4_K' ? 'Q4_K' : mixType(t, model, type, tied), t.dims[0]));
  }
  return out;
}

/**
 * One tensor's type under a file type's mix: llama.cpp's `llama_tensor_get_type` for the file
 * types and tensor categories of the architectures read here (no fused qkv, no Falcon). Its
 * attn_v and ffn_down counters run in layer order, so they are the layer index here.
 */
function mixType(t: TypedTensorShape, model: TypePlanModel, type: QuantizedConvertType, tied: boolean): GgmlTypeName {
  const base = DEFAULT_TYPE[type];
  const cat = category(t.name);
  const layer = layerOf(t.name);
  const layers = model.numLayers;
  const nExpert = model.moe?.numExperts ?? 0;
  const moreBits = (type === 'Q4_K_M' || type === 'Q5_K_M') && useMoreBits(layer, layers);
  const iq4 = type === 'IQ4_NL' || type === 'IQ4_XS';
  if (cat === 'output' || (tied && cat === 'token_embd')) {
    if (t.dims[0] % GGML_TYPES[base].blockSize !== 0) return 'Q8_0';
    return base === 'Q8_0' ? 'Q8_0' : 'Q6_K';
  }
  if (cat === 'attn_v') {
    let q = base;
    if (type === 'Q2_K') q = model.numHeads / model.numKvHeads >= 4 ? 'Q4_K' : 'Q3_K';
    else if (type === 'Q3_K_M') q = layer < 2 ? 'Q5_K' : 'Q4_K';
    else if (type === 'Q3_K_L') q = 'Q5_K';
    else if (iq4 && model.numHeads / model.numKvHeads >= 4) q = 'Q5_K';
    else if (moreBits) q = 'Q6_K';
    else if (type === 'Q4_K_S' && layer < 4) q = 'Q5_K';
    if (is70B(model) && (q === 'Q3_K' || q === 'Q4_K')) q = 'Q5_K';
    return nExpert === 8 ? 'Q8_0' : q;
  }
  if (cat === 'attn_k') return nExpert === 8 ? 'Q8_0' : base;
  if (cat === 'ffn_down') {
    if (type === 'Q2_K') return 'Q3_K';
    if (type === 'Q3_K_M') return layer < Math.floor(layers / 16) ? 'Q5_K' : 'Q4_K';
    if (type === 'Q3_K_L') return 'Q5_K';
    if (iq4 && layer < Math.floor(layers / 8)) return 'Q5_K';
    if (moreBits) return 'Q6_K';
    if (type === 'Q4_K_S' && layer < Math.floor(layers / 8)) return 'Q5_K';
    return base;
  }
  if (cat === 'attn_output') {
    if (nExpert === 8) return ['Q2_K', 'Q3_K_S', 'Q3_K_M', 'Q4_K_S', 'Q4_K_M', 'IQ4_NL', 'IQ4_XS'].includes(type) ? 'Q5_K' : base;
    if (type === 'Q2_K') return 'Q3_K';
    if (type === 'Q3_K_M') return 'Q4_K';
    if (type === 'Q3_K_L') return 'Q5_K';
  }
  return base;
}

const FALLBACK: Partial<Record<GgmlTypeName, GgmlTypeName>> = { Q2_K: 'Q4_0', Q3_K: 'Q4_0', Q4_K: 'Q5_0', Q5_K: 'Q5_1', Q6_K: 'Q8_0', IQ4_XS: 'IQ4_NL' };

function fallback(q: GgmlTypeName, rowLength: number): GgmlTypeName {
  if (rowLength % GGML_TYPES[q].blockSize === 0) return q;
  const next = FALLBACK[q] ?? 'F16';
  return rowLength % GGML_TYPES[next].blockSize === 0 ? next : 'F16';
}
