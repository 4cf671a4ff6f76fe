/**
 * Decoding of ggml's 256-element super-block formats (the "K-quants"), value for value as ggml's
 * `dequantize_row_*` computes them in f32.
 *
 * Layouts (little-endian):
 * - Q2_K (84 B): 16 scale bytes (low nibble: scale, high nibble: min, one per 16 elements),
 *   64 bytes of 2-bit quants, f16 d, f16 dmin. Value `(d*sc) * q - (dmin*m)`.
 * - Q3_K (110 B): 32 bytes hmask, 64 bytes of 2-bit quants, 12 bytes of sixteen 6-bit scales
 *   (biased by 32), f16 d. The hmask bit, when clear, subtracts 4. Value `(d*(sc-32)) * q`.
 * - Q4_K (144 B): f16 d, f16 dmin, 12 bytes of eight 6-bit scale/min pairs, 128 bytes of nibbles.
 * - Q5_K (176 B): as Q4_K with 32 bytes qh (bit 4 of each quant) before the nibbles.
 * - Q6_K (210 B): 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 signed scales, f16 d.
 *
 * In the 2/3-bit types a byte of quants holds four elements 32 apart (bit pair `2*j` belongs to
 * the j-th run of 32 in its 128-element half); in Q4_K/Q5_K a byte holds two elements 32 apart.
 */
import { fr, halfAt } from './scalars.js';

/** Scale and min `j` (0..7) of a Q4_K/Q5_K block's 12 packed bytes at `o`, as [scale, min]. */
export function scaleMinK4(src: Uint8Array, o: number, j: number): [number, number] {
  if (j < 4) return [src[o + j] & 63, src[o + j + 4] & 63];
  return [(src[o + j + 4] & 15) | ((src[o + j - 4] >> 6) << 4), (src[o + j + 4] >> 4) | ((src[o + j] >> 6) << 4)];
}

/** Six-bit scale `j` (0..15) of a Q3_K block's 12 packed bytes at `o`, unbiased (-32..31). */
export function scaleK3(src: Uint8Array, o: number, j: number): number {
  const low = j < 8 ? src[o + j] & 15 : src[o + j - 8] >> 4;
  const high = (src[o + 8 + (j & 3)] >> (2 * (j >> 2))) & 3;
  return (low | (high << 4)) - 32;
}

export function decodeQ2_K(src: Uint8Array, blocks: number, dst: Float32Array): void {
  for (let b = 0, o = 0, y = 0; b < blocks; b++, o += 84, y += 256) {
    const d = halfAt(src, o + 80);
    const dmin = halfAt(src, o + 82);
    for (let s = 0; s < 16; s++) {
      const sc = src[o + s];
      const dl = fr(d * (sc & 15));
      const ml = fr(dmin * (sc >> 4));
      // Run of 16 `s`: half h = s>>3, shift pair j = (s>>1)&3, byte half (s&1).
      const qo = o + 16 + 32 * (s >> 3) + 16 * (s & 1);
      const shift = 2 * ((s >> 1) & 3);
      const yo = y + 16 * s;
      for (let l = 0; l < 16; l++) dst[yo + l] = fr(dl * ((src[qo + l] >> shift) & 3)) - ml;
    }
  }
}

export function decodeQ3_K(src: Uint8Array, blocks: number, dst: Float32Array): void {
  for (let b = 0, o = 0, y = 0; b < blocks; b++, o += 110, y += 256) {
    const d = halfAt(src, o + 108);
    for (let s = 0; s < 16; s++) {
      const dl = fr(d * scaleK3(src, o + 96, s));
      const half = s >> 3;
      const j = (s >> 1) & 3;
      const shift = 2 * j;
      const bit = 1 << (4 * half + j);
      const lo = 16 * (s & 1);
      const qo = o + 32 + 32 * half + lo;
      const ho = o + lo;
      const yo = y + 16 * s;
      for (let l = 0; l < 16; l++) {
        const q = ((src[qo + l] >> shift) & 3) - (src[ho + l] & bit ? 0 : 4);
        dst[yo + l] = dl * q;
      }
    }
  }
}

export function decodeQ4_K(src: Uint8Array, blocks: number, dst: Float32Array): void {
  decodeK45(src, blocks, dst, false);
}

export function decodeQ5_K(src: Uint8Array, blocks: number, dst: Float32Array): void {
  decodeK45(src, blocks, dst, true);
}

/**
 * Q4_K and Q5_K share a layout (d, dmin, 12 bytes of 6-bit scales and mins, then the quants):
 * Q5_K adds 32 bytes of high bits (bit j of byte l: element l of sub-block j) before its 4-bit
 * quants. Each element is fr(d_j * q) - fr(dmin * m_j), ggml's float arithmetic.
 */
function decodeK45(src: Uint8Array, blocks: number, dst: Float32Array, five: boolean): void {
  const bytes = five ? 176 : 144;
  const qs = five ? 48 : 16;
  for (let b = 0, o = 0, y = 0; b < blocks; b++, o += bytes, y += 256) {
    const d = halfAt(src, o);
    const dmin = halfAt(src, o + 2);
    for (let j = 0; j < 4; j++) {
      const [s1, m1] = scaleMinK4(src, o + 4, 2 * j);
      const [s2, m2] = scaleMinK4(src, o + 4, 2 * j + 1);
      const d1 = fr(d * s1);
      const n1 = fr(dmin * m1);
      const d2 = fr(d * s2);
      const n2 = fr(dmin * m2);
      const qo = o + qs + 32 * j;
      const yo = y + 64 * j;
      for (let l = 0; l < 32; l++) {
        const q = src[qo + l];
        const h = five ? src[o + 16 + l] >> (2 * j) : 0;
        dst[yo + l] = fr(d1 * ((q & 15) | ((h & 1) << 4))) - n1;
        dst[yo + 32 + l] = fr(d2 * ((q >> 4) | ((h & 2) << 3))) - n2;
      }
    }
  }
}

export function decodeQ6_K(src: Uint8Array, blocks: number, dst: Float32Array): void {
  for (let b = 0, o = 0, y = 0; b < blocks; b++, o += 210, y += 256) {
    const d = halfAt(src, o + 208);
    for (let h = 0; h < 2; h++) {
      const ql = o + 64 * h;
      const qh = o + 128 + 32 * h;
      const sc = o + 192 + 8 * h;
      const yo = y + 128 * h;
      for (let r = 0; r < 4; r++) {
        // Run r of 32: low nibble of ql[l] (r=0), of ql[l+32] (r=1), high nibbles (r=2, 3);
        // its two high bits are pair r of qh[l].
        const lo = ql + 32 * (r & 1);
        const nib = 4 * (r >> 1);
        for (let part = 0; part < 2; part++) {
          const dl = fr(d * ((src[sc + 2 * r + part] << 24) >> 24));
          for (let l = 16 * part; l < 16 * part + 16; l++) {
            const q = (((src[lo + l] >> nib) & 15) | (((src[qh + l] >> (2 * r)) & 3) << 4)) - 32;
            dst[yo + 32 * r + l] = dl * q;
          }
        }
      }
    }
  }
}
