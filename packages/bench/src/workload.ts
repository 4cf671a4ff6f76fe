import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { uniformInt } from 'pure-rand/distribution/uniformInt';
import { xoroshiro128plus } from 'pure-rand/generator/xoroshiro128plus';

/**
 * The throughput workload of nano-vllm's bench.py: `requests` prompts of random token ids with a
 * random length, each with a random number of tokens to generate (greedy, ignoring EOS).
 */
export interface WorkloadOptions {
  /** PRNG seed, an integer in [0, 2^32). */
  seed: number;
  /** Number of requests (nano-vllm: 256). */
  requests: number;
  /** Smallest prompt length and smallest max_tokens (nano-vllm: 100). */
  minLen: number;
  /** Largest prompt length, inclusive (nano-vllm: 1024). */
  maxInputLen: number;
  /** Largest max_tokens, inclusive (nano-vllm: 1024). */
  maxOutputLen: number;
  /** Prompt token ids are drawn from [0, tokenIdLimit): min(10000, vocab size) for a model. */
  tokenIdLimit: number;
}

export interface WorkloadRequest {
  prompt_ids: number[];
  max_tokens: number;
}

/** The workload as written to a file (`--workload-out`) and read by tools/gpu/torch_throughput.py. */
export interface Workload {
  seed: number;
  min_len: number;
  max_input_len: number;
  max_output_len: number;
  token_id_limit: number;
  requests: WorkloadRequest[];
}

/** nano-vllm's bench.py draws token ids below 10000. */
export const WORKLOAD_TOKEN_ID_CAP = 10000;

export class WorkloadError extends Error {
  override name = 'WorkloadError';
}

const U32 = 2 ** 32;

function checkInt(name: string, v: number, min: number, max = Number.MAX_SAFE_INTEGER): void {
  if (!Number.isInteger(v) || v < min || v > max) {
    throw new WorkloadError(`${name} must be an integer in [${min}, ${max === Number.MAX_SAFE_INTEGER ? 'inf' : max}], got ${String(v)}`);
  }
}

/** Checks the options; throws a WorkloadError naming the first bad one. */
export function validateWorkloadOptions(o: WorkloadOptions): void {
  checkInt('seed', o.seed, 0, U32 - 1);
  checkInt('requests', o.requests, 1);
  checkInt('min-len', o.minLen, 1);
  checkInt('max-input-len', o.maxInputLen, 1);
  checkInt('max-output-len', o.maxOutputLen, 1);
  checkInt('token id limit', o.tokenIdLimit, 1, U32);
  if (o.minLen > o.maxInputLen) throw new WorkloadError(`min-len (${o.minLen}) must not exceed max-input-len (${o.maxInputLen})`);
  if (o.minLen > o.maxOutputLen) throw new WorkloadError(`min-len (${o.minLen}) must not exceed max-output-len (${o.maxOutputLen})`);
}

/**
 * The workload, a pure function of the options: a xoroshiro128+ generator (pure-rand) seeded with
 * `seed` draws, in nano-vllm's order, every prompt first (its length uniform in
 * [minLen, maxInputLen], then its ids uniform in [0, tokenIdLimit)), then every request's
 * max_tokens uniform in [minLen, maxOutputLen]. Bounds are inclusive, as Python's randint.
 */
export function makeWorkload(o: WorkloadOptions): Workload {
  validateWorkloadOptions(o);
  const rng = xoroshiro128plus(o.seed);
  const prompts: number[][] = [];
  for (let i = 0; i < o.requests; i++) {
    const len = uniformInt(rng, o.minLen, o.maxInputLen);
    const ids = new Array<number>(len);
    for (let t = 0; t < len; t++) ids[t] = uniformInt(rng, 0, o.tokenIdLimit - 1);
    prompts.push(ids);
  }
  const requests = prompts.map((prompt_ids) => ({ prompt_ids, max_tokens: uniformInt(rng, o.minLen, o.maxOutputLen) }));
  return {
    seed: o.seed,
    min_len: o.minLen,
    max_input_len: o.maxInputLen,
    max_output_len: o.maxOutputLen,
    token_id_limit: o.tokenIdLimit,
    requests,
  };
}

