import { join } from 'node:path';
import { ConfigError } from './errors.js';
import { ModelFileError, readModelText } from './model-file.js';

/** Architectures NERVA runs (HF `model_type`). */
export type ModelArch = 'llama' | 'qwen2' | 'qwen3' | 'qwen3_moe';

export const SUPPORTED_MODEL_TYPES: readonly ModelArch[] = ['llama', 'qwen2', 'qwen3', 'qwen3_moe'];

/** How rotary frequencies are rescaled for long context. */
export type RopeScaling =
  | { type: 'default' }
  | { type: 'llama3'; factor: number; lowFreqFactor: number; highFreqFactor: number; originalMaxPositionEmbeddings: number }
  | { type: 'linear'; factor: number };

/** Mixture-of-experts parameters (Qwen3-MoE layout: routed experts, no shared expert). */
export interface MoeSpec {
  numExperts: number;
  /** Experts chosen per token. */
  topK: number;
  /** Intermediate size of each expert's MLP. */
  moeIntermediateSize: number;
  /** Renormalize the top-k routing weights to sum to 1. */
  normTopkProb: boolean;
  /** Every `decoderSparseStep`-th layer (1-based) is sparse. */
  decoderSparseStep: number;
  /** Layers forced to a dense MLP. */
  mlpOnlyLayers: number[];
}

/** A normalized, architecture-independent description of a decoder-only model. */
export interface ModelSpec {
  arch: ModelArch;
  vocabSize: number;
  hiddenSize: number;
  /** Dense MLP intermediate size (dense layers of an MoE model use it too). */
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  /** config `head_dim` when given, else hiddenSize / numHeads. May differ from hiddenSize / numHeads. */
  headDim: number;
  rmsNormEps: number;
  ropeTheta: number;
  ropeScaling: RopeScaling;
  maxPositionEmbeddings: number;
  /** LM head shares the embedding matrix (no `lm_head.weight` in the checkpoint). */
  tieWordEmbeddings: boolean;
  /** q/k/v projections carry a bias. */
  attentionBias: boolean;
  /** o projection carries a bias (llama/qwen3 with attention_bias; never qwen2). */
  oProjBias: boolean;
  /** Per-head RMSNorm on q and k before RoPE (Qwen3). */
  qkNorm: boolean;
  moe?: MoeSpec;
  bosTokenId?: number;
  eosTokenIds: number[];
  /** Dtype the checkpoint was published in (`torch_dtype`/`dtype`), e.g. 'bfloat16'. */
  torchDtype: string;
  /**
   * Sliding-window attention, per decoder layer: `layerWindows[l] > 0` means a query at position p
   * of layer l attends to positions max(0, p - layerWindows[l] + 1)..p only (transformers' sliding
   * mask: key k is seen when p - k < window); 0 means full causal attention. Absent when every
   * layer is full attention (read it through {@link layerWindow}). Derived from the config exactly
   * as transformers 5.x derives its layer types; see {@link parseModelConfig}.
   */
  layerWindows?: number[];
}

/** Dtype names that HF configs use, normalized. */
const DTYPE_ALIASES: Record<string, string> = {
  bfloat16: 'bfloat16',
  bf16: 'bfloat16',
  float16: 'float16',
  fp16: 'float16',
  half: 'float16',
  float32: 'float32',
  fp32: 'float32',
  float: 'float32',
};

/** Defaults of the HF config classes for fields a config.json may omit. */
const DEFAULT_MAX_POSITIONS: Record<ModelArch, number> = { llama: 2048, qwen2: 32768, qwen3: 32768, qwen3_moe: 32768 };

/**
 * Normalize a Hugging Face `config.json` into a {@link ModelSpec}. `source` names the file in
 * error messages. Throws {@link ConfigError} for an unsupported `model_type`, a missing or invalid
 * field, an unsupported RoPE scaling, or a feature NERVA does not run exactly (MLP bias,
 * activations other than SiLU, a sliding window on an architecture that has none).
 *
 * Sliding windows ({@link ModelSpec.layerWindows}) follow transformers 5.x:
 * - qwen2 / qwen3 (`Qwen2Config` / `Qwen3Config.__post_init__`): the window in effect is
 *   `sliding_window` (default 4096 when the key is absent) if `use_sliding_window`, else none.
 *   `layer_types` ("full_attention" | "sliding_attention", one per layer), when present, says which
 *   layers slide; when absent, layer i slides iff a window is in effect and
 *   i >= `max_window_layers` (default 28). A sliding layer without a window in effect is an error
 *   in transformers' mask construction, and here.
 * - qwen3_moe (`Qwen3MoeModel`, one mask for all layers): every layer slides iff
 *   `use_sliding_window` and `sliding_window` is set; `max_window_layers` and `layer_types` are not
 *   read by transformers (a `layer_types` that disagrees is refused as ambiguous).
 * - llama: `LlamaForCausalLM` has no sliding window (`sliding_window` is ignored, as transformers
 *   does); `use_sliding_window: true` or sliding `layer_types` are refused (likely a Mistral-style
 *   checkpoint, which NERVA does not run).
 */
