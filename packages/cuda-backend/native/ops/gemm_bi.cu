// Batch-invariant GEMM on tensor cores (k_gemm_bi): the matmul of batch-invariant decode where
// cuBLASLt is unavailable or pins no algorithm for a shape.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/ops.h"

namespace nerva::ops {

// ---------------------------------------------------------------- batch-invariant GEMM (decode rows)

// k_gemm_bi: out[r, o] = sum_i x[r, i] * W[o, i] for up to BI_MAX_ROWS f32 rows x and bf16 weights
// W [outDim (2 * outDim with GLU), inDim], on tensor cores (mma.sync m16n8k16, bf16 in, f32
// accumulate), for batch-invariant decode (NervaExec::batchInv, every row count, 1 included)
// where cuBLASLt did not load or pinned no algorithm for the shape (matmulRows decides).
//
// Operands: the mma's A (16 x 16) is 16 weight rows (outputs), its B (16 x 8) is 8 activation rows
// (its N columns), so one row alone wastes 7 of 8 columns, not 15 of 16. Each activation x is split
// exactly into three bf16 terms, hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid)
// (hi + mid + lo == x for normal floats); every bf16 * bf16 product is exact in f32, so the
// result is f32-grade (the exact prefill's split-bf16 scheme, with a third term).
//
// Weights stream from global memory straight into A fragments, no ldmatrix, no shared memory: in
// a chunk of 64 k (one 128-byte line of each weight row) lane (g = lane / 4, q = lane % 4) loads
// 16 bytes of rows g and g + 8 of its 16-row tile at k offsets 32 h + 8 q (h = 0, 1), which are
// the A registers of 4 mma steps: step (h, s) gives its k-slots 2q, 2q + 1 the chunk's k
// 32 h + 8 q + 4 s + {0, 1} and slots 2q + 8, 2q + 9 the k 32 h + 8 q + 4 s + {2, 3}. The B
// fragments take the same k from lane (g, q)'s activation row g (two float4 loads per h, split
// on the fly in registers). P chunks of weights are in flight per warp (16 bytes a load, 2 KiB a
// 16-row tile and chunk), the first ones loaded before the PDL dependency wait.
//
// What fixes the bits of out[r, o], and why none of it depends on the launch's rows:
//  - K order: chunks of 64 k in ascending order within a K stripe; per chunk the four steps
//    (h, s) = (0,0), (0,1), (1,0), (1,1), per step the terms hi, mid, lo, each one mma into the
//    chunk's accumulator (from zero), which one f32 add (round to nearest) then adds into the
//    stripe's sum; a tail chunk (inDim % 64) is zero-padded, the same for every launch. (The
//    per-chunk sum keeps the tensor core's truncating accumulation to 12 mmas: modelled with
//    round-toward-zero mmas, one running accumulator over all of K erred up to 4e-6 of
//    sum |x_i w_i| at inDim 12288, the per-chunk sum 9e-8; test/native/bi_gemm_test.cc.)
//  - Split K: KS warps of a block take chunks c = ks, ks + KS, ... (ks = 0..KS-1) of the same
//    outputs; KS comes from (inDim, outDim, GLU) alone (biSplitK), and the KS partials are summed
//    in ks order ((p0 + p1) + p2) + ... through shared memory.
//  - Row placement: an mma's output column depends only on its B column (and the A rows), so a
//    row's value is the same in any of the 8 columns of any n-tile, with any other rows (or zero
//    padding) beside it. NT (n-tiles a launch, from the rows), the warps per block along N and the
//    grid change only which lanes compute a value, not how.
//  - The split of a value into hi, mid, lo is a function of that value alone.
//  - TERMS = 1 (matmul precision bf16, gemmMode GEMM_BF16): x is rounded to bf16 once (hi alone,
//    what a bf16 GEMM does to its operands), one mma a step; chosen per backend, never per call.
//  - Epilogue: bias, GLU (gate rows o, up rows o + outDim: silu(gate) * up) and accumulate with
//    the same bfr rounding calls as k_gemv_bf16's finish().
// RMSNorm (fused_matmul's norm) runs before, as k_rmsnorm_gemv into the workspace (gemmBiRows).
// inDim % 16 == 0 (the kernel itself needs inDim % 8 == 0: whole 16-byte loads), W and x 16-byte
// aligned. Block: KS * NWN warps, warp = wn * KS + ks; warp column wn covers the 16-output tile
// blockIdx.x * NWN + wn (GLU: 16 gate and the 16 matching up rows).
constexpr int BI_CHUNK = 64;         // k of a chunk
constexpr int BI_MAX_ROWS = 64;      // rows a launch (8 n-tiles)
constexpr int BI_MAX_KS = 8;         // split-K warps of a block, at most
constexpr int BI_MAX_THREADS = 256;  // threads of a block, at most
// M-tiles a warp (GLU: the gate tile and its up tile), and chunks of weights in flight per warp.
__host__ __device__ constexpr int biTiles(bool glu) { return glu ? 2 : 1; }
// (8 KiB of weights in flight a warp up to 8 rows, 16 without GLU, 4 KiB beyond: then every
// instance but the 64-row GLU one fits 128 registers.)
__host__ __device__ constexpr int biInFlight(int nt, bool glu) { return glu ? (nt == 1 ? 2 : 1) : nt <= 2 ? 4 : 2; }
// Two full blocks an SM (<= 128 registers) except at 33-64 rows (accumulators of 8 n-tiles).
__host__ __device__ constexpr int biMinBlocks(int nt) { return nt < 8 ? 2 : 1; }

// (lo, hi) rounded to bf16 (round to nearest even), packed lo in the low 16 bits.
__device__ __forceinline__ uint32_t biCvt2(float lo, float hi) {
  uint32_t d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#else
  d = (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16);
#endif
  return d;
}
// The pair (a, b) as three packed bf16 terms: hi + mid + lo == (a, b) exactly (normal floats).
__device__ __forceinline__ void biSplit2(float a, float b, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
  hi = biCvt2(a, b);
  const float ra = a - __uint_as_float(hi << 16), rb = b - __uint_as_float(hi & 0xffff0000u);
  mid = biCvt2(ra, rb);
  const float sa = ra - __uint_as_float(mid << 16), sb = rb - __uint_as_float(mid & 0xffff0000u);
  lo = biCvt2(sa, sb);
}

__device__ __forceinline__ void biMma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                      uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ uint32_t biWord(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

template <int NT, bool GLU, int TERMS>
__global__ void __launch_bounds__(BI_MAX_THREADS, biMinBlocks(NT))
    k_gemm_bi(const float* __restrict__ x, const uint16_t* __restrict__ w, float* __restrict__ out, int rows, int inDim,
              int outDim, int KS, const void* bias, int bdt, int accumulate, int bfa, int trig) {
  constexpr int MT = biTiles(GLU);
  constexpr int P = biInFlight(NT, GLU);
  constexpr int NACC = MT * NT * 4;
  // trig: let the next kernel launch now rather than after our wait (see Fuse::early).
  NERVA_TRACE_KERNEL();
  if (trig) pdlTrigger();
  extern __shared__ float biRed[];  // KS > 1: partials of stripes 1..KS-1, [(ks - 1) * NWN + wn][NACC][32]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int nwn = (int)(blockDim.x >> 5) / KS;
  const int ks = warp % KS, wn = warp / KS;
  const int o0 = (blockIdx.x * nwn + wn) * 16;  // the warp's first output (may be past outDim: then it writes nothing)
  const int nChunks = (inDim + BI_CHUNK - 1) / BI_CHUNK;

  // Weight rows of the lane: tile t (GLU: 0 gate, 1 up), half hh (rows g and g + 8 of the tile).
  const uint16_t* wr[MT][2];
  bool wv[MT][2];
#pragma unroll
  for (int t = 0; t < MT; t++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int o = o0 + g + 8 * hh;
      wv[t][hh] = o < outDim;
      wr[t][hh] = w + ((size_t)(t == 1 ? outDim : 0) + (size_t)(wv[t][hh] ? o : 0)) * inDim + 8 * q;
    }

  float acc[MT][NT][4];
#pragma unroll
  for (int t = 0; t < MT; t++)
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[t][n][i] = 0.f;

  uint4 wq[P][MT][2][2];  // [chunk of the group][tile][row half][h]
  // Chunk c's weights into slot u (zeros past inDim: the tail chunk, and chunks past the last).
  auto loadW = [&](int u, int c) {
#pragma unroll
    for (int t = 0; t < MT; t++)
#pragma unroll
      for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int k = c * BI_CHUNK + 32 * h;  // + 8 q in wr
          wq[u][t][hh][h] = wv[t][hh] && k + 8 * q < inDim ? __ldcs(reinterpret_cast<const uint4*>(wr[t][hh] + k))
                                                           : make_uint4(0u, 0u, 0u, 0u);
        }
  };
  // The 4 steps x 3 terms of chunk c (weights in slot u) into every n-tile holding a row.
  auto compute = [&](int u, int c) {
#pragma unroll
    for (int n = 0; n < NT; n++) {
      if (n * 8 < rows) {  // (uniform) an n-tile with no row adds nothing to any other
        const int r = n * 8 + g;
        float4 xv[2][2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int k = c * BI_CHUNK + 32 * h + 8 * q;
          if (r < rows && k < inDim) {
            const float4* xp = reinterpret_cast<const float4*>(x + (size_t)r * inDim + k);
            xv[h][0] = __ldg(xp);
            xv[h][1] = __ldg(xp + 1);
          } else {
            xv[h][0] = xv[h][1] = make_float4(0.f, 0.f, 0.f, 0.f);
          }
        }
        float part[MT][4];  // the chunk's sum, from zero
#pragma unroll
        for (int t = 0; t < MT; t++)
#pragma unroll
          for (int i = 0; i < 4; i++) part[t][i] = 0.f;
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int s = 0; s < 2; s++) {
            uint32_t b0[3], b1[3];  // terms hi, mid, lo of the step's k-slots 2q.. and 2q + 8..
            if (TERMS == 3) {
              biSplit2(xv[h][s].x, xv[h][s].y, b0[0], b0[1], b0[2]);
              biSplit2(xv[h][s].z, xv[h][s].w, b1[0], b1[1], b1[2]);
            } else {
              b0[0] = biCvt2(xv[h][s].x, xv[h][s].y);
              b1[0] = biCvt2(xv[h][s].z, xv[h][s].w);
            }
#pragma unroll
            for (int t = 0; t < MT; t++) {
              const uint32_t a0 = biWord(wq[u][t][0][h], 2 * s), a1 = biWord(wq[u][t][1][h], 2 * s);
              const uint32_t a2 = biWord(wq[u][t][0][h], 2 * s + 1), a3 = biWord(wq[u][t][1][h], 2 * s + 1);
#pragma unroll
              for (int e = 0; e < TERMS; e++) biMma(part[t], a0, a1, a2, a3, b0[e], b1[e]);
            }
          }
#pragma unroll
        for (int t = 0; t < MT; t++)
#pragma unroll
          for (int i = 0; i < 4; i++) acc[t][n][i] += part[t][i];
      }
    }
  };

