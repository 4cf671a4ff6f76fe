/**
 * GGUF metadata ↔ {@link ModelSpec} for the architectures NERVA runs (llama, qwen2, qwen3,
 * qwen3moe), with llama.cpp's keys (`{arch}.block_count`, `.attention.head_count`, ...). What
 * llama.cpp's keys cannot say is kept under `nerva.*` keys, which llama.cpp ignores: Llama 3 RoPE
 * parameters (llama.cpp carries them only as the `rope_freqs` factors), a list of EOS ids, the
 * published dtype and `generation_config.json`. Files without them (any llama.cpp or Ollama
 * file) are read from llama.cpp's keys alone.
 */
import type { ModelArch, ModelSpec, MoeSpec, RopeScaling } from '../config.js';
import { GGUF_FILE_TYPES } from '@nerva/core';
import { GgufError } from './gguf-error.js';
import type { GgufTensorInfo } from './gguf-header.js';
import { MetaReader } from './gguf-meta.js';
import { GGUF_ARCH_NAMES, modelArchOfGguf } from './gguf-names.js';
import { ggufValue, type GgufMetadata, type GgufValue } from './gguf-value.js';

/** The `nerva.*` keys this module reads and writes. */
export const NERVA_KEYS = {
  llama3Factor: 'nerva.rope.llama3.factor',
  llama3LowFreqFactor: 'nerva.rope.llama3.low_freq_factor',
  llama3HighFreqFactor: 'nerva.rope.llama3.high_freq_factor',
  llama3OriginalContext: 'nerva.rope.llama3.original_context_length',
  eosTokenIds: 'nerva.eos_token_ids',
  torchDtype: 'nerva.torch_dtype',
  generationConfig: 'nerva.generation_config',
} as const;

/** Tensor llama.cpp's Llama 3 converter stores the per-frequency RoPE divisors in. */
export const ROPE_FREQS_TENSOR = 'rope_freqs.weight';

/** The same sanity bounds config.json parsing applies: a hostile file cannot size buffers. */
const BOUNDS = {
  vocab: 1 << 24,
  hidden: 1 << 17,
  intermediate: 1 << 20,
  heads: 1024,
  headDim: 4096,
  layers: 1024,
  experts: 1 << 14,
  positions: 1 << 25,
};

/** What the spec is read from: the header's metadata and tensor infos, and the `rope_freqs` factors when the file has them. */
export interface GgufSpecSource {
  readonly path: string;
  readonly metadata: GgufMetadata;
  readonly tensors: readonly GgufTensorInfo[];
  readonly ropeFreqs?: Float32Array;
}

/**
 * The {@link ModelSpec} a GGUF file describes. Throws {@link GgufError}: UNSUPPORTED_ARCH for an
 * architecture NERVA does not run, BAD_METADATA for a missing or mistyped key, SHAPE_MISMATCH
 * when the token embedding disagrees with the metadata, UNSUPPORTED_MODEL for features NERVA does
 * not run exactly (partial rotary, per-layer head counts that differ, YaRN scaling...).
 */
