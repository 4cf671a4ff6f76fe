import { NervaError } from '@nerva/core';
import { isGgufPath, readOptionalModelText } from '@nerva/models';
import type { RequestLimits } from './request-validation.js';
import { InvalidParamsError } from './sampling-params.js';

/**
 * Embeddings of a decoder model: what a model folder says about pooling (the sentence-transformers
 * layout), the checks an embedding request passes, and the vector math after pooling. The
 * per-step collection of hidden states lives in embedding-jobs.ts.
 */

/** How a sequence's final hidden states (after the final norm) become one vector. */
export type EmbeddingPooling = 'last' | 'mean';

/** A model's embedding settings, from its folder (or the defaults). */
export interface EmbeddingConfig {
  /** `last`: the last token's hidden state (Qwen3-Embedding); `mean`: the mean over every token. */
  pooling: EmbeddingPooling;
  /** Whether the model's modules end with a Normalize step (unit L2 norm). */
  normalize: boolean;
  /**
   * Matryoshka: the sizes `dimensions` may take (config.json `matryoshka_dimensions`), or 'any'
   * (`is_matryoshka: true`); absent when the model does not declare itself a Matryoshka model.
   */
  matryoshka?: readonly number[] | 'any';
  /** Where pooling and normalize came from: the files read, or `default`. */
  source: string;
}

/** Options of `embed`. */
export interface EmbedOptions {
  /** Overrides the model's pooling (default: its 1_Pooling config, else `last`). */
  pooling?: EmbeddingPooling;
  /** Overrides the model's normalization (default: true when its modules list a Normalize step). */
  normalize?: boolean;
  /**
   * Matryoshka truncation: keep the first `dimensions` components and renormalize them to unit
   * length. Only for models whose config.json declares Matryoshka dimensions (else InvalidParamsError).
   */
  dimensions?: number;
  /** Lower values run first (vLLM's convention), as for generation requests. */
  priority?: number;
  /** Aborting ends every input of the call; the promise rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** What `embed` resolves with: one vector per input, in input order. */
export interface EmbedResult {
  embeddings: Float32Array[];
  /** Tokens of each input (the OpenAI usage's prompt_tokens is their sum). */
  promptTokens: number[];
  pooling: EmbeddingPooling;
  /** Whether the vectors have unit L2 norm (normalize, or Matryoshka truncation). */
  normalized: boolean;
  /** Components per vector. */
  dimensions: number;
}

/** The settings one embed call runs with (options resolved against the model's config). */
export interface ResolvedEmbedding {
  pooling: EmbeddingPooling;
  normalize: boolean;
  /** Components kept (the hidden size unless Matryoshka truncation asked for fewer). */
  dimensions: number;
  truncated: boolean;
}

/** A model folder's embedding files are malformed or ask for what is not implemented. */
export class EmbeddingConfigError extends NervaError {
  constructor(
    /** The file at fault. */
    readonly file: string,
    /** The field at fault, when one is. */
    readonly field: string | undefined,
    message: string,
  ) {
    super('EMBEDDING_CONFIG', `${file}${field !== undefined ? ` (${field})` : ''}: ${message}`);
  }
}

const DEFAULT_CONFIG: EmbeddingConfig = { pooling: 'last', normalize: false, source: 'default' };

/** sentence-transformers Pooling flags, and the pooling each one means here (undefined: not implemented). */
const POOLING_MODES: Record<string, EmbeddingPooling | undefined> = {
  pooling_mode_lasttoken: 'last',
  pooling_mode_mean_tokens: 'mean',
  pooling_mode_cls_token: undefined,
  pooling_mode_max_tokens: undefined,
  pooling_mode_mean_sqrt_len_tokens: undefined,
  pooling_mode_weightedmean_tokens: undefined,
};

function parseJson(text: string, file: string): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new EmbeddingConfigError(file, undefined, `not valid JSON: ${(e as Error).message}`);
  }
}

/** The last dotted segment of a sentence-transformers module type (`sentence_transformers.models.Pooling` → `Pooling`). */
function moduleKind(type: string): string {
  return type.slice(type.lastIndexOf('.') + 1);
}

