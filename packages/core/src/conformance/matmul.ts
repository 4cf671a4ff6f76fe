/** Conformance cases, matmul family: matmul, fused_matmul, mlp_slice and the MoE router and expert MLP. */
import type { QuantDType } from '../dtype.js';
import { ConformanceRng, step, f32, i32, bf16, floatOut, intOut, quantBuf, randomBlocks, type BufDef, type Excuse, type CaseDef, type CaseTable } from './kit.js';

/**
 * A matrix in two block types (ops matmul and fused_matmul's weightTail): rows [0, from) in the
 * shape's weight type, the rest in `dtype`, as a GGUF Q4_K_M stores q/k beside a Q6_K v.
 */
interface WeightTailShape {
  from: number;
  dtype: QuantDType;
}

/** The case fields a tail adds: the second block type and the op fields it needs. */
const tailCaseFields = (t: WeightTailShape | undefined): Partial<CaseDef> => (t ? { dtype2: t.dtype, fields: ['weightTail', 'tailFrom'] } : {});

/** The weight buffers of `wRows` rows (rows from t.from on in the tail's buffer). */
function weightBufs(rng: ConformanceRng, dtype: MatmulShape['weight'], wRows: number, inDim: number, t: WeightTailShape | undefined, extra = 0): Record<string, BufDef> {
  if (!t) return { weight: weightBuf(rng, dtype, wRows * inDim + extra, inDim) };
  return { weight: weightBuf(rng, dtype, t.from * inDim, inDim), weightTail: weightBuf(rng, t.dtype, (wRows - t.from) * inDim, inDim) };
}

/** The step arguments a tail adds. */
const tailArgs = (t: WeightTailShape | undefined, b: Record<string, unknown>): Record<string, unknown> => (t ? { weightTail: b.weightTail, tailFrom: t.from } : {});

interface MatmulShape {
  rows: number;
  inDim: number;
  outDim: number;
  bias?: boolean;
  weightOffset?: number;
  weight?: 'f32' | 'bf16' | QuantDType;
  /** A bf16 x (capabilities.activationDtypes; more than 8 rows). */
  x?: 'bf16';
  tail?: WeightTailShape;
  /** Added to out (random values) instead of written. */
  accumulate?: boolean;
}

function matmulCase(name: string, s: MatmulShape, large = false): CaseDef {
  return {
    name,
    large,
    activationDtype: s.x === 'bf16' ? 'bf16' : undefined,
    dtype: quantWeight(s.weight),
    ...tailCaseFields(s.tail),
    build: (rng) => {
      const off = s.weightOffset ?? 0;
      // Values around the used window are garbage a backend must not read (a quantized weight:
      // whole rows of blocks around it).
      const buffers: Record<string, BufDef> = {
        x: s.x === 'bf16' ? bf16(rng.normals(s.rows * s.inDim)) : f32(rng.normals(s.rows * s.inDim)),
        ...weightBufs(rng, s.weight, s.outDim, s.inDim, s.tail, off + (quantWeight(s.weight) ? s.inDim : 17)),
        out: f32(rng.normals(s.rows * s.outDim + 5)),
      };
      if (s.bias) buffers.bias = f32(rng.normals(s.outDim));
      return {
        buffers,
        steps: [
          step('matmul', (b) => ({
            x: b.x,
            weight: b.weight,
            ...tailArgs(s.tail, b),
            out: b.out,
            rows: s.rows,
            inDim: s.inDim,
            outDim: s.outDim,
            ...(s.bias ? { bias: b.bias } : {}),
            ...(s.weightOffset !== undefined ? { weightOffset: s.weightOffset } : {}),
            ...(s.accumulate ? { accumulate: true } : {}),
          })),
        ],
        outputs: [floatOut('out')],
      };
    },
  };
}

interface FusedMatmulShape {
  rows: number;
  inDim: number;
  outDim: number;
  norm?: boolean;
  glu?: boolean;
  accumulate?: boolean;
  bias?: boolean;
  weight?: 'f32' | 'bf16' | QuantDType;
  eps?: number;
  tail?: WeightTailShape;
}

