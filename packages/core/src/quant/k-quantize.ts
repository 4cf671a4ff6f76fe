/**
 * llama.cpp's reference quantization (`quantize_row_*_ref`, no importance matrix) for the
 * K-quants: per sub-block scale (and min) searches, the scales themselves quantized to 6 or 8 bits
 * against an f16 super-block scale, then every value requantized against the scale as stored.
 */
import { makeQ3Quants, makeQkx2Quants, makeQxQuants, GROUP_MAX_EPS, qkx2 } from './k-search.js';
import { scaleK3, scaleMinK4 } from './k-dequant.js';
import { fr, nearestInt, putHalf, signedAbsMax } from './scalars.js';

// Scratch for one super-block; the codecs are synchronous, so module-level buffers are safe.
const L = new Uint8Array(256);
const Laux = new Uint8Array(32);
const weights = new Float32Array(32);
const scales = new Float32Array(16);
const mins = new Float32Array(16);
const TENTH = fr(0.1);

/** Sub-block searches shared by Q4_K and Q5_K (8 groups of 32, weights av|x| + |x|). */
function searchK32(x: Float32Array, xo: number, nmax: number, rmin: number, nstep: number): [number, number] {
  let maxScale = 0;
  let maxMin = 0;
  for (let j = 0; j < 8; j++) {
    const go = xo + 32 * j;
    let sumX2 = 0;
    for (let l = 0; l < 32; l++) sumX2 = fr(sumX2 + fr(x[go + l] * x[go + l]));
    const avX = fr(Math.sqrt(fr(sumX2 / 32)));
    for (let l = 0; l < 32; l++) weights[l] = avX + Math.abs(x[go + l]);
    const scale = makeQkx2Quants(32, nmax, x, go, weights, L, 32 * j, Laux, rmin, TENTH, nstep, false);
    scales[j] = scale;
    mins[j] = qkx2.min;
    if (scale > maxScale) maxScale = scale;
    if (mins[j] > maxMin) maxMin = mins[j];
  }
  return [maxScale, maxMin];
}

/**
 * Packs eight 6-bit (scale, min) pairs into Q4_K/Q5_K's 12 bytes at `so`, stores d and dmin at
 * `o`, then requantizes every value to 0..nmax against the stored scales.
 */
function packK32(x: Float32Array, xo: number, out: Uint8Array, o: number, so: number, nmax: number, maxScale: number, maxMin: number): void {
  const invScale = maxScale > 0 ? fr(63 / maxScale) : 0;
  const invMin = maxMin > 0 ? fr(63 / maxMin) : 0;
  for (let j = 0; j < 8; j++) {
    const ls = Math.min(63, nearestInt(fr(invScale * scales[j])) & 0xff);
    const lm = Math.min(63, nearestInt(fr(invMin * mins[j])) & 0xff);
    if (j < 4) {
      out[so + j] = ls;
      out[so + j + 4] = lm;
    } else {
      out[so + j + 4] = (ls & 15) | ((lm & 15) << 4);
      out[so + j - 4] |= (ls >> 4) << 6;
      out[so + j] |= (lm >> 4) << 6;
    }
  }
  const d = putHalf(out, o, fr(maxScale / 63));
  const dmin = putHalf(out, o + 2, fr(maxMin / 63));
  for (let j = 0; j < 8; j++) {
    const [sc, m] = scaleMinK4(out, so, j);
    const dj = fr(d * sc);
    if (!dj) continue;
    const dm = fr(dmin * m);
    for (let i = 0, go = xo + 32 * j; i < 32; i++) {
      L[32 * j + i] = Math.max(0, Math.min(nmax, nearestInt(fr(fr(x[go + i] + dm) / dj))));
    }
  }
}

export function encodeQ4_K(x: Float32Array, blocks: number, out: Uint8Array): void {
  for (let b = 0, o = 0, xo = 0; b < blocks; b++, o += 144, xo += 256) {
    const [maxScale, maxMin] = searchK32(x, xo, 15, -1, 20);
    packK32(x, xo, out, o, o + 4, 15, maxScale, maxMin);
    for (let j = 0; j < 4; j++) {
      const qo = o + 16 + 32 * j;
      for (let l = 0; l < 32; l++) out[qo + l] = L[64 * j + l] | (L[64 * j + l + 32] << 4);
    }
  }
}

export function encodeQ5_K(x: Float32Array, blocks: number, out: Uint8Array): void {
  for (let b = 0, o = 0, xo = 0; b < blocks; b++, o += 176, xo += 256) {
    const [maxScale, maxMin] = searchK32(x, xo, 31, -0.5, 15);
    packK32(x, xo, out, o, o + 4, 31, maxScale, maxMin);
    out.fill(0, o + 16, o + 48);
    for (let j = 0; j < 4; j++) {
      const qo = o + 48 + 32 * j;
      for (let l = 0; l < 32; l++) {
        const l1 = L[64 * j + l];
        const l2 = L[64 * j + l + 32];
        out[qo + l] = (l1 & 15) | ((l2 & 15) << 4);
        out[o + 16 + l] |= ((l1 >> 4) << (2 * j)) | ((l2 >> 4) << (2 * j + 1));
      }
    }
  }
}