/** The pooling a Pooling module's config.json enables (exactly one implemented flag). */
async function readPooling(dir: string, path: string, hiddenSize: number): Promise<EmbeddingPooling> {
  const file = path === '' ? 'config.json' : `${path}/config.json`;
  const text = await readOptionalModelText(dir, file);
  if (text === undefined) throw new EmbeddingConfigError(file, undefined, 'the Pooling module has no config.json');
  const cfg = parseJson(text, file);
  if (typeof cfg !== 'object' || cfg === null || Array.isArray(cfg)) throw new EmbeddingConfigError(file, undefined, 'must be a JSON object');
  const c = cfg as Record<string, unknown>;
  const dim = c.word_embedding_dimension;
  if (dim !== undefined && dim !== hiddenSize) {
    throw new EmbeddingConfigError(file, 'word_embedding_dimension', `is ${JSON.stringify(dim)}, but the model's hidden size is ${hiddenSize}`);
  }
  const on = Object.keys(POOLING_MODES).filter((k) => c[k] === true);
  // A newer spelling: one `pooling_mode` string (lasttoken, mean, cls, ...).
  if (on.length === 0 && typeof c.pooling_mode === 'string') {
    const mode = c.pooling_mode;
    if (mode === 'lasttoken') return 'last';
    if (mode === 'mean') return 'mean';
    throw new EmbeddingConfigError(file, 'pooling_mode', `${JSON.stringify(mode)} is not implemented (lasttoken and mean are)`);
  }
  if (on.length === 0) throw new EmbeddingConfigError(file, undefined, 'enables no pooling mode (expected pooling_mode_lasttoken or pooling_mode_mean_tokens: true)');
  if (on.length > 1) throw new EmbeddingConfigError(file, on.join(', '), 'enables several pooling modes (concatenated poolings are not implemented)');
  const pooling = POOLING_MODES[on[0]];
  if (pooling === undefined) throw new EmbeddingConfigError(file, on[0], 'is not implemented (pooling_mode_lasttoken and pooling_mode_mean_tokens are)');
  return pooling;
}

/** Matryoshka sizes declared by config.json (vLLM's `matryoshka_dimensions` / `is_matryoshka`). */
async function readMatryoshka(dir: string, hiddenSize: number): Promise<EmbeddingConfig['matryoshka']> {
  const text = await readOptionalModelText(dir, 'config.json');
  if (text === undefined) return undefined;
  const c = parseJson(text, 'config.json') as Record<string, unknown> | null;
  if (typeof c !== 'object' || c === null) return undefined;
  const dims = c.matryoshka_dimensions;
  if (dims !== undefined && dims !== null) {
    if (!Array.isArray(dims) || dims.length === 0 || dims.some((d) => !Number.isInteger(d) || (d as number) < 1 || (d as number) > hiddenSize)) {
      throw new EmbeddingConfigError('config.json', 'matryoshka_dimensions', `must be a non-empty array of integers in [1, ${hiddenSize}]`);
    }
    return [...(dims as number[])].sort((a, b) => a - b);
  }
  return c.is_matryoshka === true ? 'any' : undefined;
}

/**
 * The embedding settings of model folder `dir` (hidden size `hiddenSize`), read from the
 * sentence-transformers files when present: `modules.json` (its Pooling module's `config.json`,
 * a Normalize step), else a lone `1_Pooling/config.json`; Matryoshka sizes from `config.json`.
 * Without them: last-token pooling, not normalized (a decoder model's final hidden state).
 * Throws {@link EmbeddingConfigError} naming the file and field that is malformed or not implemented
 * (a Dense module, CLS or max pooling, several poolings).
 */
export async function readEmbeddingConfig(dir: string, hiddenSize: number): Promise<EmbeddingConfig> {
  if (isGgufPath(dir)) return { ...DEFAULT_CONFIG, source: 'default (a GGUF file has no sentence-transformers modules)' };
  const matryoshka = await readMatryoshka(dir, hiddenSize);
  const withM = (c: EmbeddingConfig): EmbeddingConfig => (matryoshka ? { ...c, matryoshka } : c);
  const modulesText = await readOptionalModelText(dir, 'modules.json');
  if (modulesText === undefined) {
    const lone = await readOptionalModelText(dir, '1_Pooling/config.json');
    if (lone === undefined) return withM(DEFAULT_CONFIG);
    return withM({ pooling: await readPooling(dir, '1_Pooling', hiddenSize), normalize: false, source: '1_Pooling/config.json' });
  }
  const modules = parseJson(modulesText, 'modules.json');
  if (!Array.isArray(modules)) throw new EmbeddingConfigError('modules.json', undefined, 'must be a JSON array of modules');
  let pooling: EmbeddingPooling | undefined;
  let poolingFile = '';
  let normalize = false;
  for (const [i, m] of modules.entries()) {
    const field = `[${i}].type`;
    const type = (m as { type?: unknown } | null)?.type;
    if (typeof type !== 'string') throw new EmbeddingConfigError('modules.json', field, 'must be a string');
    const kind = moduleKind(type);
    if (kind === 'Transformer') continue;
    if (kind === 'Normalize') {
      normalize = true;
      continue;
    }
    if (kind === 'Pooling') {
      if (pooling !== undefined) throw new EmbeddingConfigError('modules.json', field, 'a second Pooling module is not implemented');
      const path = (m as { path?: unknown }).path ?? '';
      if (typeof path !== 'string') throw new EmbeddingConfigError('modules.json', `[${i}].path`, 'must be a string');
      pooling = await readPooling(dir, path, hiddenSize);
      poolingFile = path === '' ? 'config.json' : `${path}/config.json`;
      continue;
    }
    throw new EmbeddingConfigError('modules.json', field, `module ${JSON.stringify(type)} is not implemented (Transformer, Pooling and Normalize are)`);
  }
  const source = pooling !== undefined ? `modules.json, ${poolingFile}` : 'modules.json';
  return withM({ pooling: pooling ?? 'last', normalize, source });
}