const quantWeight = (w: MatmulShape['weight']): QuantDType | undefined => (w === undefined || w === 'f32' || w === 'bf16' ? undefined : w);

/** A weight of `n` values, rows of `inDim`, scaled as a layer's weights are (1/sqrt(inDim)). */
export function weightBuf(rng: ConformanceRng, dtype: MatmulShape['weight'], n: number, inDim: number): BufDef {
  const q = quantWeight(dtype);
  if (q) return quantBuf(q, randomBlocks(rng, q, n, 1 / Math.sqrt(inDim)));
  const w = rng.normals(n, 1 / Math.sqrt(inDim));
  return dtype === 'bf16' ? bf16(w) : f32(w);
}

function fusedMatmulCase(name: string, s: FusedMatmulShape, large = false): CaseDef {
  return {
    name,
    large,
    dtype: quantWeight(s.weight),
    ...tailCaseFields(s.tail),
    build: (rng) => {
      const wRows = s.glu ? 2 * s.outDim : s.outDim;
      const buffers: Record<string, BufDef> = {
        // A norm input far from unit scale, so a backend that skips the normalization is caught.
        x: f32(rng.normals(s.rows * s.inDim, s.norm ? 7 : 1.5)),
        ...weightBufs(rng, s.weight, wRows, s.inDim, s.tail),
        out: f32(rng.normals(s.rows * s.outDim + 3, 2)),
      };
      if (s.bias) buffers.bias = f32(rng.normals(s.outDim));
      if (s.norm) buffers.normWeight = f32(rng.normals(s.inDim, 0.3).map((v) => 1 + v));
      return {
        buffers,
        steps: [
          step('fused_matmul', (b) => ({
            x: b.x,
            weight: b.weight,
            ...tailArgs(s.tail, b),
            out: b.out,
            rows: s.rows,
            inDim: s.inDim,
            outDim: s.outDim,
            ...(s.bias ? { bias: b.bias } : {}),
            ...(s.norm ? { normWeight: b.normWeight, eps: s.eps ?? 1e-6 } : {}),
            ...(s.glu ? { glu: true } : {}),
            ...(s.accumulate ? { accumulate: true } : {}),
          })),
        ],
        outputs: [floatOut('out')],
      };
    },
  };
}

/**
 * mlp_slice with its weights (and staging) in the host tier: compute near data. Weights are bf16,
 * what a GPU backend stores and its host kernels read (the CPU reference also takes f32: its own
 * tests cover that).
 */
function mlpSliceCase(name: string, rows: number, hidden: number, inter: number, weight: 'f32' | 'bf16'): CaseDef {
  return {
    name,
    build: (rng) => {
      const w = (n: number, fan: number) => rng.normals(n, 1 / Math.sqrt(fan));
      const host = (d: BufDef): BufDef => ({ ...d, tier: 'pinned' });
      const wt = (d: Float32Array) => host(weight === 'bf16' ? bf16(d) : f32(d));
      return {
        buffers: {
          // Far from unit scale, so a backend that skips the normalization is caught.
          x: f32(rng.normals(rows * hidden, 6)),
          normWeight: host(f32(rng.normals(hidden, 0.3).map((v) => 1 + v))),
          gateUp: wt(w(2 * inter * hidden, hidden)),
          down: wt(w(hidden * inter, Math.max(inter, 1))),
          out: f32(rng.normals(rows * hidden + 2, 3)),
          xHost: host(f32(new Float32Array(rows * hidden))),
          yHost: host(f32(new Float32Array(rows * hidden))),
        },
        steps: [
          step('mlp_slice', (b) => ({ x: b.x, normWeight: b.normWeight, gateUp: b.gateUp, down: b.down, out: b.out, rows, hidden, inter, eps: 1e-6, xHost: b.xHost, yHost: b.yHost })),
        ],
        outputs: [floatOut('out')],
      };
    },
  };
}

/**
 * Router logits with well separated values (a shuffled ladder with step 0.08 plus noise under
 * 0.02), so the top-k set is never decided by rounding.
 */