export function ggufModelSpec(src: GgufSpecSource): ModelSpec {
  const { path } = src;
  const m = new MetaReader(src.metadata, path);
  const archName = m.str('general.architecture');
  if (archName === undefined) throw new GgufError('BAD_METADATA', path, 'required but absent', { key: 'general.architecture' });
  const arch = modelArchOfGguf(archName);
  if (!arch) {
    throw new GgufError('UNSUPPORTED_ARCH', path, `architecture "${archName}" is not supported; supported: ${Object.values(GGUF_ARCH_NAMES).join(', ')}`, {
      key: 'general.architecture',
    });
  }
  const a = archName;
  const byName = new Map(src.tensors.map((t) => [t.name, t]));

  const hiddenSize = m.posInt(`${a}.embedding_length`, undefined, BOUNDS.hidden);
  const numLayers = m.posInt(`${a}.block_count`, undefined, BOUNDS.layers);
  const numHeads = m.uniformInt(`${a}.attention.head_count`, undefined, BOUNDS.heads);
  const numKvHeads = m.uniformInt(`${a}.attention.head_count_kv`, numHeads, BOUNDS.heads);
  if (numHeads % numKvHeads !== 0) {
    throw new GgufError('BAD_METADATA', path, `head_count ${numHeads} is not a multiple of head_count_kv ${numKvHeads}`, { key: `${a}.attention.head_count_kv` });
  }
  const headDim = m.posInt(`${a}.attention.key_length`, hiddenSize % numHeads === 0 ? hiddenSize / numHeads : undefined, BOUNDS.headDim);
  if (headDim % 2 !== 0) throw new GgufError('BAD_METADATA', path, `head dimension ${headDim} must be even for rotary embeddings`, { key: `${a}.attention.key_length` });
  const valueLength = m.posInt(`${a}.attention.value_length`, headDim, BOUNDS.headDim);
  if (valueLength !== headDim) {
    throw new GgufError('UNSUPPORTED_MODEL', path, `value head size ${valueLength} differs from key head size ${headDim}`, { key: `${a}.attention.value_length` });
  }
  const ropeDims = m.posInt(`${a}.rope.dimension_count`, headDim, BOUNDS.headDim);
  if (ropeDims !== headDim) {
    throw new GgufError('UNSUPPORTED_MODEL', path, `partial rotary embedding (${ropeDims} of ${headDim} head dims) is not supported`, { key: `${a}.rope.dimension_count` });
  }

  const embd = byName.get('token_embd.weight');
  if (!embd) throw new GgufError('MISSING_TENSOR', path, 'the token embedding is required', { tensor: 'token_embd.weight' });
  if (embd.dims.length !== 2 || embd.dims[0] !== hiddenSize || embd.dims[1] < 1 || embd.dims[1] > BOUNDS.vocab) {
    throw new GgufError('SHAPE_MISMATCH', path, `ggml dims [${embd.dims.join(', ')}] but the metadata implies [${hiddenSize}, vocab]`, { tensor: 'token_embd.weight' });
  }
  const vocabSize = embd.dims[1];
  const declaredVocab = m.int(`${a}.vocab_size`, vocabSize);
  if (declaredVocab !== vocabSize) {
    throw new GgufError('SHAPE_MISMATCH', path, `vocab_size ${declaredVocab} but token_embd.weight has ${vocabSize} rows`, { key: `${a}.vocab_size` });
  }

  let moe: MoeSpec | undefined;
  if (arch === 'qwen3_moe') {
    const numExperts = m.posInt(`${a}.expert_count`, undefined, BOUNDS.experts);
    const topK = m.posInt(`${a}.expert_used_count`, undefined, BOUNDS.experts);
    if (topK > numExperts) throw new GgufError('BAD_METADATA', path, `expert_used_count ${topK} exceeds expert_count ${numExperts}`, { key: `${a}.expert_used_count` });
    const dense: number[] = [];
    for (let l = 0; l < numLayers; l++) if (!byName.has(`blk.${l}.ffn_gate_inp.weight`)) dense.push(l);
    const firstMoe = Array.from({ length: numLayers }, (_, l) => l).find((l) => !dense.includes(l));
    const stacked = firstMoe !== undefined ? byName.get(`blk.${firstMoe}.ffn_gate_exps.weight`) : undefined;
    moe = {
      numExperts,
      topK,
      moeIntermediateSize: m.posInt(`${a}.expert_feed_forward_length`, stacked?.dims[1], BOUNDS.intermediate),
      // llama.cpp's qwen3moe always renormalizes the top-k weights; the key says so explicitly when present.
      normTopkProb: m.bool(`${a}.expert_weights_norm`) ?? true,
      decoderSparseStep: 1,
      mlpOnlyLayers: dense,
    };
  }
  const intermediateSize = m.uniformInt(`${a}.feed_forward_length`, moe?.moeIntermediateSize, BOUNDS.intermediate);

  const spec: ModelSpec = {
    arch,
    vocabSize,
    hiddenSize,
    intermediateSize,
    numLayers,
    numHeads,
    numKvHeads,
    headDim,
    rmsNormEps: m.posFloat(`${a}.attention.layer_norm_rms_epsilon`),
    ropeTheta: m.posFloat(`${a}.rope.freq_base`, 10000),
    ropeScaling: ropeScalingOf(m, a, headDim, src.ropeFreqs),
    maxPositionEmbeddings: m.posInt(`${a}.context_length`, undefined, BOUNDS.positions),
    tieWordEmbeddings: !byName.has('output.weight'),
    attentionBias: byName.has('blk.0.attn_q.bias'),
    oProjBias: byName.has('blk.0.attn_output.bias'),
    qkNorm: arch === 'qwen3' || arch === 'qwen3_moe',
    eosTokenIds: eosIdsOf(m),
    torchDtype: torchDtypeOf(m),
  };
  if (moe) spec.moe = moe;
  if (m.has('tokenizer.ggml.bos_token_id')) spec.bosTokenId = m.int('tokenizer.ggml.bos_token_id');
  return spec;
}

