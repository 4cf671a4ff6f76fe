/**
 * The scale searches behind llama.cpp's reference K-quant rounding (no importance matrix). Each
 * mirrors ggml's float32 arithmetic step by step (`fr` after every operation, the same operation
 * order), because a search that compares errors picks a different candidate on the slightest
 * difference, and then the bytes differ.
 */
import { fr, nearestInt, signedAbsMax } from './scalars.js';

/** ggml's GROUP_MAX_EPS: a group whose largest magnitude is below this counts as all zero. */
export const GROUP_MAX_EPS = fr(1e-15);

// Scratch for one group at a time (the codecs are synchronous, so module-level buffers are safe):
// a group's values and those values less the current min (f32, as ggml holds them), and the
// unbiased levels of the Q3_K search.
const xsub = new Float32Array(32);
const xshift = new Float32Array(32);
const q3Levels = new Int32Array(16);

/** Out-parameter of `makeQkx2Quants`: the (positive) offset that is subtracted back on decode. */
export const qkx2 = { min: 0 };

/**
 * Asymmetric search (make_qkx2_quants): levels 0..nmax of x[xo..xo+n) against `scale*l - min`,
 * trying `nstep+1` candidate inverse scales around nmax/(max-min) and keeping the one with the
 * least weighted error (squared, or absolute with `useMad`). Writes levels to L[lo..lo+n), the
 * offset to `qkx2.min`, returns the scale.
 */
export function makeQkx2Quants(
  n: number,
  nmax: number,
  x: Float32Array,
  xo: number,
  weights: Float32Array,
  L: Uint8Array,
  lo: number,
  Laux: Uint8Array,
  rmin: number,
  rdelta: number,
  nstep: number,
  useMad: boolean,
): number {
  const xs = xsub;
  const xm = xshift;
  let min = x[xo];
  let max = x[xo];
  let sumW = weights[0];
  let sumX = fr(sumW * x[xo]);
  xs[0] = x[xo];
  for (let i = 1; i < n; i++) {
    const v = x[xo + i];
    xs[i] = v;
    if (v < min) min = v;
    if (v > max) max = v;
    const w = weights[i];
    sumW = fr(sumW + w);
    sumX = fr(sumX + fr(w * v));
  }
  if (min > 0) min = 0;
  if (max === min) {
    L.fill(0, lo, lo + n);
    qkx2.min = -min;
    return 0;
  }
  let iscale = fr(nmax / fr(max - min));
  let scale = fr(1 / iscale);
  let bestError = 0;
  for (let i = 0; i < n; i++) {
    const v = xs[i];
    xm[i] = v - min; // the Float32Array store rounds, as C's float subtraction does
    let l = nearestInt(fr(iscale * xm[i]));
    l = l < 0 ? 0 : l > nmax ? nmax : l;
    L[lo + i] = l;
    let diff = fr(fr(fr(scale * l) + min) - v);
    diff = useMad ? Math.abs(diff) : fr(diff * diff);
    bestError = fr(bestError + fr(weights[i] * diff));
  }
  if (nstep < 1) {
    qkx2.min = -min;
    return scale;
  }
  for (let is = 0; is <= nstep; is++) {
    // `min` moves when a candidate wins, and later candidates are spread over the new range.
    iscale = fr(fr(fr(rmin + fr(rdelta * is)) + nmax) / fr(max - min));
    let same = true;
    for (let i = 0; i < n; i++) {
      // nearest_int inlined: in range the mantissa trick is exact integer rounding (half to even).
      const t = fr(fr(iscale * xm[i]) + 12582912);
      let l = t >= 8388608 && t < 16777216 ? (t - 12582912) | 0 : nearestInt(fr(iscale * xm[i]));
      l = l < 0 ? 0 : l > nmax ? nmax : l;
      if (Laux[i] !== l) {
        Laux[i] = l;
        same = false;
      }
    }
    // The same levels as the previous candidate give the same fit and error, which cannot beat
    // the best (it either is the best or lost to it), so the sums are skipped: same bytes, faster.
    if (same && is > 0) continue;
    let sumL = 0;
    let sumL2 = 0;
    let sumXL = 0;
    for (let i = 0; i < n; i++) {
      const l = Laux[i];
      const wl = fr(weights[i] * l);
      sumL = fr(sumL + wl);
      sumL2 = fr(sumL2 + fr(wl * l));
      sumXL = fr(sumXL + fr(wl * xs[i]));
    }
    const D = fr(fr(sumW * sumL2) - fr(sumL * sumL));
    if (D > 0) {
      let thisScale = fr(fr(fr(sumW * sumXL) - fr(sumX * sumL)) / D);
      let thisMin = fr(fr(fr(sumL2 * sumX) - fr(sumL * sumXL)) / D);
      if (thisMin > 0) {
        thisMin = 0;
        thisScale = fr(sumXL / sumL2);
      }
      // The error only grows term by term (weights and squared or absolute differences are >= 0,
      // and rounding is monotone), so a candidate stops once it has reached the best error: it
      // cannot win, exactly as when ggml sums every term.
      let curError = 0;
      for (let i = 0; i < n && curError < bestError; i++) {
        let diff = fr(fr(fr(thisScale * Laux[i]) + thisMin) - xs[i]);
        diff = useMad ? Math.abs(diff) : fr(diff * diff);
        curError = fr(curError + fr(weights[i] * diff));
      }
      if (curError < bestError) {
        for (let i = 0; i < n; i++) L[lo + i] = Laux[i];
        bestError = curError;
        scale = thisScale;
        if (thisMin !== min) {
          min = thisMin;
          for (let i = 0; i < n; i++) xm[i] = xs[i] - min;
        }
      }
    }
  }
  qkx2.min = -min;
  return scale;
}

