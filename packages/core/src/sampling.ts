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
  // Candidates by p descending, ties by lower index: a total order, so the first m of a partial
  // selection sorted are exactly the first m of a full sort. Every cut below reads a prefix, so
  // with a cut only the prefix it needs is sorted (topK: k candidates; topP / minP: a prefix
  // that grows until the cut falls inside it); without any cut the whole row is.
  const cmp = (a: number, b: number) => prob[b] - prob[a] || a - b;
  const cut = p.topK > 0 || p.topP < 1 || p.minP > 0;
  let m = p.topK > 0 ? Math.min(p.topK, vocab) : cut ? Math.min(vocab, FIRST_PREFIX) : vocab;
  // Sorts at least the first `len` candidates; returns how many are sorted (a long prefix of a
  // float32 row is cheaper sorted whole, by radix).
  const sortPrefix = (len: number): number => {
    if (len * 8 >= vocab && sortAllFast(logits, offset, vocab, prob, idx, cmp)) return vocab;
    for (let i = 0; i < vocab; i++) idx[i] = i;
    if (len < vocab) selectTop(idx, vocab, len, cmp);
    idx.subarray(0, len).sort(cmp);
    return len;
  };
  m = sortPrefix(m);
  let n = vocab;
  if (p.topK > 0 && p.topK < n) n = p.topK;
  if (p.topP < 1) {
    for (;;) {
      let c = 0;
      let k = 0;
      const lim = Math.min(n, m);
      while (k < lim) {
        c += prob[idx[k]];
        k++;
        if (c >= p.topP) break;
      }
      // The mass was not reached inside the sorted prefix: sort a longer one and walk again.
      if (c < p.topP && k === m && m < n) {
        m = sortPrefix(Math.min(vocab, m * 8));
        continue;
      }
      n = Math.max(1, k);
      break;
    }
  }
  if (n > m) {
    // minP alone: its cut must fall inside the sorted prefix, else sort the whole row.
    if (p.minP > 0 && prob[idx[m - 1]] >= p.minP * prob[idx[0]]) m = sortPrefix(vocab);
  }
  if (p.minP > 0) {
    const floor = p.minP * prob[idx[0]];
    let k = 1;
    while (k < n && prob[idx[k]] >= floor) k++;
    n = k;
  }
  // Every cut fell inside the sorted prefix (or the whole row is sorted).
  n = Math.min(n, m);
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

/**
 * sampleRow over the ids a token mask allows (constrained decoding): bit (t & 31) of
 * `bits[base + (t >> 5)]` set where id t < vocab is allowed. The rule of sampleRow applied to the
 * allowed ids alone, in id order (what sampleRow gives when every other logit is -Infinity, ties
 * and cuts included), so its fallback candidate is an allowed id too. `vals`/`ids` (length >=
 * vocab) hold the allowed ids' logits and ids; -1 when the mask allows no id.
 */
export function sampleRowMasked(
  logits: ArrayLike<number>,
  offset: number,
  vocab: number,
  bits: ArrayLike<number>,
  base: number,
  p: SampleParams,
  u: number,
  scratch: { idx: Int32Array; prob: Float64Array; vals: Float32Array; ids: Int32Array },
): number {
  let n = 0;
  const { vals, ids } = scratch;
  for (let w = 0, words = Math.ceil(vocab / 32); w < words; w++) {
    let word = bits[base + w] | 0;
    while (word !== 0) {
      const b = 31 - Math.clz32(word & -word);
      word &= word - 1;
      const t = w * 32 + b;
      if (t >= vocab) break;
      vals[n] = logits[offset + t];
      ids[n++] = t;
    }
  }
  if (n === 0) return -1;
  return ids[sampleRow(vals, 0, n, p, u, scratch)];
}

/** Scratch of the radix sort below, grown to the largest vocabulary seen (module-level: sampling allocates nothing per call). */
let radix = { keys: new Uint32Array(0), keys2: new Uint32Array(0), ids2: new Int32Array(0), counts: new Int32Array(2048) };
const keyBits = new Uint32Array(1);
const keyFloat = new Float32Array(keyBits.buffer);

