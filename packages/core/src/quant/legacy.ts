/**
 * ggml's 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.
 *
 * Layouts (little-endian, one block after another):
 * - Q4_0 (18 B): f16 d, 16 bytes of nibbles; element j is the low nibble of byte j and element
 *   j+16 the high nibble, value `(q - 8) * d`.
 * - Q4_1 (20 B): f16 d, f16 m, nibbles as Q4_0, value `q * d + m`.
 * - Q5_0 (22 B): f16 d, u32 qh, nibbles; bit j of qh is bit 4 of element j, value `(q - 16) * d`.
 * - Q5_1 (24 B): f16 d, f16 m, u32 qh, nibbles, value `q * d + m`.
 * - Q8_0 (34 B): f16 d, 32 signed bytes, value `q * d`.
 *
 * Every product and sum is rounded to f32 once, as ggml's C does: the Float32Array store rounds a
 * single exact double result, `fr` rounds the intermediate ones.
 */
import { fr, halfAt, putHalf, roundAway, signedAbsMax } from './scalars.js';

export function decodeQ4_0(src: Uint8Array, blocks: number, dst: Float32Array): void {
  for (let b = 0, o = 0, y = 0; b < blocks; b++, o += 18, y += 32) {
    const d = halfAt(src, o);
    for (let j = 0; j < 16; j++) {
      const q = src[o + 2 + j];
      dst[y + j] = ((q & 15) - 8) * d;
      dst[y + j + 16] = ((q >> 4) - 8) * d;
    }
  }
}

export function decodeQ4_1(src: Uint8Array, blocks: number, dst: Float32Array): void {
  for (let b = 0, o = 0, y = 0; b < blocks; b++, o += 20, y += 32) {
    const d = halfAt(src, o);
    const m = halfAt(src, o + 2);
    for (let j = 0; j < 16; j++) {
      const q = src[o + 4 + j];
      dst[y + j] = fr((q & 15) * d) + m;
      dst[y + j + 16] = fr((q >> 4) * d) + m;
    }
  }
}

function u32At(src: Uint8Array, o: number): number {
  return (src[o] | (src[o + 1] << 8) | (src[o + 2] << 16) | (src[o + 3] << 24)) >>> 0;
}

export function decodeQ5_0(src: Uint8Array, blocks: number, dst: Float32Array): void {
  for (let b = 0, o = 0, y = 0; b < blocks; b++, o += 22, y += 32) {
    const d = halfAt(src, o);
    const qh = u32At(src, o + 2);
    for (let j = 0; j < 16; j++) {
      const q = src[o + 6 + j];
      dst[y + j] = (((q & 15) | (((qh >>> j) & 1) << 4)) - 16) * d;
      dst[y + j + 16] = (((q >> 4) | (((qh >>> (j + 16)) & 1) << 4)) - 16) * d;
    }
  }
}

export function decodeQ5_1(src: Uint8Array, blocks: number, dst: Float32Array): void {
  for (let b = 0, o = 0, y = 0; b < blocks; b++, o += 24, y += 32) {
    const d = halfAt(src, o);
    const m = halfAt(src, o + 2);
    const qh = u32At(src, o + 4);
    for (let j = 0; j < 16; j++) {
      const q = src[o + 8 + j];
      dst[y + j] = fr(((q & 15) | (((qh >>> j) & 1) << 4)) * d) + m;
      dst[y + j + 16] = fr(((q >> 4) | (((qh >>> (j + 16)) & 1) << 4)) * d) + m;
    }
  }
}

export function decodeQ8_0(src: Uint8Array, blocks: number, dst: Float32Array): void {
  for (let b = 0, o = 0, y = 0; b < blocks; b++, o += 34, y += 32) {
    const d = halfAt(src, o);
    for (let j = 0; j < 32; j++) dst[y + j] = ((src[o + 2 + j] << 24) >> 24) * d;
  }
}

/** Symmetric 4-bit: d = max / -8 so the extreme value maps to level 0 exactly. */
export function encodeQ4_0(x: Float32Array, blocks: number, out: Uint8Array): void {
  for (let b = 0, o = 0, xo = 0; b < blocks; b++, o += 18, xo += 32) {
    const d = fr(signedAbsMax(x, xo, 32) / -8);
    const id = d ? fr(1 / d) : 0;
    putHalf(out, o, d);
    for (let j = 0; j < 16; j++) {
      const q0 = Math.min(15, Math.trunc(fr(fr(x[xo + j] * id) + 8.5)));
      const q1 = Math.min(15, Math.trunc(fr(fr(x[xo + j + 16] * id) + 8.5)));
      out[o + 2 + j] = q0 | (q1 << 4);
    }
  }
}