export function parseModelConfig(json: unknown, source = 'config.json'): ModelSpec {
  if (typeof json !== 'object' || json === null || Array.isArray(json)) {
    throw new ConfigError('NOT_JSON', source, 'model config is not a JSON object');
  }
  const c = json as Record<string, unknown>;
  const r = new FieldReader(c, source);

  const modelType = c.model_type;
  if (typeof modelType !== 'string') {
    throw new ConfigError('MISSING_FIELD', source, `"model_type" is missing; supported: ${SUPPORTED_MODEL_TYPES.join(', ')}`, 'model_type');
  }
  if (!(SUPPORTED_MODEL_TYPES as readonly string[]).includes(modelType)) {
    throw new ConfigError(
      'UNSUPPORTED_MODEL_TYPE',
      source,
      `model_type "${modelType}" is not supported; supported: ${SUPPORTED_MODEL_TYPES.join(', ')}`,
      'model_type',
    );
  }
  const arch = modelType as ModelArch;

  const hiddenSize = r.posInt('hidden_size');
  const numHeads = r.posInt('num_attention_heads');
  const numKvHeads = r.posInt('num_key_value_heads', numHeads);
  if (numHeads % numKvHeads !== 0) {
    throw new ConfigError('INVALID_FIELD', source, `num_attention_heads ${numHeads} is not a multiple of num_key_value_heads ${numKvHeads}`, 'num_key_value_heads');
  }
  let headDim: number;
  if (c.head_dim !== undefined && c.head_dim !== null) headDim = r.posInt('head_dim');
  else if (hiddenSize % numHeads === 0) headDim = hiddenSize / numHeads;
  else throw new ConfigError('INVALID_FIELD', source, `no head_dim and hidden_size ${hiddenSize} is not divisible by num_attention_heads ${numHeads}`, 'head_dim');
  if (headDim % 2 !== 0) throw new ConfigError('INVALID_FIELD', source, `head_dim ${headDim} must be even for rotary embeddings`, 'head_dim');

  const act = c.hidden_act ?? c.hidden_activation ?? 'silu';
  if (act !== 'silu') throw new ConfigError('UNSUPPORTED_FEATURE', source, `hidden_act "${String(act)}" is not supported (only silu)`, 'hidden_act');
  if (c.mlp_bias === true) throw new ConfigError('UNSUPPORTED_FEATURE', source, 'mlp_bias=true is not supported', 'mlp_bias');

  const attentionBias = arch === 'qwen2' ? r.bool('attention_bias', true) : r.bool('attention_bias', false);
  const numLayers = r.posInt('num_hidden_layers');
  const layerWindows = parseLayerWindows(c, arch, numLayers, source);

  let moe: MoeSpec | undefined;
  if (arch === 'qwen3_moe') {
    const numExperts = r.posInt('num_experts');
    const topK = r.posInt('num_experts_per_tok');
    if (topK > numExperts) throw new ConfigError('INVALID_FIELD', source, `num_experts_per_tok ${topK} exceeds num_experts ${numExperts}`, 'num_experts_per_tok');
    const mlpOnly = c.mlp_only_layers ?? [];
    if (!Array.isArray(mlpOnly) || !mlpOnly.every((x) => Number.isInteger(x) && x >= 0 && x < numLayers)) {
      throw new ConfigError('INVALID_FIELD', source, 'mlp_only_layers must be a list of layer indices', 'mlp_only_layers');
    }
    moe = {
      numExperts,
      topK,
      moeIntermediateSize: r.posInt('moe_intermediate_size'),
      normTopkProb: r.bool('norm_topk_prob', false),
      decoderSparseStep: r.posInt('decoder_sparse_step', 1),
      mlpOnlyLayers: [...(mlpOnly as number[])],
    };
  }

  const { ropeTheta, ropeScaling } = parseRope(c, source);

  const eos = c.eos_token_id;
  let eosTokenIds: number[];
  if (eos === undefined || eos === null) eosTokenIds = [];
  else if (Array.isArray(eos) && eos.every((x) => Number.isInteger(x) && x >= 0)) eosTokenIds = [...(eos as number[])];
  else if (Number.isInteger(eos) && (eos as number) >= 0) eosTokenIds = [eos as number];
  else throw new ConfigError('INVALID_FIELD', source, 'eos_token_id must be a token id or a list of them', 'eos_token_id');

  const rawDtype = c.torch_dtype ?? c.dtype ?? 'float32';
  if (typeof rawDtype !== 'string' || !(rawDtype in DTYPE_ALIASES)) {
    throw new ConfigError('INVALID_FIELD', source, `torch_dtype ${JSON.stringify(rawDtype)} is not one of bfloat16, float16, float32`, 'torch_dtype');
  }

  const spec: ModelSpec = {
    arch,
    vocabSize: r.posInt('vocab_size'),
    hiddenSize,
    intermediateSize: r.posInt('intermediate_size'),
    numLayers,
    numHeads,
    numKvHeads,
    headDim,
    rmsNormEps: r.posNum('rms_norm_eps', 1e-6),
    ropeTheta,
    ropeScaling,
    maxPositionEmbeddings: r.posInt('max_position_embeddings', DEFAULT_MAX_POSITIONS[arch]),
    tieWordEmbeddings: r.bool('tie_word_embeddings', false),
    attentionBias,
    // HF Qwen2 hard-codes bias on q/k/v only; Llama and Qwen3 put attention_bias on o_proj too.
    oProjBias: arch === 'qwen2' ? false : attentionBias,
    qkNorm: arch === 'qwen3' || arch === 'qwen3_moe',
    eosTokenIds,
    torchDtype: DTYPE_ALIASES[rawDtype],
  };
  if (moe) spec.moe = moe;
  if (layerWindows) spec.layerWindows = layerWindows;
  if (c.bos_token_id !== undefined && c.bos_token_id !== null) spec.bosTokenId = r.nonNegInt('bos_token_id');
  return spec;
}