/**
 * Every id in cmp's order (p descending, ties by lower id) for a float32 row: a stable LSD radix
 * sort (three 11-bit digits) of the logits' order bits instead of a comparator sort, ~10x faster
 * over a 150k vocabulary, where a row without a cut sorts whole. p is monotone in the logit, so
 * this is cmp's order once runs of equal p (exp rounding distinct logits to one value) are put in
 * id order; the result is checked pair by pair against cmp, and false (the caller sorts with
 * cmp) where it differs or the row is not float32.
 */
function sortAllFast(logits: ArrayLike<number>, offset: number, vocab: number, prob: Float64Array, idx: Int32Array, cmp: (a: number, b: number) => number): boolean {
  if (!(logits instanceof Float32Array)) return false;
  if (radix.keys.length < vocab) radix = { keys: new Uint32Array(vocab), keys2: new Uint32Array(vocab), ids2: new Int32Array(vocab), counts: radix.counts };
  let { keys, keys2 } = radix;
  const counts = radix.counts;
  let ids: Int32Array = idx;
  let ids2: Int32Array = radix.ids2;
  for (let i = 0; i < vocab; i++) {
    keyFloat[0] = logits[offset + i];
    const b = keyBits[0];
    // IEEE order as unsigned integers (negatives flipped whole, positives with the sign bit set),
    // inverted so that larger logits come first.
    keys[i] = ~(b & 0x80000000 ? ~b : b | 0x80000000) >>> 0;
    ids[i] = i;
  }
  for (let shift = 0; shift < 32; shift += 11) {
    counts.fill(0);
    for (let i = 0; i < vocab; i++) counts[(keys[i] >>> shift) & 2047]++;
    for (let d = 0, at = 0; d < 2048; d++) {
      const c = counts[d];
      counts[d] = at;
      at += c;
    }
    for (let i = 0; i < vocab; i++) {
      const at = counts[(keys[i] >>> shift) & 2047]++;
      keys2[at] = keys[i];
      ids2[at] = ids[i];
    }
    [keys, keys2] = [keys2, keys];
    [ids, ids2] = [ids2, ids];
  }
  // Three passes: the sorted ids are in the spare buffer; bring them into idx.
  if (ids !== idx) idx.set(ids.subarray(0, vocab));
  for (let a = 0; a < vocab; ) {
    let e = a + 1;
    while (e < vocab && prob[idx[e]] === prob[idx[a]]) e++;
    if (e - a > 1) idx.subarray(a, e).sort();
    a = e;
  }
  for (let j = 0; j + 1 < vocab; j++) if (cmp(idx[j], idx[j + 1]) >= 0) return false;
  return true;
}

/** Sorted prefix tried first when a topP or minP cut bounds the candidates (grown 8x as needed). */
const FIRST_PREFIX = 1024;

/**
 * Partial selection (quickselect): reorder idx[0, len) so that its first `k` entries are the k
 * smallest under `cmp` (in any order). `cmp` must be a total order (no two entries equal).
 */
function selectTop(idx: Int32Array, len: number, k: number, cmp: (a: number, b: number) => number): void {
  let lo = 0;
  let hi = len - 1;
  while (lo < hi) {
    // Median of three as the pivot keeps sorted and reversed rows linear.
    const mid = (lo + hi) >>> 1;
    if (cmp(idx[mid], idx[lo]) < 0) swap(idx, mid, lo);
    if (cmp(idx[hi], idx[lo]) < 0) swap(idx, hi, lo);
    if (cmp(idx[hi], idx[mid]) < 0) swap(idx, hi, mid);
    const pivot = idx[mid];
    let i = lo;
    let j = hi;
    while (i <= j) {
      while (cmp(idx[i], pivot) < 0) i++;
      while (cmp(idx[j], pivot) > 0) j--;
      if (i <= j) {
        swap(idx, i, j);
        i++;
        j--;
      }
    }
    if (k - 1 <= j) hi = j;
    else if (k - 1 >= i) lo = i;
    else return;
  }
}

function swap(a: Int32Array, i: number, j: number): void {
  const t = a[i];
  a[i] = a[j];
  a[j] = t;
}