  // The weights do not depend on the previous kernel: the first group streams before the wait.
  int c = ks;
#pragma unroll
  for (int u = 0; u < P; u++) loadW(u, c + u * KS);
  pdlWait();
  if (!trig) pdlTrigger();
#pragma unroll
  for (int u = 0; u < P; u++)
    if (c + u * KS < nChunks) compute(u, c + u * KS);
  for (c += P * KS; c < nChunks; c += P * KS) {
#pragma unroll
    for (int u = 0; u < P; u++) loadW(u, c + u * KS);
#pragma unroll
    for (int u = 0; u < P; u++)
      if (c + u * KS < nChunks) compute(u, c + u * KS);
  }

  // Split K: stripe 0 adds the partials of stripes 1, 2, ... in that order.
  if (KS > 1) {
    if (ks > 0) {
      float* rp = biRed + (size_t)((ks - 1) * nwn + wn) * NACC * 32 + lane;
#pragma unroll
      for (int t = 0; t < MT; t++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
          for (int i = 0; i < 4; i++) rp[((t * NT + n) * 4 + i) * 32] = acc[t][n][i];
    }
    __syncthreads();
    if (ks > 0) return;
    for (int j = 1; j < KS; j++) {
      const float* rp = biRed + (size_t)((j - 1) * nwn + wn) * NACC * 32 + lane;
#pragma unroll
      for (int t = 0; t < MT; t++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
          for (int i = 0; i < 4; i++) acc[t][n][i] += rp[((t * NT + n) * 4 + i) * 32];
    }
  }

  // Lane (g, q) holds, per n-tile n, outputs o0 + g (i = 0, 1) and o0 + g + 8 (i = 2, 3) of rows
  // 8 n + 2 q + (i & 1). The epilogue is k_gemv_bf16's finish().
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int o = o0 + g + 8 * hh;
    if (o >= outDim) continue;
    const float bo = bias ? ldf(bias, bdt, o) : 0.f;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int j = 0; j < 2; j++) {
        const int r = n * 8 + 2 * q + j;
        if (r >= rows) continue;
        float y = bfr(acc[0][n][2 * hh + j] + bo, bfa);
        if (GLU) y = bfr(bfr(y / (1.f + expf(-y)), bfa) * bfr(acc[MT - 1][n][2 * hh + j], bfa), bfa);
        float* d = out + (size_t)r * outDim + o;
        *d = accumulate ? bfr(*d + y, bfa) : y;
      }
  }
}