/** The sliding window of decoder layer `layer` (see {@link ModelSpec.layerWindows}); 0 = full attention. */
export function layerWindow(spec: ModelSpec, layer: number): number {
  return spec.layerWindows?.[layer] ?? 0;
}

/**
 * When every layer slides, the largest window W: the KV of positions before p - W + 1 is never
 * read again once a sequence computes position p, so its pages can be freed. 0 when any layer is
 * full attention (it reads every position, so nothing can be freed).
 */
export function kvReadWindow(spec: ModelSpec): number {
  const w = spec.layerWindows;
  if (w === undefined || w.length !== spec.numLayers || w.some((x) => !(x > 0))) return 0;
  return Math.max(...w);
}

/** True when `layer` uses the routed-expert MLP (mirrors HF Qwen3MoeDecoderLayer). */
export function isMoeLayer(spec: ModelSpec, layer: number): boolean {
  const m = spec.moe;
  if (!m) return false;
  return !m.mlpOnlyLayers.includes(layer) && m.numExperts > 0 && (layer + 1) % m.decoderSparseStep === 0;
}

/** Read and parse `<dir>/config.json`. */
export async function loadModelConfig(dir: string): Promise<ModelSpec> {
  const path = join(dir, 'config.json');
  let text: string;
  try {
    text = await readModelText(dir, 'config.json');
  } catch (e) {
    if (e instanceof ModelFileError && e.code !== 'NOT_FOUND' && e.code !== 'IO') throw e;
    throw new ConfigError('NOT_FOUND', path, `cannot read model config: ${(e as Error).message}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new ConfigError('NOT_JSON', path, `not valid JSON: ${(e as Error).message}`);
  }
  return parseModelConfig(json, path);
}

/**
 * Sanity bounds on a config's dimensions, far above any released model (Qwen3's vocab is
 * 151,936, Llama 4's context 10M): a hostile config.json cannot make the engine size buffers,
 * or loops, from absurd numbers.
 */
const DIMENSION_BOUNDS: Record<string, number> = {
  vocab_size: 1 << 24,
  hidden_size: 1 << 17,
  intermediate_size: 1 << 20,
  moe_intermediate_size: 1 << 20,
  num_attention_heads: 1024,
  num_key_value_heads: 1024,
  head_dim: 4096,
  num_hidden_layers: 1024,
  num_experts: 1 << 14,
  num_experts_per_tok: 1024,
  decoder_sparse_step: 1024,
  max_position_embeddings: 1 << 25,
};

const LAYER_TYPES = ['full_attention', 'sliding_attention'] as const;

/** Per-layer sliding windows (see parseModelConfig); undefined when every layer is full attention. */
function parseLayerWindows(c: Record<string, unknown>, arch: ModelArch, numLayers: number, source: string): number[] | undefined {
  const use = c.use_sliding_window;
  if (use !== undefined && use !== null && typeof use !== 'boolean') {
    throw new ConfigError('INVALID_FIELD', source, `"use_sliding_window" must be a boolean, got ${JSON.stringify(use)}`, 'use_sliding_window');
  }
  const lt = c.layer_types;
  let types: (typeof LAYER_TYPES)[number][] | undefined;
  if (lt !== undefined && lt !== null) {
    if (!Array.isArray(lt)) throw new ConfigError('INVALID_FIELD', source, `"layer_types" must be a list of ${LAYER_TYPES.join(' / ')}, got ${JSON.stringify(lt)}`, 'layer_types');
    if (lt.length !== numLayers) {
      throw new ConfigError('INVALID_FIELD', source, `"layer_types" has ${lt.length} entries but num_hidden_layers is ${numLayers}`, 'layer_types');
    }
    lt.forEach((t, i) => {
      if (!(LAYER_TYPES as readonly unknown[]).includes(t)) {
        throw new ConfigError('INVALID_FIELD', source, `layer_types[${i}] is ${JSON.stringify(t)}; ${arch} layers are "full_attention" or "sliding_attention"`, 'layer_types');
      }
    });
    types = lt as (typeof LAYER_TYPES)[number][];
  }
  const anySlidingType = types?.some((t) => t === 'sliding_attention') ?? false;

  if (arch === 'llama') {
    if (use === true) {
      throw new ConfigError('UNSUPPORTED_FEATURE', source, 'use_sliding_window=true: LlamaForCausalLM has no sliding window (a Mistral-style checkpoint is not supported)', 'use_sliding_window');
    }
    if (anySlidingType) {
      throw new ConfigError('UNSUPPORTED_FEATURE', source, 'layer_types has sliding_attention layers: LlamaForCausalLM has no sliding window (a Mistral-style checkpoint is not supported)', 'layer_types');
    }
    return undefined; // transformers' Llama ignores `sliding_window`
  }

  // transformers: sliding_window = sliding_window if use_sliding_window else None; the dataclass
  // default (4096) applies only when the key is absent.
  let window = 0;
  if (use === true) {
    const raw = 'sliding_window' in c ? c.sliding_window : 4096;
    if (raw !== null && raw !== undefined) {
      if (typeof raw !== 'number' || !Number.isSafeInteger(raw) || raw <= 0) {
        throw new ConfigError('INVALID_FIELD', source, `"sliding_window" must be a positive integer (tokens a query sees, itself included), got ${JSON.stringify(raw)}`, 'sliding_window');
      }
      window = raw;
    }
  }

  let windows: number[];
  if (arch === 'qwen3_moe') {
    // One mask for every layer (Qwen3MoeModel); layer_types and max_window_layers are not read.
    windows = new Array<number>(numLayers).fill(window);
    if (types && types.some((t) => (t === 'sliding_attention') !== window > 0)) {
      throw new ConfigError(
        'UNSUPPORTED_FEATURE',
        source,
        `layer_types disagrees with use_sliding_window/sliding_window; transformers' Qwen3-MoE ignores layer_types and ${window > 0 ? 'slides every layer' : 'slides no layer'}`,
        'layer_types',
      );
    }
  } else if (types) {
    if (anySlidingType && window === 0) {
      throw new ConfigError(
        'INVALID_FIELD',
        source,
        `layer_types has sliding_attention layers but no window is in effect (use_sliding_window is ${String(use ?? false)}, sliding_window ${JSON.stringify(c.sliding_window ?? null)}); transformers cannot build their mask`,
        'layer_types',
      );
    }
    windows = types.map((t) => (t === 'sliding_attention' ? window : 0));
  } else {
    let maxWindowLayers = 28;
    if (window > 0 && c.max_window_layers !== undefined && c.max_window_layers !== null) {
      const m = c.max_window_layers;
      if (typeof m !== 'number' || !Number.isSafeInteger(m) || m < 0) {
        throw new ConfigError('INVALID_FIELD', source, `"max_window_layers" must be a non-negative integer, got ${JSON.stringify(m)}`, 'max_window_layers');
      }
      maxWindowLayers = m;
    }
    windows = Array.from({ length: numLayers }, (_, i) => (window > 0 && i >= maxWindowLayers ? window : 0));
  }
  return windows.some((w) => w > 0) ? windows : undefined;
}

