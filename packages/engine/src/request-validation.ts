import { grammarOf, type GrammarOptions, type GrammarSpec } from './grammar/spec.js';
import { InvalidParamsError, resolveSamplingParams, type ResolvedSamplingParams, type SamplingParams } from './sampling-params.js';

/** What a request is checked against: facts of the loaded model and its KV cache. */
export interface RequestLimits {
  vocabSize: number;
  maxModelLen: number;
  numBlocks: number;
  blockSize: number;
  hasTokenizer: boolean;
  /**
   * When pages behind a sliding window are freed (every layer slides): the most blocks one
   * sequence holds at once, however long it grows. Absent: a sequence holds all of its blocks.
   */
  maxHeldBlocks?: number;
  /** The most forks one prompt may have (Engine.submitFork): the sequences one batch holds. Absent: no limit is known. */
  maxForks?: number;
}

export interface RequestCheckOptions extends SamplingParams, GrammarOptions {
  priority?: number;
  forceTokens?: readonly number[];
}

/**
 * Every check a request passes before it is queued, in one place (the in-process engine and the
 * worker proxy both call it): throws InvalidParamsError naming the field, changes nothing.
 */
export function validateRequest(limits: RequestLimits, ids: readonly number[], o: RequestCheckOptions): ResolvedSamplingParams {
  const { vocabSize, maxModelLen, numBlocks, blockSize } = limits;
  if (ids.length === 0) throw new InvalidParamsError('prompt', 'must contain at least one token');
  for (const t of ids) {
    if (!Number.isInteger(t) || t < 0 || t >= vocabSize) throw new InvalidParamsError('prompt', `token id ${t} outside [0, ${vocabSize})`);
  }
  if (ids.length >= maxModelLen) throw new InvalidParamsError('prompt', `${ids.length} tokens leave no room under max_model_len ${maxModelLen}`);
  const params = resolveSamplingParams(o, { maxTokens: maxModelLen - ids.length, vocabSize });
  const need = Math.min(Math.ceil((ids.length + params.maxTokens) / blockSize), limits.maxHeldBlocks ?? Infinity);
  if (need > numBlocks - 1) throw new InvalidParamsError('max_tokens', `prompt + max_tokens need ${need} KV blocks, the cache has ${numBlocks - 1}`);
  if (params.stop.length > 0 && !limits.hasTokenizer) throw new InvalidParamsError('stop', 'stop strings need a tokenizer');
  if (o.priority !== undefined && !Number.isInteger(o.priority)) throw new InvalidParamsError('priority', 'must be an integer');
  if (o.forceTokens !== undefined) {
    if (o.forceTokens.length === 0 || o.forceTokens.length > params.maxTokens) {
      throw new InvalidParamsError('force_tokens', `must hold 1..${params.maxTokens} tokens`);
    }
    for (const t of o.forceTokens) {
      if (!Number.isInteger(t) || t < 0 || t >= vocabSize) throw new InvalidParamsError('force_tokens', `token id ${t} outside [0, ${vocabSize})`);
    }
  }
  validateGrammarRequest(limits, o, params);
  return params;
}

/**
 * The grammar a request constrains its output with (checked for shape, and against what it
 * cannot be combined with); undefined when it has none. Throws InvalidParamsError.
 */
export function validateGrammarRequest(limits: RequestLimits, o: RequestCheckOptions, params: ResolvedSamplingParams): GrammarSpec | undefined {
  const g = grammarOf(o);
  if (g === undefined) return undefined;
  if (!limits.hasTokenizer) throw new InvalidParamsError('grammar', 'constrained decoding needs the model\'s tokenizer (tokenizer.json)');
  // A stop string could end the output where the grammar does not accept it; stop token ids end it
  // only where the grammar accepts (they become the grammar's stop tokens).
  if (params.stop.length > 0) throw new InvalidParamsError('stop', 'stop strings cannot be combined with a grammar (the output would end where the grammar does not accept it); use stop token ids');
  // Before min_tokens, EOS is banned, which a grammar that is complete may leave nothing else to take.
  if (params.minTokens > 0) throw new InvalidParamsError('min_tokens', 'cannot be combined with a grammar');
  return g;
}

/**
 * The checks `n` shared-prefix forks of one request add (Engine.submitFork, after validateRequest
 * accepted the request itself): an integer in [1, maxForks], and no teacher forcing across forks.
 * Throws InvalidParamsError('n', ...), changes nothing.
 */
export function validateForkCount(limits: RequestLimits, n: number, o: Pick<RequestCheckOptions, 'forceTokens'>): void {
  const max = limits.maxForks ?? Number.MAX_SAFE_INTEGER;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > max) {
    throw new InvalidParamsError('n', `must be an integer in [1, ${max}] (forks of one prompt run in one batch of at most ${max} sequences), got ${String(n)}`);
  }
  if (n > 1 && o.forceTokens !== undefined) throw new InvalidParamsError('n', 'forced tokens (teacher forcing) cannot be combined with n > 1 forks');
}