function eosIdsOf(m: MetaReader): number[] {
  const list = m.ints(NERVA_KEYS.eosTokenIds);
  if (list) return list;
  return m.has('tokenizer.ggml.eos_token_id') ? [m.int('tokenizer.ggml.eos_token_id')] : [];
}

const DTYPE_OF_FILE_TYPE: Readonly<Record<number, string>> = {
  [GGUF_FILE_TYPES.ALL_F32]: 'float32',
  [GGUF_FILE_TYPES.MOSTLY_F16]: 'float16',
  [GGUF_FILE_TYPES.MOSTLY_BF16]: 'bfloat16',
};

function torchDtypeOf(m: MetaReader): string {
  const d = m.str(NERVA_KEYS.torchDtype);
  if (d !== undefined) {
    if (!['float32', 'float16', 'bfloat16'].includes(d)) throw new GgufError('BAD_METADATA', m.path, `"${d}" is not float32, float16 or bfloat16`, { key: NERVA_KEYS.torchDtype });
    return d;
  }
  // Quantized files are served dequantized to float32.
  return DTYPE_OF_FILE_TYPE[m.int('general.file_type', 0)] ?? 'float32';
}

function ropeScalingOf(m: MetaReader, a: string, headDim: number, ropeFreqs: Float32Array | undefined): RopeScaling {
  const type = m.str(`${a}.rope.scaling.type`) ?? (m.has(`${a}.rope.scale_linear`) ? 'linear' : 'none');
  if (type !== 'none' && type !== 'linear') {
    throw new GgufError('UNSUPPORTED_MODEL', m.path, `rope scaling "${type}" is not supported (supported: none, linear, and llama3 through rope_freqs)`, { key: `${a}.rope.scaling.type` });
  }
  if (type === 'linear') {
    if (m.has(NERVA_KEYS.llama3Factor) || ropeFreqs) {
      throw new GgufError('BAD_METADATA', m.path, 'linear scaling and Llama 3 frequency factors both given', { key: `${a}.rope.scaling.type` });
    }
    const key = m.has(`${a}.rope.scaling.factor`) ? `${a}.rope.scaling.factor` : `${a}.rope.scale_linear`;
    return { type: 'linear', factor: m.posFloat(key) };
  }
  if (m.has(NERVA_KEYS.llama3Factor)) {
    const s: RopeScaling = {
      type: 'llama3',
      factor: m.posFloat(NERVA_KEYS.llama3Factor),
      lowFreqFactor: m.posFloat(NERVA_KEYS.llama3LowFreqFactor),
      highFreqFactor: m.posFloat(NERVA_KEYS.llama3HighFreqFactor),
      originalMaxPositionEmbeddings: m.posFloat(NERVA_KEYS.llama3OriginalContext),
    };
    if (s.highFreqFactor <= s.lowFreqFactor) throw new GgufError('BAD_METADATA', m.path, 'must exceed the low-frequency factor', { key: NERVA_KEYS.llama3HighFreqFactor });
    return s;
  }
  if (ropeFreqs) {
    const theta = m.posFloat(`${a}.rope.freq_base`, 10000);
    const original = m.posInt(`${a}.rope.scaling.original_context_length`, LLAMA3_DEFAULT_ORIGINAL_CONTEXT);
    return inferLlama3Scaling(ropeFreqs, theta, headDim, original, m.path);
  }
  return { type: 'default' };
}