function parseRope(c: Record<string, unknown>, source: string): { ropeTheta: number; ropeScaling: RopeScaling } {
  // transformers v5 moved theta and scaling into `rope_parameters`; older configs use
  // `rope_theta` + `rope_scaling`. Accept both.
  const params = c.rope_parameters ?? c.rope_scaling;
  const field = c.rope_parameters !== undefined ? 'rope_parameters' : 'rope_scaling';
  if (params !== undefined && params !== null && (typeof params !== 'object' || Array.isArray(params))) {
    throw new ConfigError('INVALID_FIELD', source, `${field} must be an object or null`, field);
  }
  const p = (params ?? {}) as Record<string, unknown>;
  const thetaRaw = c.rope_theta ?? p.rope_theta ?? 10000;
  if (typeof thetaRaw !== 'number' || !(thetaRaw > 0)) throw new ConfigError('INVALID_FIELD', source, 'rope_theta must be a positive number', 'rope_theta');

  const type = p.rope_type ?? p.type ?? 'default';
  const num = (key: string): number => {
    const v = p[key];
    if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) {
      throw new ConfigError(v === undefined ? 'MISSING_FIELD' : 'INVALID_FIELD', source, `${field}.${key} must be a positive number for rope_type "${String(type)}"`, `${field}.${key}`);
    }
    return v;
  };
  switch (type) {
    case 'default':
      return { ropeTheta: thetaRaw, ropeScaling: { type: 'default' } };
    case 'linear':
      return { ropeTheta: thetaRaw, ropeScaling: { type: 'linear', factor: num('factor') } };
    case 'llama3': {
      const s: RopeScaling = {
        type: 'llama3',
        factor: num('factor'),
        lowFreqFactor: num('low_freq_factor'),
        highFreqFactor: num('high_freq_factor'),
        originalMaxPositionEmbeddings: num('original_max_position_embeddings'),
      };
      if (s.highFreqFactor <= s.lowFreqFactor) {
        throw new ConfigError('INVALID_FIELD', source, `${field}: high_freq_factor must exceed low_freq_factor`, `${field}.high_freq_factor`);
      }
      return { ropeTheta: thetaRaw, ropeScaling: s };
    }
    default:
      throw new ConfigError(
        'UNSUPPORTED_ROPE',
        source,
        `rope type ${JSON.stringify(type)} is not supported (supported: default, linear, llama3)`,
        field,
      );
  }
}

