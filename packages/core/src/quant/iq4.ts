/**
 * ggml's non-linear 4-bit formats: IQ4_NL and IQ4_XS. Each 4-bit index picks one of sixteen
 * fixed levels (denser near zero than Q4_0's even steps), times a block scale.
 *
 * Layouts (little-endian, one block after another):
 * - IQ4_NL (18 B, 32 elements): f16 d, 16 bytes of indices; element j is the low nibble of byte j
 *   and element j+16 the high nibble, value `d * LEVELS[q]`.
 * - IQ4_XS (136 B, 256 elements): f16 d, u16 scales_h, 4 bytes scales_l, 128 bytes of indices in
 *   eight groups of 32 laid out as IQ4_NL's. Group g's 6-bit scale is the g-th nibble of scales_l
 *   (low nibble first) with bits 2g..2g+1 of scales_h above it, biased by 32: value
 *   `d * (scale - 32) * LEVELS[q]`.
 *
 * Quantization is llama.cpp's without an importance matrix (`quantize_iq4_nl` / `quantize_iq4_xs`
 * with no weights: each element weighted by its square, seven scale trials either side of the
 * largest magnitude's), in float32 operations as its C code performs them.
 */
import { GROUP_MAX_EPS } from './k-search.js';
import { fr, halfAt, nearestInt, putHalf } from './scalars.js';

/** The sixteen levels of an index (ggml's kvalues_iq4nl). */
const LEVELS = Int8Array.of(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);

/** Trials of the scale search on each side of the first guess. */
const TRIES = 7;

export function decodeIQ4_NL(src: Uint8Array, blocks: number, dst: Float32Array): void {
  for (let b = 0, o = 0, y = 0; b < blocks; b++, o += 18, y += 32) {
    const d = halfAt(src, o);
    for (let j = 0; j < 16; j++) {
      const q = src[o + 2 + j];
      dst[y + j] = d * LEVELS[q & 15];
      dst[y + j + 16] = d * LEVELS[q >> 4];
    }
  }
}

export function decodeIQ4_XS(src: Uint8Array, blocks: number, dst: Float32Array): void {
  for (let b = 0, o = 0, y = 0; b < blocks; b++, o += 136) {
    const d = halfAt(src, o);
    const scalesH = src[o + 2] | (src[o + 3] << 8);
    for (let g = 0; g < 8; g++, y += 32) {
      const ls = ((src[o + 4 + (g >> 1)] >> (4 * (g & 1))) & 15) | (((scalesH >> (2 * g)) & 3) << 4);
      const dl = fr(d * (ls - 32));
      const qo = o + 8 + 16 * g;
      for (let j = 0; j < 16; j++) {
        const q = src[qo + j];
        dst[y + j] = dl * LEVELS[q & 15];
        dst[y + j + 16] = dl * LEVELS[q >> 4];
      }
    }
  }
}

/** The level nearest `x` (ggml's best_index_int8: the lower one on a tie). */
function nearestLevel(x: number): number {
  if (x <= LEVELS[0]) return 0;
  if (x >= LEVELS[15]) return 15;
  let lo = 0;
  let hi = 15;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (x < LEVELS[mid]) hi = mid;
    else lo = mid;
  }
  return fr(x - LEVELS[hi - 1]) < fr(LEVELS[hi] - x) ? hi - 1 : hi;
}

/**
 * Sums of w·q·x and w·q·q (w = x², q the level nearest x·id) over x[o..o+32), in float32 as
 * ggml adds them.
 */
function levelSums(x: Float32Array, o: number, id: number): [number, number] {
  let sumqx = 0;
  let sumq2 = 0;
  for (let j = 0; j < 32; j++) {
    const xj = x[o + j];
    const l = nearestLevel(fr(id * xj));
    const wq = fr(fr(xj * xj) * LEVELS[l]);
    sumqx = fr(sumqx + fr(wq * xj));
    sumq2 = fr(sumq2 + fr(wq * LEVELS[l]));
  }
  return [sumqx, sumq2];
}

/** The best scale of the 32 values at x[o..] (0 for an all-zero group). */
function groupScale(x: Float32Array, o: number): number {
  let amax = 0;
  let max = 0;
  for (let j = 0; j < 32; j++) {
    const a = Math.abs(x[o + j]);
    if (a > amax) {
      amax = a;
      max = x[o + j];
    }
  }
  if (amax < GROUP_MAX_EPS) return 0;
  let d = fr(-max / LEVELS[0]);
  let [sumqx, sumq2] = levelSums(x, o, fr(1 / d));
  d = fr(sumqx / sumq2);
  let best = fr(d * sumqx);
  for (let t = -TRIES; t <= TRIES; t++) {
    [sumqx, sumq2] = levelSums(x, o, fr((t + LEVELS[0]) / max));
    if (sumq2 > 0 && fr(sumqx * sumqx) > fr(best * sumq2)) {
      d = fr(sumqx / sumq2);
      best = fr(d * sumqx);
    }
  }
  return d;
}

/** Indices of x[o..o+32) against scale `id` (an inverse scale), packed as nibbles at out[q..]. */
function packIndices(x: Float32Array, o: number, id: number, out: Uint8Array, q: number): void {
  for (let j = 0; j < 16; j++) out[q + j] = nearestLevel(fr(id * x[o + j])) | (nearestLevel(fr(id * x[o + j + 16])) << 4);
}

export function encodeIQ4_NL(x: Float32Array, blocks: number, out: Uint8Array): void {
  for (let b = 0; b < blocks; b++) {
    const o = 18 * b;
    const d = groupScale(x, 32 * b);
    putHalf(out, o, d);
    // The indices are chosen again against the scale found (not its f16 rounding).
    packIndices(x, 32 * b, d ? fr(1 / d) : 0, out, o + 2);
  }
}

export function encodeIQ4_XS(x: Float32Array, blocks: number, out: Uint8Array): void {
  const scales = new Float32Array(8);
  for (let b = 0; b < blocks; b++) {
    const o = 136 * b;
    const xo = 256 * b;
    let maxScale = 0;
    let amaxScale = 0;
    for (let g = 0; g < 8; g++) {
      const s = groupScale(x, xo + 32 * g);
      scales[g] = s;
      if (Math.abs(s) > amaxScale) {
        amaxScale = Math.abs(s);
        maxScale = s;
      }
    }
    const d = fr(-maxScale / 32);
    putHalf(out, o, d);
    const id = d ? fr(1 / d) : 0;
    let scalesH = 0;
    out.fill(0, o + 4, o + 8);
    for (let g = 0; g < 8; g++) {
      const l = Math.max(-32, Math.min(31, nearestInt(fr(id * scales[g]))));
      const dl = fr(d * l);
      packIndices(x, xo + 32 * g, dl ? fr(1 / dl) : 0, out, o + 8 + 16 * g);
      const biased = l + 32;
      out[o + 4 + (g >> 1)] |= (biased & 15) << (4 * (g & 1));
      scalesH |= (biased >> 4) << (2 * g);
    }
    out[o + 2] = scalesH & 0xff;
    out[o + 3] = scalesH >> 8;
  }
}