/** The original context llama.cpp's converter assumes when a config does not say (Llama 3.1's). */
const LLAMA3_DEFAULT_ORIGINAL_CONTEXT = 8192;

/**
 * llama.cpp's per-frequency RoPE divisors for Llama 3 scaling (what its converter stores as
 * `rope_freqs.weight`), from the same formula as transformers' `_compute_llama3_parameters`.
 */
export function llama3RopeFactors(s: Extract<RopeScaling, { type: 'llama3' }>, theta: number, headDim: number): Float32Array {
  const out = new Float32Array(headDim / 2);
  const lowWavelen = s.originalMaxPositionEmbeddings / s.lowFreqFactor;
  const highWavelen = s.originalMaxPositionEmbeddings / s.highFreqFactor;
  for (let i = 0; i < out.length; i++) {
    const wavelen = (2 * Math.PI) / (1 / Math.pow(theta, (2 * i) / headDim));
    if (wavelen < highWavelen) out[i] = 1;
    else if (wavelen > lowWavelen) out[i] = s.factor;
    else {
      const smooth = (s.originalMaxPositionEmbeddings / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor);
      out[i] = 1 / ((1 - smooth) / s.factor + smooth);
    }
  }
  return out;
}

/**
 * Recover Llama 3 scaling parameters from `rope_freqs` factors (files written by llama.cpp carry
 * nothing else). Only the wavelength bounds `original / lowFreqFactor` and `original /
 * highFreqFactor` matter, so `original` is taken from the metadata (or llama.cpp's default) and
 * the two factors solved from the interpolated frequencies; the result is checked by recomputing
 * every factor. Throws UNSUPPORTED_MODEL when the factors follow no Llama 3 scaling.
 */