function routerLogits(rng: ConformanceRng, rows: number, experts: number): Float32Array {
  const a = new Float32Array(rows * experts);
  for (let r = 0; r < rows; r++) {
    const p = rng.perm(experts);
    for (let e = 0; e < experts; e++) a[r * experts + e] = (p[e] - experts / 2) * 0.08 + (rng.next() - 0.5) * 0.02;
  }
  return a;
}

/** Softmax of one row in float64 (for the near-tie excuse of topIds). */
function softmaxRow(x: ArrayLike<number>, off: number, n: number): Float64Array {
  const p = new Float64Array(n);
  let max = -Infinity;
  for (let i = 0; i < n; i++) max = Math.max(max, x[off + i]);
  let sum = 0;
  for (let i = 0; i < n; i++) sum += p[i] = Math.exp(x[off + i] - max);
  for (let i = 0; i < n; i++) p[i] /= sum;
  return p;
}

function moeRouteCase(name: string, rows: number, numExperts: number, topK: number, normalize: boolean): CaseDef {
  return {
    name,
    build: (rng) => {
      const logits = routerLogits(rng, rows, numExperts);
      const excuse: Excuse = (i, got, ref, relTol, absTol) => {
        const r = Math.floor(i / topK);
        const p = softmaxRow(logits, r * numExperts, numExperts);
        return got >= 0 && got < numExperts && Math.abs(p[got] - p[ref]) <= relTol + absTol;
      };
      return {
        buffers: { logits: f32(logits), topIds: i32(new Int32Array(rows * topK).fill(-7)), topWeights: f32(rng.normals(rows * topK)) },
        steps: [step('moe_route', (b) => ({ logits: b.logits, topIds: b.topIds, topWeights: b.topWeights, rows, numExperts, topK, normalize }))],
        outputs: [intOut('topIds', excuse), floatOut('topWeights')],
      };
    },
  };
}

function moeMlpCase(name: string, rows: number, hidden: number, inter: number, experts: number, topK: number, weight: 'f32' | 'bf16'): CaseDef {
  return {
    name,
    build: (rng) => {
      const ids: number[] = [];
      const wts = new Float32Array(rows * topK);
      for (let r = 0; r < rows; r++) {
        const chosen = rng.perm(experts).slice(0, topK);
        let sum = 0;
        for (let k = 0; k < topK; k++) sum += wts[r * topK + k] = 0.1 + rng.next();
        for (let k = 0; k < topK; k++) wts[r * topK + k] /= sum;
        ids.push(...chosen);
      }
      const gu = rng.normals(experts * 2 * inter * hidden, 1 / Math.sqrt(hidden));
      const dn = rng.normals(experts * hidden * inter, 1 / Math.sqrt(inter));
      const wb = weight === 'bf16' ? bf16 : f32;
      return {
        buffers: {
          x: f32(rng.normals(rows * hidden)),
          topIds: i32(ids),
          topWeights: f32(wts),
          gateUp: wb(gu),
          down: wb(dn),
          out: f32(rng.normals(rows * hidden + 1)),
        },
        steps: [
          step('moe_mlp', (b) => ({
            x: b.x,
            topIds: b.topIds,
            topWeights: b.topWeights,
            gateUp: b.gateUp,
            down: b.down,
            out: b.out,
            rows,
            hidden,
            inter,
            topK,
          })),
        ],
        outputs: [floatOut('out')],
      };
    },
  };
}

