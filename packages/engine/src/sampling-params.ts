import { NervaError } from '@nerva/core';

/** Per-request sampling and stopping parameters (OpenAI's and vLLM's names, camel-cased). */
export interface SamplingParams {
  /** 0 = greedy. Default 1. */
  temperature?: number;
  topK?: number;
  topP?: number;
  minP?: number;
  /** >1 discourages tokens seen in prompt or output (multiplicative, HF/vLLM style). */
  repetitionPenalty?: number;
  /** Subtracted once from the logit of every token already generated. */
  presencePenalty?: number;
  /** Subtracted per occurrence in the generated text. */
  frequencyPenalty?: number;
  /** Makes sampling reproducible; a random seed is drawn when absent. */
  seed?: number;
  maxTokens?: number;
  minTokens?: number;
  stop?: string[];
  stopTokenIds?: number[];
  ignoreEos?: boolean;
  /** Return the log-probability of each sampled token and this many alternatives. */
  logprobs?: boolean;
  topLogprobs?: number;
  includeStopStrInOutput?: boolean;
  /**
   * Added to the logits of these token ids before sampling (OpenAI's `logit_bias`: values in
   * [-100, 100]; -100 in practice bans a token, 100 forces it). Keys are token ids (numbers, or
   * their decimal strings as JSON has them).
   */
  logitBias?: Record<number | string, number>;
}

export type ResolvedSamplingParams = Required<Omit<SamplingParams, 'seed' | 'logitBias'>> & {
  seed: number;
  /** logitBias as [token id, bias] pairs (empty: none). */
  logitBias: readonly (readonly [number, number])[];
};

export class InvalidParamsError extends NervaError {
  constructor(
    readonly param: string,
    message: string,
  ) {
    super('INVALID_PARAMS', `${param}: ${message}`);
  }
}

function num(v: number | undefined, name: string, def: number, lo: number, hi: number): number {
  if (v === undefined || v === null) return def;
  if (typeof v !== 'number' || !Number.isFinite(v)) throw new InvalidParamsError(name, `must be a finite number, got ${String(v)}`);
  if (v < lo || v > hi) throw new InvalidParamsError(name, `must be in [${lo}, ${hi}], got ${v}`);
  return v;
}

function int(v: number | undefined, name: string, def: number, lo: number, hi: number): number {
  const x = num(v, name, def, lo, hi);
  if (!Number.isInteger(x)) throw new InvalidParamsError(name, `must be an integer, got ${x}`);
  return x;
}

/** Validate and fill defaults; throws InvalidParamsError naming the bad field. */
export function resolveSamplingParams(p: SamplingParams, limits: { maxTokens: number; vocabSize: number }): ResolvedSamplingParams {
  const stop = p.stop ?? [];
  if (!Array.isArray(stop) || stop.some((s) => typeof s !== 'string' || s.length === 0)) {
    throw new InvalidParamsError('stop', 'must be an array of non-empty strings');
  }
  const stopTokenIds = p.stopTokenIds ?? [];
  if (!Array.isArray(stopTokenIds) || stopTokenIds.some((t) => !Number.isInteger(t) || t < 0 || t >= limits.vocabSize)) {
    throw new InvalidParamsError('stop_token_ids', `must be token ids in [0, ${limits.vocabSize})`);
  }
  const maxTokens = int(p.maxTokens, 'max_tokens', Math.min(256, limits.maxTokens), 1, limits.maxTokens);
  return {
    temperature: num(p.temperature, 'temperature', 1, 0, 100),
    topK: int(p.topK, 'top_k', 0, -1, limits.vocabSize) === -1 ? 0 : int(p.topK, 'top_k', 0, -1, limits.vocabSize),
    topP: num(p.topP, 'top_p', 1, Number.MIN_VALUE, 1),
    minP: num(p.minP, 'min_p', 0, 0, 1),
    repetitionPenalty: num(p.repetitionPenalty, 'repetition_penalty', 1, Number.MIN_VALUE, 100),
    presencePenalty: num(p.presencePenalty, 'presence_penalty', 0, -2, 2),
    frequencyPenalty: num(p.frequencyPenalty, 'frequency_penalty', 0, -2, 2),
    seed: p.seed === undefined || p.seed === null ? (Math.random() * 0x7fffffff) | 0 : int(p.seed, 'seed', 0, -(2 ** 53), 2 ** 53) | 0,
    maxTokens,
    minTokens: int(p.minTokens, 'min_tokens', 0, 0, maxTokens),
    stop,
    stopTokenIds,
    ignoreEos: Boolean(p.ignoreEos ?? false),
    logprobs: Boolean(p.logprobs ?? false),
    topLogprobs: int(p.topLogprobs, 'top_logprobs', 0, 0, 20),
    includeStopStrInOutput: Boolean(p.includeStopStrInOutput ?? false),
    logitBias: resolveLogitBias(p.logitBias, limits.vocabSize),
  };
}

/** logit_bias as pairs: keys token ids below vocabSize, values finite in [-100, 100]. */
function resolveLogitBias(b: SamplingParams['logitBias'], vocabSize: number): [number, number][] {
  if (b === undefined || b === null) return [];
  if (typeof b !== 'object' || Array.isArray(b)) throw new InvalidParamsError('logit_bias', 'must be an object mapping token ids to biases');
  const out: [number, number][] = [];
  for (const [k, v] of Object.entries(b)) {
    const id = /^(0|[1-9][0-9]*)$/.test(k) ? Number(k) : NaN;
    if (!Number.isSafeInteger(id) || id >= vocabSize) throw new InvalidParamsError('logit_bias', `key ${JSON.stringify(k)} is not a token id in [0, ${vocabSize})`);
    if (typeof v !== 'number' || !Number.isFinite(v) || v < -100 || v > 100) throw new InvalidParamsError('logit_bias', `bias of token ${k} must be a number in [-100, 100], got ${String(v)}`);
    out.push([id, v]);
  }
  if (out.length > 1024) throw new InvalidParamsError('logit_bias', `at most 1024 tokens, got ${out.length}`);
  return out;
}

/** Parameters the device sampler implements as is (no penalties, no logprobs, no min_tokens, no logit bias). */
export function isDeviceSamplable(p: ResolvedSamplingParams): boolean {
  return p.repetitionPenalty === 1 && p.presencePenalty === 0 && p.frequencyPenalty === 0 && !p.logprobs && p.minTokens === 0 && p.logitBias.length === 0;
}