export function inferLlama3Scaling(factors: Float32Array, theta: number, headDim: number, original: number, path: string): RopeScaling {
  const fail = (why: string): never => {
    throw new GgufError('UNSUPPORTED_MODEL', path, `rope_freqs does not describe a Llama 3 RoPE scaling: ${why}`, { tensor: ROPE_FREQS_TENSOR });
  };
  if (factors.length !== headDim / 2) fail(`${factors.length} factors for a head dimension of ${headDim}`);
  if (!factors.every((f) => Number.isFinite(f) && f >= 1 - 1e-6)) fail('a factor is below 1 or not finite');
  const factor = Math.max(...factors);
  if (factor <= 1 + 1e-6) return { type: 'default' };
  const wavelen = (i: number): number => (2 * Math.PI) * Math.pow(theta, (2 * i) / headDim);
  const tol = 1e-5;
  const isOne = (f: number): boolean => Math.abs(f - 1) <= tol;
  const isFull = (f: number): boolean => Math.abs(f - factor) <= tol * factor;
  const ones: number[] = [];
  const fulls: number[] = [];
  const mids: number[] = [];
  factors.forEach((f, i) => (isOne(f) ? ones : isFull(f) ? fulls : mids).push(i));
  // Interpolated factors f give s = (1/f - 1/factor) / (1 - 1/factor) = (original/λ - low) / (high - low).
  const s = (f: number): number => (1 / f - 1 / factor) / (1 - 1 / factor);
  const lastOne = ones.length ? wavelen(Math.max(...ones)) : 0;
  const firstFull = fulls.length ? wavelen(Math.min(...fulls)) : Number.POSITIVE_INFINITY;
  let low: number;
  let high: number;
  if (mids.length >= 2) {
    const [i, j] = [mids[0], mids[mids.length - 1]];
    const [si, sj] = [s(factors[i]), s(factors[j])];
    const [yi, yj] = [original / wavelen(i), original / wavelen(j)];
    // y = low + s (high - low): two points give the line.
    const slope = (yi - yj) / (si - sj);
    low = yi - si * slope;
    high = low + slope;
  } else {
    // No interpolated frequency pins the bounds; any bounds between the classes reproduce the factors.
    const hiWave = mids.length === 1 ? (lastOne + wavelen(mids[0])) / 2 : lastOne + (Math.min(firstFull, lastOne * 4) - lastOne) / 3;
    high = original / hiWave;
    if (mids.length === 1) {
      const si = s(factors[mids[0]]);
      low = (original / wavelen(mids[0]) - si * high) / (1 - si);
    } else {
      const loWave = lastOne + (2 * (Math.min(firstFull, lastOne * 4) - lastOne)) / 3;
      low = original / loWave;
    }
  }
  if (!(Number.isFinite(low) && Number.isFinite(high) && low > 0 && high > low)) fail('the interpolated frequencies give no valid bounds');
  const scaling: RopeScaling = { type: 'llama3', factor, lowFreqFactor: low, highFreqFactor: high, originalMaxPositionEmbeddings: original };
  const again = llama3RopeFactors(scaling, theta, headDim);
  for (let i = 0; i < factors.length; i++) {
    if (Math.abs(again[i] - factors[i]) > 1e-5 * factors[i]) fail(`factor ${i} is ${factors[i]}, Llama 3 scaling would give ${again[i]}`);
  }
  return scaling;
}

/** What {@link ggufModelMetadata} needs besides the spec. */
export interface GgufModelMetadataOptions {
  /** `general.name`. */
  readonly name: string;
  /** `general.file_type` (llama.cpp's LLAMA_FTYPE). */
  readonly fileType: number;
  /** `generation_config.json`, kept as `nerva.generation_config`. */
  readonly generationConfig?: Record<string, unknown>;
}

/** Metadata and the extra tensor a spec becomes in a GGUF file. */
export interface GgufModelMetadata {
  readonly metadata: [string, GgufValue][];
  /** `rope_freqs.weight` (F32, headDim / 2) for Llama 3 scaling, as llama.cpp reads it. */
  readonly ropeFreqs?: Float32Array;
}

/**
 * The GGUF metadata of `spec`, with the value types llama.cpp's loader checks (UINT32 sizes,
 * FLOAT32 epsilon and base...). Throws UNSUPPORTED_MODEL for what no GGUF llama.cpp reads can
 * say: sliding windows, and dense layers inside a qwen3moe model.
 */
