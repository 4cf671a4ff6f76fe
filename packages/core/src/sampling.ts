/**
 * The sampling rule every backend implements identically, so a seeded request gives the same
 * tokens on any backend (given the same logits). Penalties are applied to logits before.
 */

/** A 32-bit integer hash (lowbias32); cheap on a GPU, identical in JS with Math.imul. */
export function mix32(x: number): number {
  x = (x ^ (x >>> 16)) >>> 0;
  x = Math.imul(x, 0x7feb352d) >>> 0;
  x = (x ^ (x >>> 15)) >>> 0;
  x = Math.imul(x, 0x846ca68b) >>> 0;
  x = (x ^ (x >>> 16)) >>> 0;
  return x;
}

/** Uniform in [0, 1) from a seed and a counter: the counter-based RNG of the sampler. */
export function uniformFromSeed(seed: number, counter: number): number {
  const h = mix32((seed ^ mix32((counter + 0x9e3779b9) >>> 0)) >>> 0);
  return (h >>> 8) / 16777216;
}

export interface SampleParams {
  temperature: number;
  /** 0 disables. */
  topK: number;
  /** 1 disables. */
  topP: number;
  /** 0 disables. */
  minP: number;
}

export function argmaxRow(logits: ArrayLike<number>, offset = 0, vocab = logits.length - offset): number {
  let best = 0;
  let bv = -Infinity;
  for (let i = 0; i < vocab; i++) {
    const v = logits[offset + i];
    if (v > bv) {
      bv = v;
      best = i;
    }
  }
  return best;
}

/**
 * Sample one token from one row of logits.
 * 1. temperature <= 0: argmax (lowest index on ties).
 * 2. p = softmax(logits / temperature), in float64.
 * 3. candidates by p descending (ties: lower index first); keep the first topK (if > 0);
 *    keep the shortest prefix whose mass reaches topP (at least one); drop p < minP * p_max.
 * 4. u = uniform; return the first candidate whose cumulative mass exceeds u * kept mass.
 * `scratch` (length >= vocab) avoids allocating per call.
 */
export function sampleRow(
  logits: ArrayLike<number>,
  offset: number,
  vocab: number,
  p: SampleParams,
  u: number,
  scratch?: { idx: Int32Array; prob: Float64Array },
): number {
  if (!(p.temperature > 0)) return argmaxRow(logits, offset, vocab);
  const idx = scratch?.idx ?? new Int32Array(vocab);
  const prob = scratch?.prob ?? new Float64Array(vocab);
  let max = -Infinity;
  for (let i = 0; i < vocab; i++) max = Math.max(max, logits[offset + i]);
  let sum = 0;
  for (let i = 0; i < vocab; i++) {
    const e = Math.exp((logits[offset + i] - max) / p.temperature);
    prob[i] = e;
    sum += e;
  }
  for (let i = 0; i < vocab; i++) prob[i] /= sum;
  // Candidate count: cut with a partial selection before sorting when topK bounds it.
  let n = vocab;
  for (let i = 0; i < vocab; i++) idx[i] = i;
  const sub = idx.subarray(0, n);
  sub.sort((a, b) => prob[b] - prob[a] || a - b);
  if (p.topK > 0 && p.topK < n) n = p.topK;
  if (p.topP < 1) {
    let c = 0;
    let k = 0;
    while (k < n) {
      c += prob[idx[k]];
      k++;
      if (c >= p.topP) break;
    }
    n = Math.max(1, k);
  }
  if (p.minP > 0) {
    const floor = p.minP * prob[idx[0]];
    let k = 1;
    while (k < n && prob[idx[k]] >= floor) k++;
    n = k;
  }
  let kept = 0;
  for (let k = 0; k < n; k++) kept += prob[idx[k]];
  const target = u * kept;
  let c = 0;
  for (let k = 0; k < n; k++) {
    c += prob[idx[k]];
    if (c > target) return idx[k];
  }
  return idx[n - 1];
}