/**
 * Every check an embed call passes before anything is queued (the engine and the worker proxy both
 * call it): at least one input, each a non-empty list of token ids within the vocabulary and at
 * most the model's max length, the options well typed. Throws InvalidParamsError naming the field
 * (`input` with the index in the message, or the option).
 */
export function validateEmbedRequest(limits: RequestLimits, inputs: readonly (readonly number[])[], o: EmbedOptions): void {
  if (!Array.isArray(inputs) || inputs.length === 0) throw new InvalidParamsError('input', 'must hold at least one input');
  const { vocabSize, maxModelLen, numBlocks, blockSize } = limits;
  for (const [i, ids] of inputs.entries()) {
    if (!Array.isArray(ids) || ids.length === 0) throw new InvalidParamsError('input', `input[${i}] is empty; every input needs at least one token`);
    for (const t of ids) {
      if (!Number.isInteger(t) || t < 0 || t >= vocabSize) throw new InvalidParamsError('input', `input[${i}] has token id ${String(t)} outside [0, ${vocabSize})`);
    }
    if (ids.length > maxModelLen) {
      throw new InvalidParamsError('input', `input[${i}] has ${ids.length} tokens; this model's maximum length is ${maxModelLen} tokens (shorten the input)`);
    }
    const need = Math.ceil(ids.length / blockSize);
    if (need > numBlocks - 1) throw new InvalidParamsError('input', `input[${i}] needs ${need} KV blocks, the cache has ${numBlocks - 1}`);
  }
  if (o.pooling !== undefined && o.pooling !== 'last' && o.pooling !== 'mean') throw new InvalidParamsError('pooling', `must be 'last' or 'mean', got ${JSON.stringify(o.pooling)}`);
  if (o.normalize !== undefined && typeof o.normalize !== 'boolean') throw new InvalidParamsError('normalize', 'must be a boolean');
  if (o.dimensions !== undefined && (!Number.isInteger(o.dimensions) || o.dimensions < 1)) {
    throw new InvalidParamsError('dimensions', `must be a positive integer, got ${String(o.dimensions)}`);
  }
  if (o.priority !== undefined && !Number.isInteger(o.priority)) throw new InvalidParamsError('priority', 'must be an integer');
}

/** The options of one call resolved against the model's config; InvalidParamsError('dimensions') where Matryoshka truncation does not apply. */
export function resolveEmbedding(config: EmbeddingConfig, o: EmbedOptions, hiddenSize: number): ResolvedEmbedding {
  const pooling = o.pooling ?? config.pooling;
  const normalize = o.normalize ?? config.normalize;
  const d = o.dimensions;
  if (d === undefined) return { pooling, normalize, dimensions: hiddenSize, truncated: false };
  const m = config.matryoshka;
  if (m === undefined) {
    throw new InvalidParamsError(
      'dimensions',
      'this model does not declare Matryoshka embeddings (config.json has no matryoshka_dimensions or is_matryoshka), so a truncated vector would not be a meaningful embedding',
    );
  }
  if (d > hiddenSize) throw new InvalidParamsError('dimensions', `must be at most the model's hidden size ${hiddenSize}, got ${d}`);
  if (m !== 'any' && !m.includes(d)) throw new InvalidParamsError('dimensions', `must be one of the model's Matryoshka dimensions ${m.join(', ')}, got ${d}`);
  return { pooling, normalize, dimensions: d, truncated: true };
}

/** Below this norm a vector is left as it is (torch's F.normalize eps), not divided by ~0. */
const NORM_EPS = 1e-12;

/**
 * The output vector from a pooled hidden state: its first `dimensions` components, divided by
 * their L2 norm (computed in float64) when normalizing or truncating (Matryoshka vectors are
 * renormalized after truncation), rounded once to float32.
 */
export function finishEmbedding(pooled: Float32Array | Float64Array, how: ResolvedEmbedding): Float32Array {
  const d = how.dimensions;
  const out = new Float32Array(d);
  let scale = 1;
  if (how.normalize || how.truncated) {
    let ss = 0;
    for (let i = 0; i < d; i++) ss += pooled[i] * pooled[i];
    scale = 1 / Math.max(Math.sqrt(ss), NORM_EPS);
  }
  for (let i = 0; i < d; i++) out[i] = pooled[i] * scale;
  return out;
}