/** Typed access to config fields with errors that name the field. */
class FieldReader {
  constructor(
    private readonly c: Record<string, unknown>,
    private readonly source: string,
  ) {}

  private get(key: string, fallback: unknown): unknown {
    const v = this.c[key];
    if (v === undefined || v === null) {
      if (fallback === undefined) throw new ConfigError('MISSING_FIELD', this.source, `required field "${key}" is missing`, key);
      return fallback;
    }
    return v;
  }

  posInt(key: string, fallback?: number): number {
    const v = this.get(key, fallback);
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v <= 0) {
      throw new ConfigError('INVALID_FIELD', this.source, `"${key}" must be a positive integer, got ${JSON.stringify(v)}`, key);
    }
    const bound = DIMENSION_BOUNDS[key];
    if (bound !== undefined && v > bound) {
      throw new ConfigError('INVALID_FIELD', this.source, `"${key}" = ${v} is beyond any real model (at most ${bound}); refusing to size buffers from it`, key);
    }
    return v;
  }

  nonNegInt(key: string, fallback?: number): number {
    const v = this.get(key, fallback);
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) {
      throw new ConfigError('INVALID_FIELD', this.source, `"${key}" must be a non-negative integer, got ${JSON.stringify(v)}`, key);
    }
    return v;
  }

  posNum(key: string, fallback?: number): number {
    const v = this.get(key, fallback);
    if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) {
      throw new ConfigError('INVALID_FIELD', this.source, `"${key}" must be a positive number, got ${JSON.stringify(v)}`, key);
    }
    return v;
  }

  bool(key: string, fallback: boolean): boolean {
    const v = this.get(key, fallback);
    if (typeof v !== 'boolean') throw new ConfigError('INVALID_FIELD', this.source, `"${key}" must be a boolean, got ${JSON.stringify(v)}`, key);
    return v;
  }
}