/**
 * Symmetric search with x² weights (make_qx_quants, rmse_type 1, no importance weights): levels
 * -nmax..nmax-1 stored biased by nmax into L[lo..lo+n); returns the signed scale.
 */
export function makeQxQuants(n: number, nmax: number, x: Float32Array, xo: number, L: Uint8Array, lo: number): number {
  const max = signedAbsMax(x, xo, n);
  if (Math.abs(max) < GROUP_MAX_EPS) {
    L.fill(0, lo, lo + n);
    return 0;
  }
  let iscale = fr(-nmax / max);
  qxSums(n, nmax, x, xo, iscale);
  for (let i = 0; i < n; i++) L[lo + i] = nmax + qxLevel(x[xo + i], iscale, nmax);
  let scale = qx[1] ? fr(qx[0] / qx[1]) : 0;
  let best = fr(scale * qx[0]);
  const tenth = fr(0.1);
  for (let is = -9; is <= 9; is++) {
    if (is === 0) continue;
    iscale = fr(-fr(nmax + fr(tenth * is)) / max);
    qxSums(n, nmax, x, xo, iscale);
    const sumlx = qx[0];
    const suml2 = qx[1];
    if (suml2 > 0 && fr(sumlx * sumlx) > fr(best * suml2)) {
      for (let i = 0; i < n; i++) L[lo + i] = nmax + qxLevel(x[xo + i], iscale, nmax);
      scale = fr(sumlx / suml2);
      best = fr(scale * sumlx);
    }
  }
  return scale;
}

/** A symmetric level -nmax..nmax-1 of v at iscale (make_qx_quants' clamp of nearest_int). */
function qxLevel(v: number, iscale: number, nmax: number): number {
  return Math.max(-nmax, Math.min(nmax - 1, nearestInt(fr(iscale * v))));
}

/** makeQxQuants' x²-weighted sums at iscale, in ggml's float32 order: qx[0] = Σ w·x·l, qx[1] = Σ w·l². */
const qx = new Float64Array(2);
function qxSums(n: number, nmax: number, x: Float32Array, xo: number, iscale: number): void {
  let sumlx = 0;
  let suml2 = 0;
  for (let i = 0; i < n; i++) {
    const v = x[xo + i];
    const l = qxLevel(v, iscale, nmax);
    const w = fr(v * v);
    sumlx = fr(sumlx + fr(fr(w * v) * l));
    suml2 = fr(suml2 + fr(fr(w * l) * l));
  }
  qx[0] = sumlx;
  qx[1] = suml2;
}

/**
 * Q3_K's symmetric search (make_q3_quants with rmse): starts from nmax/|max| and then moves single
 * levels while that lowers the x²-weighted error, up to five sweeps. Levels -nmax..nmax-1 are
 * stored biased by nmax into L[lo..lo+n) (an Int8Array is not needed: biased levels are >= 0).
 */
export function makeQ3Quants(n: number, nmax: number, x: Float32Array, xo: number, L: Uint8Array, lo: number): number {
  const max = signedAbsMax(x, xo, n);
  if (Math.abs(max) < GROUP_MAX_EPS) {
    L.fill(0, lo, lo + n);
    return 0;
  }
  const iscale = fr(-nmax / max);
  const lv = q3Levels;
  let sumlx = 0;
  let suml2 = 0;
  for (let i = 0; i < n; i++) {
    const v = x[xo + i];
    const l = Math.max(-nmax, Math.min(nmax - 1, nearestInt(fr(iscale * v))));
    lv[i] = l;
    const w = fr(v * v);
    sumlx = fr(sumlx + fr(fr(w * v) * l));
    suml2 = fr(suml2 + fr(fr(w * l) * l));
  }
  for (let itry = 0; itry < 5; itry++) {
    let changed = 0;
    for (let i = 0; i < n; i++) {
      const v = x[xo + i];
      const w = fr(v * v);
      let slx = fr(sumlx - fr(fr(w * v) * lv[i]));
      if (slx > 0) {
        let sl2 = fr(suml2 - fr(fr(w * lv[i]) * lv[i]));
        const nl = Math.max(-nmax, Math.min(nmax - 1, nearestInt(fr(fr(v * sl2) / slx))));
        if (nl !== lv[i]) {
          slx = fr(slx + fr(fr(w * v) * nl));
          sl2 = fr(sl2 + fr(fr(w * nl) * nl));
          if (sl2 > 0 && fr(fr(slx * slx) * suml2) > fr(fr(sumlx * sumlx) * sl2)) {
            lv[i] = nl;
            sumlx = slx;
            suml2 = sl2;
            changed++;
          }
        }
      }
    }
    if (!changed) break;
  }
  for (let i = 0; i < n; i++) L[lo + i] = lv[i] + nmax;
  return suml2 > 0 ? fr(sumlx / suml2) : 0;
}