export function ggufModelMetadata(spec: ModelSpec, opts: GgufModelMetadataOptions, path = '<gguf>'): GgufModelMetadata {
  const a = GGUF_ARCH_NAMES[spec.arch];
  if (spec.layerWindows?.some((w) => w > 0)) {
    throw new GgufError('UNSUPPORTED_MODEL', path, 'sliding-window attention has no GGUF form llama.cpp reads for this architecture');
  }
  if (spec.moe && (spec.moe.decoderSparseStep !== 1 || spec.moe.mlpOnlyLayers.length > 0)) {
    throw new GgufError('UNSUPPORTED_MODEL', path, 'dense layers inside a qwen3moe model (decoder_sparse_step / mlp_only_layers) have no llama.cpp layout');
  }
  const v = ggufValue;
  const md: [string, GgufValue][] = [
    ['general.architecture', v.str(a)],
    ['general.name', v.str(opts.name)],
    ['general.file_type', v.u32(opts.fileType)],
    ['general.quantization_version', v.u32(2)],
    [`${a}.vocab_size`, v.u32(spec.vocabSize)],
    [`${a}.context_length`, v.u32(spec.maxPositionEmbeddings)],
    [`${a}.embedding_length`, v.u32(spec.hiddenSize)],
    [`${a}.block_count`, v.u32(spec.numLayers)],
    [`${a}.feed_forward_length`, v.u32(spec.intermediateSize)],
    [`${a}.attention.head_count`, v.u32(spec.numHeads)],
    [`${a}.attention.head_count_kv`, v.u32(spec.numKvHeads)],
    [`${a}.attention.key_length`, v.u32(spec.headDim)],
    [`${a}.attention.value_length`, v.u32(spec.headDim)],
    [`${a}.attention.layer_norm_rms_epsilon`, v.f32(spec.rmsNormEps)],
    [`${a}.rope.dimension_count`, v.u32(spec.headDim)],
    [`${a}.rope.freq_base`, v.f32(spec.ropeTheta)],
  ];
  if (spec.moe) {
    md.push(
      [`${a}.expert_count`, v.u32(spec.moe.numExperts)],
      [`${a}.expert_used_count`, v.u32(spec.moe.topK)],
      [`${a}.expert_feed_forward_length`, v.u32(spec.moe.moeIntermediateSize)],
      [`${a}.expert_weights_norm`, v.bool(spec.moe.normTopkProb)],
    );
  }
  let ropeFreqs: Float32Array | undefined;
  const rs = spec.ropeScaling;
  if (rs.type === 'linear') {
    md.push([`${a}.rope.scaling.type`, v.str('linear')], [`${a}.rope.scaling.factor`, v.f32(rs.factor)]);
  } else if (rs.type === 'llama3') {
    // llama.cpp reads only the factors tensor (no scaling keys: it would apply them on top).
    ropeFreqs = llama3RopeFactors(rs, spec.ropeTheta, spec.headDim);
    md.push(
      [NERVA_KEYS.llama3Factor, v.f64(rs.factor)],
      [NERVA_KEYS.llama3LowFreqFactor, v.f64(rs.lowFreqFactor)],
      [NERVA_KEYS.llama3HighFreqFactor, v.f64(rs.highFreqFactor)],
      [NERVA_KEYS.llama3OriginalContext, v.f64(rs.originalMaxPositionEmbeddings)],
    );
  }
  if (spec.eosTokenIds.length > 1) md.push([NERVA_KEYS.eosTokenIds, v.array('INT32', spec.eosTokenIds)]);
  md.push([NERVA_KEYS.torchDtype, v.str(spec.torchDtype)]);
  if (opts.generationConfig) md.push([NERVA_KEYS.generationConfig, v.str(JSON.stringify(opts.generationConfig))]);
  return ropeFreqs ? { metadata: md, ropeFreqs } : { metadata: md };
}

/** `generation_config.json` kept in the file, or undefined. Throws BAD_METADATA when it is not a JSON object. */
export function ggufGenerationConfig(metadata: GgufMetadata, path: string): Record<string, unknown> | undefined {
  const text = new MetaReader(metadata, path).str(NERVA_KEYS.generationConfig);
  if (text === undefined) return undefined;
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new GgufError('BAD_METADATA', path, `not valid JSON: ${(e as Error).message}`, { key: NERVA_KEYS.generationConfig });
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) throw new GgufError('BAD_METADATA', path, 'not a JSON object', { key: NERVA_KEYS.generationConfig });
  return json as Record<string, unknown>;
}

/** The architecture of a GGUF's metadata, or undefined. */
export function ggufArchOf(metadata: GgufMetadata): ModelArch | undefined {
  const v = metadata.get('general.architecture');
  return v?.type === 'STRING' ? modelArchOfGguf(v.value as string) : undefined;
}
