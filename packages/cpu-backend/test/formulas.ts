/**
 * Straightforward float64 formulas of the ops, written independently of the kernels (no paging,
 * no unrolling, no shared helpers), as the ground truth the reference backend is checked against.
 */

export function matmulF64(x: ArrayLike<number>, w: ArrayLike<number>, rows: number, inDim: number, outDim: number, bias?: ArrayLike<number>, off = 0): Float64Array {
  const out = new Float64Array(rows * outDim);
  for (let r = 0; r < rows; r++) {
    for (let o = 0; o < outDim; o++) {
      let s = bias ? bias[o] : 0;
      for (let i = 0; i < inDim; i++) s += x[r * inDim + i] * w[off + o * inDim + i];
      out[r * outDim + o] = s;
    }
  }
  return out;
}

export function rmsnormF64(x: ArrayLike<number>, w: ArrayLike<number>, rows: number, dim: number, eps: number): Float64Array {
  const out = new Float64Array(rows * dim);
  for (let r = 0; r < rows; r++) {
    let ms = 0;
    for (let i = 0; i < dim; i++) ms += x[r * dim + i] ** 2;
    ms /= dim;
    for (let i = 0; i < dim; i++) out[r * dim + i] = (x[r * dim + i] / Math.sqrt(ms + eps)) * w[i];
  }
  return out;
}

/**
 * QK-norm then rotate-half RoPE on one head vector. The angle is the float32 product of position
 * and inverse frequency, the convention the op documents (Hugging Face computes it in float32).
 */
export function ropeHeadF64(v: number[], pos: number, invFreq: ArrayLike<number>, norm?: ArrayLike<number>, eps = 1e-6): number[] {
  const d = v.length;
  let x = v.slice();
  if (norm) {
    const ms = x.reduce((s, t) => s + t * t, 0) / d;
    x = x.map((t, i) => (t / Math.sqrt(ms + eps)) * norm[i]);
  }
  const half = d / 2;
  const rotated = x.map((t, i) => (i < half ? -x[i + half] : x[i - half]));
  return x.map((t, i) => {
    const ang = Math.fround(pos * invFreq[i % half]);
    return t * Math.cos(ang) + rotated[i] * Math.sin(ang);
  });
}

/**
 * Dense causal attention of one sequence: q [T, H*D], k/v [T, KV*D]; row t sees keys 0..t.
 * The mask is explicit: -Infinity scores for s > t, then a plain softmax.
 */
export function causalAttentionF64(q: ArrayLike<number>, k: ArrayLike<number>, v: ArrayLike<number>, T: number, H: number, KV: number, D: number, scale: number): Float64Array {
  const out = new Float64Array(T * H * D);
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < H; h++) {
      const kh = Math.floor(h / (H / KV));
      const scores: number[] = [];
      for (let s = 0; s < T; s++) {
        if (s > t) {
          scores.push(-Infinity);
          continue;
        }
        let dotp = 0;
        for (let i = 0; i < D; i++) dotp += q[t * H * D + h * D + i] * k[s * KV * D + kh * D + i];
        scores.push(dotp * scale);
      }
      const m = Math.max(...scores);
      const e = scores.map((x) => Math.exp(x - m));
      const z = e.reduce((a, b) => a + b, 0);
      for (let i = 0; i < D; i++) {
        let acc = 0;
        for (let s = 0; s < T; s++) acc += (e[s] / z) * v[s * KV * D + kh * D + i];
        out[t * H * D + h * D + i] = acc;
      }
    }
  }
  return out;
}

export function siluMulF64(x: ArrayLike<number>, rows: number, dim: number): Float64Array {
  const out = new Float64Array(rows * dim);
  for (let r = 0; r < rows; r++) {
    for (let i = 0; i < dim; i++) {
      const g = x[r * 2 * dim + i];
      out[r * dim + i] = (g / (1 + Math.exp(-g))) * x[r * 2 * dim + dim + i];
    }
  }
  return out;
}

/** Router: sort experts by softmax probability (stable, so ties keep the lower index). */
export function moeRouteF64(logits: ArrayLike<number>, rows: number, E: number, topK: number, normalize: boolean): { ids: number[]; weights: number[] } {
  const ids: number[] = [];
  const weights: number[] = [];
  for (let r = 0; r < rows; r++) {
    const row = Array.from({ length: E }, (_, e) => logits[r * E + e]);
    const m = Math.max(...row);
    const ex = row.map((x) => Math.exp(x - m));
    const z = ex.reduce((a, b) => a + b, 0);
    const p = ex.map((x) => x / z);
    const order = p.map((_, e) => e).sort((a, b) => p[b] - p[a] || a - b).slice(0, topK);
    const kept = order.reduce((s, e) => s + p[e], 0);
    ids.push(...order);
    weights.push(...order.map((e) => (normalize ? p[e] / kept : p[e])));
  }
  return { ids, weights };
}

/** The sparse MLP computed expert by expert as dense matrices. */
export function moeMlpF64(
  x: ArrayLike<number>,
  ids: ArrayLike<number>,
  wts: ArrayLike<number>,
  gateUp: ArrayLike<number>,
  down: ArrayLike<number>,
  rows: number,
  hidden: number,
  inter: number,
  topK: number,
): Float64Array {
  const out = new Float64Array(rows * hidden);
  for (let r = 0; r < rows; r++) {
    for (let k = 0; k < topK; k++) {
      const e = ids[r * topK + k];
      const xr = Array.from({ length: hidden }, (_, i) => x[r * hidden + i]);
      const gate = matmulF64(xr, gateUp, 1, hidden, inter, undefined, e * 2 * inter * hidden);
      const up = matmulF64(xr, gateUp, 1, hidden, inter, undefined, e * 2 * inter * hidden + inter * hidden);
      const act = Array.from({ length: inter }, (_, j) => (gate[j] / (1 + Math.exp(-gate[j]))) * up[j]);
      const y = matmulF64(act, down, 1, inter, hidden, undefined, e * hidden * inter);
      for (let d = 0; d < hidden; d++) out[r * hidden + d] += wts[r * topK + k] * y[d];
    }
  }
  return out;
}