export const matmulCases: Pick<CaseTable, 'matmul' | 'fused_matmul' | 'mlp_slice' | 'moe_route' | 'moe_mlp'> = {
  matmul: [
    matmulCase('1 row 67 -> 29', { rows: 1, inDim: 67, outDim: 29 }),
    matmulCase('5 rows 64 -> 48, bias', { rows: 5, inDim: 64, outDim: 48, bias: true }),
    matmulCase('3 rows 33 -> 7, weightOffset 100', { rows: 3, inDim: 33, outDim: 7, weightOffset: 100 }),
    matmulCase('2 rows 3 -> 5', { rows: 2, inDim: 3, outDim: 5 }),
    matmulCase('1 row 256 -> 130, bf16 weights', { rows: 1, inDim: 256, outDim: 130, weight: 'bf16' }),
    matmulCase('8 rows 96 -> 80, bf16 weights, bias, weightOffset', { rows: 8, inDim: 96, outDim: 80, weight: 'bf16', bias: true, weightOffset: 96 * 3 }),
    matmulCase('1 row 1024 -> 4096, bf16 weights', { rows: 1, inDim: 1024, outDim: 4096, weight: 'bf16' }, true),
    matmulCase('17 rows 512 -> 1536, bias', { rows: 17, inDim: 512, outDim: 1536, bias: true }, true),
    // A bf16 x (capabilities.activationDtypes): the prefill projections' inputs.
    matmulCase('12 rows 64 -> 40, bf16 x, bf16 weights, bias', { rows: 12, inDim: 64, outDim: 40, weight: 'bf16', bias: true, x: 'bf16' }),
    // ggml block-quantized weights (GGUF): each backend reads the blocks; the reference holds the
    // dequantized values, so only float32 summation order may differ.
    ...(['q8_0', 'q4_0', 'q4_k', 'q6_k'] as const).flatMap((q) => [
      matmulCase(`1 row 512 -> 40, ${q}`, { rows: 1, inDim: 512, outDim: 40, weight: q }),
      matmulCase(`5 rows 256 -> 33, ${q}, bias`, { rows: 5, inDim: 256, outDim: 33, weight: q, bias: true }),
      matmulCase(`12 rows 768 -> 20, ${q}, weightOffset`, { rows: 12, inDim: 768, outDim: 20, weight: q, weightOffset: 768 * 3 }),
      matmulCase(`1 row 4096 -> 1024, ${q}`, { rows: 1, inDim: 4096, outDim: 1024, weight: q }, true),
    ]),
    // Q6_K at 17 super-blocks a row, its 210-byte (2-byte-aligned) blocks at every offset (odd
    // super-block counts, a weight offset), several 16-row groups with a partial one.
    matmulCase('4 rows 4352 -> 72, q6_k, weightOffset', { rows: 4, inDim: 4352, outDim: 72, weight: 'q6_k', weightOffset: 4352 * 3 }),
    matmulCase('8 rows 1280 -> 100, q6_k, bias', { rows: 8, inDim: 1280, outDim: 100, weight: 'q6_k', bias: true }),
    // The 0.6B's and the 8B's down rows (3072 and 12288 elements): 96 and 384 32-element tiles,
    // a lane a tile in CUDA's GEMV, so its blocks end in idle warps.
    matmulCase('2 rows 3072 -> 40, q6_k', { rows: 2, inDim: 3072, outDim: 40, weight: 'q6_k' }),
    matmulCase('1 row 12288 -> 36, q6_k, accumulate', { rows: 1, inDim: 12288, outDim: 36, weight: 'q6_k', accumulate: true }),
    matmulCase('1 row 12288 -> 20, q8_0', { rows: 1, inDim: 12288, outDim: 20, weight: 'q8_0' }),
    matmulCase('3 rows 512 -> 40, q4_k rows then a q6_k tail from 24, bias', { rows: 3, inDim: 512, outDim: 40, weight: 'q4_k', tail: { from: 24, dtype: 'q6_k' }, bias: true }),
    matmulCase('12 rows 256 -> 20, q8_0 rows then a q4_0 tail from 16', { rows: 12, inDim: 256, outDim: 20, weight: 'q8_0', tail: { from: 16, dtype: 'q4_0' } }),
    matmulCase('70 rows 1024 -> 768, bf16 x, bf16 weights, weightOffset', { rows: 70, inDim: 1024, outDim: 768, weight: 'bf16', weightOffset: 1024 * 5, x: 'bf16' }, true),
    // accumulate (the prefill's o and down projections adding into the residual stream): the GEMV,
    // the GEMM over an f32 and a bf16 x, with a bias and over block-quantized weights.
    matmulCase('3 rows 96 -> 40, accumulate', { rows: 3, inDim: 96, outDim: 40, accumulate: true }),
    matmulCase('4 rows 128 -> 64, bf16 weights, bias, accumulate', { rows: 4, inDim: 128, outDim: 64, weight: 'bf16', bias: true, accumulate: true }),
    matmulCase('40 rows 512 -> 256, bf16 weights, accumulate', { rows: 40, inDim: 512, outDim: 256, weight: 'bf16', accumulate: true }, true),
    matmulCase('24 rows 256 -> 96, bf16 weights, bias, accumulate', { rows: 24, inDim: 256, outDim: 96, weight: 'bf16', bias: true, accumulate: true }),
    matmulCase('36 rows 768 -> 512, bf16 x, bf16 weights, accumulate', { rows: 36, inDim: 768, outDim: 512, weight: 'bf16', x: 'bf16', accumulate: true }, true),
    matmulCase('20 rows 64 -> 40, bf16 x, bf16 weights, bias, accumulate', { rows: 20, inDim: 64, outDim: 40, weight: 'bf16', x: 'bf16', bias: true, accumulate: true }),
    matmulCase('2 rows 512 -> 40, q4_k, accumulate', { rows: 2, inDim: 512, outDim: 40, weight: 'q4_k', accumulate: true }),
    matmulCase('33 rows 1024 -> 256, q4_k, accumulate', { rows: 33, inDim: 1024, outDim: 256, weight: 'q4_k', accumulate: true }, true),
    matmulCase('18 rows 768 -> 48, q6_k, bias, accumulate', { rows: 18, inDim: 768, outDim: 48, weight: 'q6_k', bias: true, accumulate: true }),
  ],
  fused_matmul: [
    fusedMatmulCase('1 row 64 -> 40, rmsnorm input', { rows: 1, inDim: 64, outDim: 40, norm: true }),
    fusedMatmulCase('3 rows 37 -> 11, rmsnorm input eps 1e-5, bias', { rows: 3, inDim: 37, outDim: 11, norm: true, eps: 1e-5, bias: true }),
    fusedMatmulCase('2 rows 48 -> 24, rmsnorm input, glu', { rows: 2, inDim: 48, outDim: 24, norm: true, glu: true }),
    fusedMatmulCase('1 row 13 -> 9, glu', { rows: 1, inDim: 13, outDim: 9, glu: true }),
    fusedMatmulCase('5 rows 32 -> 16, accumulate, bias', { rows: 5, inDim: 32, outDim: 16, accumulate: true, bias: true }),
    fusedMatmulCase('1 row 256 -> 96, bf16, rmsnorm input', { rows: 1, inDim: 256, outDim: 96, norm: true, weight: 'bf16' }),
    fusedMatmulCase('9 rows 64 -> 32, bf16, rmsnorm, glu', { rows: 9, inDim: 64, outDim: 32, norm: true, glu: true, weight: 'bf16' }),
    fusedMatmulCase('3 rows 64 -> 24, bf16, accumulate', { rows: 3, inDim: 64, outDim: 24, accumulate: true, weight: 'bf16' }),
    fusedMatmulCase('1 row 1024 -> 4096, bf16, rmsnorm input', { rows: 1, inDim: 1024, outDim: 4096, norm: true, weight: 'bf16' }, true),
    fusedMatmulCase('1 row 1024 -> 3072, bf16, rmsnorm, glu', { rows: 1, inDim: 1024, outDim: 3072, norm: true, glu: true, weight: 'bf16' }, true),
    fusedMatmulCase('1 row 3072 -> 1024, bf16, accumulate', { rows: 1, inDim: 3072, outDim: 1024, accumulate: true, weight: 'bf16' }, true),
    fusedMatmulCase('4 rows 2048 -> 1024, bf16, rmsnorm, accumulate', { rows: 4, inDim: 2048, outDim: 1024, norm: true, accumulate: true, weight: 'bf16' }, true),
    // Batched decode: past 8 rows a backend may switch to a GEMM with a fused epilogue.
    fusedMatmulCase('40 rows 1024 -> 3072, bf16, rmsnorm, glu', { rows: 40, inDim: 1024, outDim: 3072, norm: true, glu: true, weight: 'bf16' }, true),
    fusedMatmulCase('33 rows 3072 -> 1024, bf16, accumulate', { rows: 33, inDim: 3072, outDim: 1024, accumulate: true, weight: 'bf16' }, true),
    fusedMatmulCase('17 rows 256 -> 96, bf16, rmsnorm, bias', { rows: 17, inDim: 256, outDim: 96, norm: true, bias: true, weight: 'bf16' }, true),
    ...(['q8_0', 'q4_0', 'q4_k', 'q6_k'] as const).flatMap((q) => [
      fusedMatmulCase(`1 row 256 -> 64, ${q}, rmsnorm input`, { rows: 1, inDim: 256, outDim: 64, norm: true, weight: q }),
      fusedMatmulCase(`3 rows 512 -> 30, ${q}, rmsnorm, glu`, { rows: 3, inDim: 512, outDim: 30, norm: true, glu: true, weight: q }),
      fusedMatmulCase(`2 rows 768 -> 24, ${q}, accumulate`, { rows: 2, inDim: 768, outDim: 24, accumulate: true, weight: q }),
      fusedMatmulCase(`1 row 1024 -> 3072, ${q}, rmsnorm, glu`, { rows: 1, inDim: 1024, outDim: 3072, norm: true, glu: true, weight: q }, true),
      fusedMatmulCase(`20 rows 3072 -> 1024, ${q}, accumulate`, { rows: 20, inDim: 3072, outDim: 1024, accumulate: true, weight: q }, true),
    ]),
    // Decode's qkv projection of a Q4_K_M file: q and k in Q4_K, v in Q6_K, the norm fused.
    fusedMatmulCase('1 row 1024 -> 1536, q4_k then a q6_k tail from 1280, rmsnorm input', { rows: 1, inDim: 1024, outDim: 1536, weight: 'q4_k', tail: { from: 1280, dtype: 'q6_k' }, norm: true }, true),
    fusedMatmulCase('2 rows 256 -> 48, q4_k then a q6_k tail from 32, rmsnorm, bias', { rows: 2, inDim: 256, outDim: 48, weight: 'q4_k', tail: { from: 32, dtype: 'q6_k' }, norm: true, bias: true }),
    // A Q6_K head normalizes x itself and hands the normalized rows to a tail of another type.
    fusedMatmulCase('2 rows 768 -> 56, q6_k then a q4_k tail from 40, rmsnorm, accumulate', { rows: 2, inDim: 768, outDim: 56, weight: 'q6_k', tail: { from: 40, dtype: 'q4_k' }, norm: true, accumulate: true }),
    fusedMatmulCase('5 rows 1280 -> 40, q6_k, rmsnorm, glu', { rows: 5, inDim: 1280, outDim: 40, norm: true, glu: true, weight: 'q6_k' }),
    fusedMatmulCase('3 rows 512 -> 24, q6_k then a q8_0 tail from 8, accumulate', { rows: 3, inDim: 512, outDim: 24, weight: 'q6_k', tail: { from: 8, dtype: 'q8_0' }, accumulate: true }),
  ],
  mlp_slice: [
    mlpSliceCase('1 row, hidden 64, 24 channels, bf16', 1, 64, 24, 'bf16'),
    mlpSliceCase('3 rows, hidden 70, 33 channels (odd tails), bf16', 3, 70, 33, 'bf16'),
    mlpSliceCase('8 rows, hidden 128, 96 channels, bf16', 8, 128, 96, 'bf16'),
  ],
  moe_route: [
    moeRouteCase('4 rows, 8 experts, top 2, normalized', 4, 8, 2, true),
    moeRouteCase('3 rows, 60 experts, top 4, not normalized', 3, 60, 4, false),
    moeRouteCase('2 rows, 128 experts, top 8, normalized', 2, 128, 8, true),
    moeRouteCase('1 row, topK = numExperts = 5', 1, 5, 5, false),
  ],
  moe_mlp: [
    moeMlpCase('3 rows, hidden 16, inter 12, 4 experts, top 2', 3, 16, 12, 4, 2, 'f32'),
    moeMlpCase('2 rows, hidden 24, inter 10, 8 experts, top 3, bf16', 2, 24, 10, 8, 3, 'bf16'),
    moeMlpCase('1 row, hidden 7, inter 5, 3 experts, top 1', 1, 7, 5, 3, 1, 'f32'),
  ],
};