export function encodeQ6_K(x: Float32Array, blocks: number, out: Uint8Array): void {
  for (let b = 0, o = 0, xo = 0; b < blocks; b++, o += 210, xo += 256) {
    for (let g = 0; g < 16; g++) scales[g] = makeQxQuants(16, 32, x, xo + 16 * g, L, 16 * g);
    const maxScale = signedAbsMax(scales, 0, 16);
    if (Math.abs(maxScale) < GROUP_MAX_EPS) {
      out.fill(0, o, o + 210);
      continue;
    }
    const iscale = fr(-128 / maxScale);
    const d = putHalf(out, o + 208, fr(1 / iscale));
    for (let g = 0; g < 16; g++) out[o + 192 + g] = Math.min(127, nearestInt(fr(iscale * scales[g]))) & 0xff;
    for (let g = 0; g < 16; g++) {
      const dg = fr(d * ((out[o + 192 + g] << 24) >> 24));
      if (!dg) continue;
      for (let i = 0, go = xo + 16 * g; i < 16; i++) {
        L[16 * g + i] = Math.max(-32, Math.min(31, nearestInt(fr(x[go + i] / dg)))) + 32;
      }
    }
    for (let h = 0; h < 2; h++) {
      const ql = o + 64 * h;
      const qh = o + 128 + 32 * h;
      const lb = 128 * h;
      for (let l = 0; l < 32; l++) {
        const q1 = L[lb + l];
        const q2 = L[lb + l + 32];
        const q3 = L[lb + l + 64];
        const q4 = L[lb + l + 96];
        out[ql + l] = (q1 & 15) | ((q3 & 15) << 4);
        out[ql + l + 32] = (q2 & 15) | ((q4 & 15) << 4);
        out[qh + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
      }
    }
  }
}

/** Four 2-bit levels 32 apart per byte, per 128-element half (Q2_K and Q3_K's low bits). */
function pack2Bit(out: Uint8Array, qo: number): void {
  for (let h = 0; h < 2; h++) {
    for (let l = 0; l < 32; l++) {
      const j = 128 * h + l;
      out[qo + 32 * h + l] = L[j] | (L[j + 32] << 2) | (L[j + 64] << 4) | (L[j + 96] << 6);
    }
  }
}

export function encodeQ2_K(x: Float32Array, blocks: number, out: Uint8Array): void {
  const Laux16 = Laux.subarray(0, 16);
  for (let b = 0, o = 0, xo = 0; b < blocks; b++, o += 84, xo += 256) {
    let maxScale = 0;
    let maxMin = 0;
    for (let g = 0; g < 16; g++) {
      for (let l = 0; l < 16; l++) weights[l] = Math.abs(x[xo + 16 * g + l]);
      const scale = makeQkx2Quants(16, 3, x, xo + 16 * g, weights, L, 16 * g, Laux16, -0.5, TENTH, 15, true);
      scales[g] = scale;
      mins[g] = qkx2.min;
      if (scale > maxScale) maxScale = scale;
      if (mins[g] > maxMin) maxMin = mins[g];
    }
    let d = 0;
    if (maxScale > 0) {
      const iscale = fr(15 / maxScale);
      for (let g = 0; g < 16; g++) out[o + g] = nearestInt(fr(iscale * scales[g])) & 0xff;
      d = putHalf(out, o + 80, fr(maxScale / 15));
    } else {
      out.fill(0, o, o + 16);
      putHalf(out, o + 80, 0);
    }
    let dmin = 0;
    if (maxMin > 0) {
      const iscale = fr(15 / maxMin);
      for (let g = 0; g < 16; g++) out[o + g] |= nearestInt(fr(iscale * mins[g])) << 4;
      dmin = putHalf(out, o + 82, fr(maxMin / 15));
    } else {
      putHalf(out, o + 82, 0);
    }
    for (let g = 0; g < 16; g++) {
      const dg = fr(d * (out[o + g] & 15));
      if (!dg) continue;
      const dm = fr(dmin * (out[o + g] >> 4));
      for (let i = 0, go = xo + 16 * g; i < 16; i++) {
        L[16 * g + i] = Math.max(0, Math.min(3, nearestInt(fr(fr(x[go + i] + dm) / dg))));
      }
    }
    pack2Bit(out, o + 16);
  }
}

export function encodeQ3_K(x: Float32Array, blocks: number, out: Uint8Array): void {
  for (let b = 0, o = 0, xo = 0; b < blocks; b++, o += 110, xo += 256) {
    for (let g = 0; g < 16; g++) scales[g] = makeQ3Quants(16, 4, x, xo + 16 * g, L, 16 * g);
    const maxScale = signedAbsMax(scales, 0, 16);
    const so = o + 96;
    out.fill(0, so, so + 12);
    let d = 0;
    if (maxScale) {
      const iscale = fr(-32 / maxScale);
      for (let g = 0; g < 16; g++) {
        // ggml narrows to int8 before clamping; the level is within -33..33 here anyway.
        const l = Math.max(-32, Math.min(31, (nearestInt(fr(iscale * scales[g])) << 24) >> 24)) + 32;
        if (g < 8) out[so + g] = l & 15;
        else out[so + g - 8] |= (l & 15) << 4;
        out[so + 8 + (g & 3)] |= (l >> 4) << (2 * (g >> 2));
      }
      d = putHalf(out, o + 108, fr(1 / iscale));
    } else {
      putHalf(out, o + 108, 0);
    }
    for (let g = 0; g < 16; g++) {
      const dg = fr(d * scaleK3(out, so, g));
      if (!dg) continue;
      for (let i = 0, go = xo + 16 * g; i < 16; i++) {
        L[16 * g + i] = Math.max(-4, Math.min(3, nearestInt(fr(x[go + i] / dg)))) + 4;
      }
    }
    out.fill(0, o, o + 32);
    for (let j = 0; j < 256; j++) {
      if (L[j] > 3) {
        out[o + (j & 31)] |= 1 << (j >> 5);
        L[j] -= 4;
      }
    }
    pack2Bit(out, o + 32);
  }
}