function minMax(x: Float32Array, o: number): [number, number] {
  let min = Infinity;
  let max = -Infinity;
  for (let j = o; j < o + 32; j++) {
    const v = x[j];
    if (v < min) min = v;
    if (v > max) max = v;
  }
  return [min, max];
}

export function encodeQ4_1(x: Float32Array, blocks: number, out: Uint8Array): void {
  for (let b = 0, o = 0, xo = 0; b < blocks; b++, o += 20, xo += 32) {
    const [min, max] = minMax(x, xo);
    const d = fr(fr(max - min) / 15);
    const id = d ? fr(1 / d) : 0;
    putHalf(out, o, d);
    putHalf(out, o + 2, min);
    for (let j = 0; j < 16; j++) {
      const q0 = Math.min(15, Math.trunc(fr(fr(fr(x[xo + j] - min) * id) + 0.5)));
      const q1 = Math.min(15, Math.trunc(fr(fr(fr(x[xo + j + 16] - min) * id) + 0.5)));
      out[o + 4 + j] = q0 | (q1 << 4);
    }
  }
}

function putU32(out: Uint8Array, o: number, v: number): void {
  out[o] = v & 0xff;
  out[o + 1] = (v >>> 8) & 0xff;
  out[o + 2] = (v >>> 16) & 0xff;
  out[o + 3] = v >>> 24;
}

export function encodeQ5_0(x: Float32Array, blocks: number, out: Uint8Array): void {
  for (let b = 0, o = 0, xo = 0; b < blocks; b++, o += 22, xo += 32) {
    const d = fr(signedAbsMax(x, xo, 32) / -16);
    const id = d ? fr(1 / d) : 0;
    putHalf(out, o, d);
    let qh = 0;
    for (let j = 0; j < 16; j++) {
      const q0 = Math.min(31, Math.trunc(fr(fr(x[xo + j] * id) + 16.5)));
      const q1 = Math.min(31, Math.trunc(fr(fr(x[xo + j + 16] * id) + 16.5)));
      out[o + 6 + j] = (q0 & 15) | ((q1 & 15) << 4);
      qh |= ((q0 >> 4) << j) | ((q1 >> 4) << (j + 16));
    }
    putU32(out, o + 2, qh >>> 0);
  }
}

export function encodeQ5_1(x: Float32Array, blocks: number, out: Uint8Array): void {
  for (let b = 0, o = 0, xo = 0; b < blocks; b++, o += 24, xo += 32) {
    const [min, max] = minMax(x, xo);
    const d = fr(fr(max - min) / 31);
    const id = d ? fr(1 / d) : 0;
    putHalf(out, o, d);
    putHalf(out, o + 2, min);
    let qh = 0;
    for (let j = 0; j < 16; j++) {
      // ggml truncates to uint8 without a clamp; the level cannot exceed 31 here.
      const q0 = Math.trunc(fr(fr(fr(x[xo + j] - min) * id) + 0.5)) & 0xff;
      const q1 = Math.trunc(fr(fr(fr(x[xo + j + 16] - min) * id) + 0.5)) & 0xff;
      out[o + 8 + j] = (q0 & 15) | ((q1 & 15) << 4);
      qh |= (((q0 >> 4) & 1) << j) | (((q1 >> 4) & 1) << (j + 16));
    }
    putU32(out, o + 4, qh >>> 0);
  }
}

export function encodeQ8_0(x: Float32Array, blocks: number, out: Uint8Array): void {
  for (let b = 0, o = 0, xo = 0; b < blocks; b++, o += 34, xo += 32) {
    let amax = 0;
    for (let j = xo; j < xo + 32; j++) {
      const a = Math.abs(x[j]);
      if (!(amax > a)) amax = a;
    }
    const d = fr(amax / 127);
    const id = d ? fr(1 / d) : 0;
    putHalf(out, o, d);
    for (let j = 0; j < 32; j++) out[o + 2 + j] = roundAway(fr(x[xo + j] * id)) & 0xff;
  }
}