// Warps' worth of weight tiles biSplitK aims for: about 16 warps an SM of an H100 (512 and 0,
// no split-K, measured slower). It fixes the bits of batch-invariant matmuls.
constexpr long long BI_TARGET_WARPS = 2048;

// k_gemm_bi's split-K warps (KS), from the shape alone (never the rows, the GPU or the call):
// doubled from 1 while the weight tiles of 16 rows times KS stay under BI_TARGET_WARPS,
// each stripe keeps at least 2 chunks of 64 k, and KS < BI_MAX_KS. Qwen3-8B: qkv, o, down 8,
// gate_up 2, LM head 1; Qwen3-0.6B: 8 but the LM head.
int biSplitK(int inDim, int outDim, bool glu) {
  const long long mtiles = (long long)((outDim + 15) / 16) * (glu ? 2 : 1);
  const int chunks = (inDim + BI_CHUNK - 1) / BI_CHUNK;
  int ks = 1;
  while (ks < BI_MAX_KS && mtiles * ks < BI_TARGET_WARPS && 4 * ks <= chunks) ks *= 2;
  return ks;
}

// One k_gemm_bi launch of nr <= 8 * NT rows. Warps along N a block (NWN): up to 8 warps a block,
// halved while that leaves fewer than two blocks per SM (speed only: NWN does not touch the bits).
template <int NT, bool GLU, int TERMS>
int biLaunch(NervaExec* ex, const float* x, const uint16_t* w, float* out, int nr, int inDim, int outDim, int ks,
             Buf bias, int acc, int bfa, int trig) {
  const int tiles = (outDim + 15) / 16;
  int nwn = std::max(1, BI_MAX_THREADS / 32 / ks);
  while (nwn > 1 && (tiles + nwn - 1) / nwn < 2 * ex->smCount) nwn /= 2;
  const unsigned grid = (unsigned)((tiles + nwn - 1) / nwn);
  const size_t smem = (size_t)(ks - 1) * nwn * (biTiles(GLU) * NT * 4) * 32 * sizeof(float);
  cudaError_t e = allowDynamicSmem(k_gemm_bi<NT, GLU, TERMS>, smem);
  if (e != cudaSuccess) return check(ex, "k_gemm_bi (shared memory opt-in)", e);
  LAUNCH((k_gemm_bi<NT, GLU, TERMS>), grid, 32 * ks * nwn, smem, x, w, out, nr, inDim, outDim, ks, bias.p, bias.dt, acc, bfa,
         trig);
  return NERVA_OK;
}