/**
 * The canonical text of a workload: compact JSON, keys in the order of {@link Workload}. This is
 * exactly what `--workload-out` writes (no trailing newline), and its sha256 is the workload's id
 * on both sides (tools/gpu/torch_throughput.py computes it the same way: json.dumps with
 * separators=(',', ':') over the same keys in the same order).
 */
export function canonicalWorkloadJson(w: Workload): string {
  return JSON.stringify({
    seed: w.seed,
    min_len: w.min_len,
    max_input_len: w.max_input_len,
    max_output_len: w.max_output_len,
    token_id_limit: w.token_id_limit,
    requests: w.requests.map((r) => ({ prompt_ids: r.prompt_ids, max_tokens: r.max_tokens })),
  });
}

/** sha256 (hex) of {@link canonicalWorkloadJson}. */
export function workloadSha256(w: Workload): string {
  return createHash('sha256').update(canonicalWorkloadJson(w)).digest('hex');
}

/** Totals of a workload. */
export function workloadStats(w: Workload): { promptTokens: number; maxOutputTokens: number; longestIndex: number; maxPositions: number } {
  let promptTokens = 0;
  let maxOutputTokens = 0;
  let longestIndex = 0;
  let maxPositions = 0;
  w.requests.forEach((r, i) => {
    promptTokens += r.prompt_ids.length;
    maxOutputTokens += r.max_tokens;
    const n = r.prompt_ids.length + r.max_tokens;
    if (n > maxPositions) {
      maxPositions = n;
      longestIndex = i;
    }
  });
  return { promptTokens, maxOutputTokens, longestIndex, maxPositions };
}

/** Reads and checks a workload file (as `--workload-out` writes it). Errors name the file and the field. */
export function readWorkload(path: string): Workload {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new WorkloadError(`cannot read workload ${path}: ${(e as Error).message}`);
  }
  let j: unknown;
  try {
    j = JSON.parse(text);
  } catch (e) {
    throw new WorkloadError(`workload ${path} is not JSON: ${(e as Error).message}`);
  }
  const o = j as Partial<Workload>;
  if (typeof o !== 'object' || o === null || !Array.isArray(o.requests)) throw new WorkloadError(`workload ${path}: no "requests" array`);
  const int = (name: string, v: unknown, min: number) => {
    if (typeof v !== 'number' || !Number.isInteger(v) || v < min) throw new WorkloadError(`workload ${path}: ${name} must be an integer >= ${min}, got ${JSON.stringify(v)}`);
    return v;
  };
  const w: Workload = {
    seed: int('seed', o.seed, 0),
    min_len: int('min_len', o.min_len, 1),
    max_input_len: int('max_input_len', o.max_input_len, 1),
    max_output_len: int('max_output_len', o.max_output_len, 1),
    token_id_limit: int('token_id_limit', o.token_id_limit, 1),
    requests: [],
  };
  if (o.requests.length === 0) throw new WorkloadError(`workload ${path}: "requests" is empty`);
  o.requests.forEach((r: Partial<WorkloadRequest>, i: number) => {
    if (typeof r !== 'object' || r === null || !Array.isArray(r.prompt_ids) || r.prompt_ids.length === 0) {
      throw new WorkloadError(`workload ${path}: requests[${i}].prompt_ids must be a non-empty array`);
    }
    for (const t of r.prompt_ids) {
      if (typeof t !== 'number' || !Number.isInteger(t) || t < 0 || t >= w.token_id_limit) {
        throw new WorkloadError(`workload ${path}: requests[${i}].prompt_ids holds ${JSON.stringify(t)}, not an integer in [0, ${w.token_id_limit})`);
      }
    }
    w.requests.push({ prompt_ids: r.prompt_ids, max_tokens: int(`requests[${i}].max_tokens`, r.max_tokens, 1) });
  });
  return w;
}