template <bool GLU, int TERMS>
int biLaunchRows(NervaExec* ex, const float* x, const uint16_t* w, float* out, int nr, int inDim, int outDim, int ks,
                 Buf bias, int acc, int bfa, int trig) {
  if (nr <= 8) return biLaunch<1, GLU, TERMS>(ex, x, w, out, nr, inDim, outDim, ks, bias, acc, bfa, trig);
  if (nr <= 16) return biLaunch<2, GLU, TERMS>(ex, x, w, out, nr, inDim, outDim, ks, bias, acc, bfa, trig);
  if (nr <= 32) return biLaunch<4, GLU, TERMS>(ex, x, w, out, nr, inDim, outDim, ks, bias, acc, bfa, trig);
  return biLaunch<8, GLU, TERMS>(ex, x, w, out, nr, inDim, outDim, ks, bias, acc, bfa, trig);
}

// Batch-invariant decode's matmul (matmulRows with ex->batchInv, see k_gemm_bi): up to 64 rows a
// launch, each launch reading the weights once. The norm (if any) first, per launch's rows, as
// k_rmsnorm_gemv into the workspace with the block size of the one-row GEMV (the bits of the
// GEMV's staged norm, for any rows); fewer rows a launch when the workspace holds fewer normalized
// rows. The caller checked: bf16 weights, inDim % 16 == 0, W, x (and nw) 16-byte aligned, and
// with a norm, one row fits the workspace.
int gemmBiRows(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias,
               const Fuse& f) {
  const int bfa = ex->bf16act ? 1 : 0, acc = f.accumulate ? 1 : 0, trig = f.early ? 1 : 0;
  const int ks = biSplitK(inDim, outDim, f.glu);
  int maxR = BI_MAX_ROWS;
  int normThreads = 0;
  if (f.nw.p) {
    maxR = (int)std::min<size_t>((size_t)maxR, ex->wsBytes / ((size_t)inDim * sizeof(float)));
    if (maxR < 1) return bad(ex, "fused_matmul: workspace too small");
    // the GEMV's one-row block: split (4 warps) for few outputs, else 16 warps.
    const bool split = (size_t)outDim * (f.glu ? 2 : 1) < (size_t)ex->smCount * 16 && inDim >= 1024;
    normThreads = 32 * gemvWarps(split ? 4 : 1);
  }
  const int nwbf = f.nw.dt == NV_BF16 ? 1 : 0;
  const uint16_t* wp = (const uint16_t*)w.p;
  for (int r0 = 0; r0 < rows; r0 += maxR) {
    const int nr = std::min(maxR, rows - r0);
    const float* xr = x + (size_t)r0 * inDim;
    if (f.nw.p) {
      int rc = launchRmsnormGemv(ex, nr, normThreads, xr, f.nw.p, nwbf, (float*)ex->ws, inDim, f.eps);
      if (rc) return rc;
      xr = (const float*)ex->ws;
    }
    float* orow = out + (size_t)r0 * outDim;
    // Matmul precision bf16: operands rounded once (one term), as the many-row GEMMs of that mode.
    const bool one = ex->gemmMode == GEMM_BF16;
    int rc = f.glu ? (one ? biLaunchRows<true, 1>(ex, xr, wp, orow, nr, inDim, outDim, ks, bias, acc, bfa, trig)
                          : biLaunchRows<true, 3>(ex, xr, wp, orow, nr, inDim, outDim, ks, bias, acc, bfa, trig))
                   : (one ? biLaunchRows<false, 1>(ex, xr, wp, orow, nr, inDim, outDim, ks, bias, acc, bfa, trig)
                          : biLaunchRows<false, 3>(ex, xr, wp, orow, nr, inDim, outDim, ks, bias, acc, bfa, trig));
    if (rc) return rc;
  }
  return NERVA_OK;
}

}  // namespace nerva::ops
