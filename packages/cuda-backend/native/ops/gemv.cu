// GEMV kernels (few rows): warp-per-output bf16 weight streams with fp32 accumulation.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/ops.h"

namespace nerva::ops {

// ---------------------------------------------------------------- GEMV (few rows)

// nw[4j..4j+3] (bf16 or f32) as floats.
__device__ __forceinline__ float4 loadNw4(const void* nw, int nwbf, int j) {
  if (nwbf) {
    uint2 t = __ldg(reinterpret_cast<const uint2*>(nw) + j);
    return make_float4(__uint_as_float(t.x << 16), __uint_as_float(t.x & 0xffff0000u), __uint_as_float(t.y << 16),
                       __uint_as_float(t.y & 0xffff0000u));
  }
  return __ldg(reinterpret_cast<const float4*>(nw) + j);
}

// v = v * inv * g (g = nw[4j..4j+3]): the scaling step of RMSNorm on staged rows.
__device__ __forceinline__ void normScale4g(float4& v, float inv, float4 g, int bfa) {
  v.x = bfr(bfr(v.x * inv, bfa) * g.x, bfa);
  v.y = bfr(bfr(v.y * inv, bfa) * g.y, bfa);
  v.z = bfr(bfr(v.z * inv, bfa) * g.z, bfa);
  v.w = bfr(bfr(v.w * inv, bfa) * g.w, bfa);
}

// v = v * inv * nw[4j..4j+3] (nw bf16 or f32): the scaling step of RMSNorm on staged rows.
__device__ __forceinline__ void normScale4(float4& v, float inv, const void* nw, int nwbf, int j, int bfa = 0) {
  normScale4g(v, inv, loadNw4(nw, nwbf, j), bfa);
}


// The GEMV's 8-term dot product of one 16-byte chunk of bf16 weights with 8 activations, summed
// left to right and then added to the accumulator by the caller: one expression for every GEMV
// kernel, so the compiler's FMA contraction (hence the bits) is the same in all of them.
__device__ __forceinline__ float dot8bf16(const uint4& q, const float (&xv)[8]) {
  return __uint_as_float(q.x << 16) * xv[0] + __uint_as_float(q.x & 0xffff0000u) * xv[1] +
         __uint_as_float(q.y << 16) * xv[2] + __uint_as_float(q.y & 0xffff0000u) * xv[3] +
         __uint_as_float(q.z << 16) * xv[4] + __uint_as_float(q.z & 0xffff0000u) * xv[5] +
         __uint_as_float(q.w << 16) * xv[6] + __uint_as_float(q.w & 0xffff0000u) * xv[7];
}

// Warps per block of k_gemv_bf16. Unsplit blocks are 16 outputs wide, so NORM's staged rows are
// read once per 16 outputs rather than per 4 (per 4 outputs the staging cost the Qwen3-8B shape
// ~4 % of roofline; at 16 it ran at 90 %), and plain GEMVs gained too (H100: 8B down 87 -> 95 %
// of copy bandwidth, qkv 78 -> 86 %). Split blocks stay one output of 4 warps: 4 outputs of 16
// warps measured slightly slower for the 0.6B o and down projections (2-3 warps with Fuse::early).
constexpr int GEMV_MAX_THREADS = 512;  // (gemvWarps: ops.h)
// With O > 1 outputs a warp (which never stages a norm, so its block size is free): unsplit
// blocks of 4 warps (4 * O outputs; 16 warps would leave the 8B shapes under 132 blocks), split
// blocks of KS warps (O outputs). At least GEMV_MULTI_MIN_BLOCKS such blocks an SM: the R = 16
// kernels then take <= 168 registers (162, no spills, nvcc 13 sm_90; with 2: ~179 and 8 warps an
// SM instead of 12). O == 1 keeps __launch_bounds__(GEMV_MAX_THREADS) alone (minBlocks 0 is
// "unspecified"; an explicit 1 changes the batch-1 kernels' register allocation).
constexpr int GEMV_MULTI_WARPS = 4;
constexpr int GEMV_MULTI_MIN_BLOCKS = 3;
__host__ __device__ constexpr int gemvWarpsO(int ks, int o) { return o == 1 ? gemvWarps(ks) : ks == 1 ? GEMV_MULTI_WARPS : ks; }
__host__ __device__ constexpr int gemvThreadsMax(int ks, int o) { return o == 1 ? GEMV_MAX_THREADS : 32 * gemvWarpsO(ks, o); }
__host__ __device__ constexpr int gemvMinBlocks(int o) { return o == 1 ? 0 : GEMV_MULTI_MIN_BLOCKS; }

// One warp per output feature (O consecutive outputs with O > 1), R activation rows at once so
// every weight byte is read once. Weights stream with 16-byte loads, P chunks of each of the
// warp's NO = O (2 * O with GLU) weight rows in flight per lane before any math (P = 4, or
// 8 / NO when NO > 2). Each activation chunk is loaded once per row and applied to all NO rows,
// so the activation traffic through L1/L2 per weight byte is R / NO times that of one row.
// KS warps share one output group (split over K) when there are too few outputs to fill the GPU.
// Bits: for each (row, output) the lane's chunks (k = lane + ks * 32, step 32 * KS, ascending),
// the 8-term dot expression, the warp sum, the KS reduction and finish() are the same for every
// R and O, so a row's result does not depend on how many rows or outputs share the launch.
// Fusions (op fused_matmul): NORM (O == 1 only): the block computes each row's sum of squares once
// and stages the normalized rows x * inv * nw in shared memory (dynamic, R * inDim floats) while
// its first weight loads are in flight; the warps then read activations from there, so the norm
// adds no per-weight work and fuses at any matrix size. GLU: the warp also reduces the up rows
// o + outDim and writes silu(gate) * up; `accumulate` adds the result into out.
#define GEMV_BF16_PARAMS                                                                                            \
  const float *__restrict__ x, const uint16_t *__restrict__ w, float *__restrict__ out, int rows, int inDim, int outDim, \
      const void *bias, int bdt, const void *nw, int nwbf, float eps, int accumulate, int bfa, int accPre, int trig
#define GEMV_BF16_ARGS x, w, out, rows, inDim, outDim, bias, bdt, nw, nwbf, eps, accumulate, bfa, accPre, trig
// The body of k_gemv_bf16 and k_gemv_bf16_lean (the same code under two register bounds).
// EMB (R == 1 with NORM, k_gemv_bf16_lean_embed): the row is gathered from the bf16 embedding
// table etab at row eids[0] (op embedding's values, bf16-rounded under bfa) instead of read from
// x, and block 0 writes it to eout (the residual stream), so the step's embedding is no kernel of
// its own (see opDecoderLayers).
template <int R, int KS, bool NORM, bool GLU, int O, bool EMB = false>
__device__ __forceinline__ void gemvBf16(GEMV_BF16_PARAMS, const uint16_t* etab = nullptr, const int* eids = nullptr,
                                         float* eout = nullptr) {
  static_assert(!EMB || (R == 1 && NORM), "k_gemv_bf16: EMB only for one normed row");
  // NORM's staged sums of squares depend on the block size: with O > 1 the norm runs first, as
  // k_rmsnorm_gemv with the O == 1 block size (see matmulRows).
  static_assert(O == 1 || !NORM, "k_gemv_bf16: NORM only with O == 1");
  static_assert(KS == 1 || O * R <= 32 * KS, "k_gemv_bf16: one thread per (output, row) of a split block");
  // trig: let the next kernel launch now rather than after our wait (see Fuse::early).
  if (trig) pdlTrigger();
  constexpr int NO = O * (GLU ? 2 : 1);  // weight rows a warp: gates o..o+O-1, then (GLU) ups
  constexpr int P = NO <= 2 ? 4 : 8 / NO;  // chunks of each weight row in flight per lane
  constexpr int NW = gemvWarpsO(KS, O);
  __shared__ float red[NW][NO][R];
  __shared__ float ssw[NW][R];
  __shared__ float invs[R];
  extern __shared__ float4 xs[];  // NORM only: row r's float4 j = 2k + h at xs[r * n4 + h * n8 + k]
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int ks = warp % KS;
  // TILES (one row, one output a warp, unsplit): a launch of fewer blocks than tiles of NW
  // outputs (one wave, gemvLaunch) has each block take tiles blockIdx.x, + gridDim.x, ...: the
  // norm is staged once a block and an SM's weight stream does not stop between waves. Each
  // output's arithmetic is the same, so the same bits.
  constexpr bool TILES = R == 1 && KS == 1 && O == 1 && !EMB;
  const int tiles = (outDim + NW / KS * O - 1) / (NW / KS * O);
  int o, o0;
  bool live;
  const uint4* wr[NO];
  // A warp past the last output (KS == 1, last block) still joins the block's barriers; it
  // streams the last row again and writes nothing. With O > 1, outputs of the warp past the
  // last stream the last row and write nothing.
  auto place = [&](int blk) {
    o = (blk * (NW / KS) + warp / KS) * O;
    live = o < outDim;
    o0 = o;  // the warp's first output, unclamped (O > 1: output o0 + n is live iff < outDim)
    if (!live) o = outDim - 1;
#pragma unroll
    for (int n = 0; n < O; n++) {
      const int on = O == 1 ? o : min(o0 + n, outDim - 1);
      wr[n] = reinterpret_cast<const uint4*>(w + (size_t)on * inDim);
      if (GLU) wr[NO - O + n] = reinterpret_cast<const uint4*>(w + (size_t)(on + outDim) * inDim);
    }
  };
  place(blockIdx.x);
  const int n8 = inDim >> 3, n4 = inDim >> 2;
  float acc[NO][R];

  // The same expression per (weight row, activation row) for every R and O: the compiler's
  // contraction into FMAs, hence the bits, must not depend on them.
  auto fma8 = [&](const uint4* q, int k8) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      if (r < rows) {
        float4 a, b;
        if (NORM) {
          a = xs[r * n4 + k8];
          b = xs[r * n4 + n8 + k8];
        } else {
          const float4* xr = reinterpret_cast<const float4*>(x + (size_t)r * inDim) + k8 * 2;
          a = __ldg(xr);
          b = __ldg(xr + 1);
        }
        float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int n = 0; n < NO; n++) {
          const uint4& qq = q[n];
          acc[n][r] += dot8bf16(qq, xv);
        }
      }
    }
  };

  // accPre (with accumulate): `out` was last written at least two kernels before this one, so it
  // is complete once this kernel runs (the kernel just before triggers it only after its own
  // wait) and the values to accumulate into are read before the wait. The caller vouches.
  // O == 1: lane 0 holds row r's value in pre[r] (split: thread r in preLane). O > 1: the
  // (output n, row r) pair p = n * R + r is held and finished by lane p % 32 in slot p / 32
  // (split: thread p in preLane).
  constexpr int NP = O == 1 ? 1 : (O * R + 31) / 32;
  float pre[O == 1 ? R : NP], preLane = 0.f;
#pragma unroll
  for (int r = 0; r < (O == 1 ? R : NP); r++) pre[r] = 0.f;

  // RMSNorm of the block's R rows into xs: squares (raw rows staged), one block reduction, scale.
  // The thread's first chunk of norm weights (nw0) is loaded before the dependency wait.
  float4 nw0 = make_float4(0.f, 0.f, 0.f, 0.f);
  auto stageNorm = [&]() {
    // One row, at most one float4 a thread (the 0.6B's 1024-wide rows under 512 threads): the
    // thread keeps its float4 in registers, every thread sums the warps' squares itself (the same
    // sum in the same order as thread 0 below) and writes its float4 scaled: one barrier fewer and
    // no write-back pass through shared memory between the reduction and the GEMV, the same bits.
    if constexpr (R == 1) {
      if (n4 <= (int)blockDim.x) {  // (always with EMB: gemvLeanNormOneRow checked it)
        const int j = threadIdx.x;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        float s1 = 0.f;
        if (j < n4) {
          if constexpr (EMB) {
            const uint2 t = reinterpret_cast<const uint2*>(etab + (size_t)eids[0] * inDim)[j];
            v = make_float4(bfr(__uint_as_float(t.x << 16), bfa), bfr(__uint_as_float(t.x & 0xffff0000u), bfa),
                            bfr(__uint_as_float(t.y << 16), bfa), bfr(__uint_as_float(t.y & 0xffff0000u), bfa));
            if (blockIdx.x == 0) reinterpret_cast<float4*>(eout)[j] = v;
          } else {
            v = reinterpret_cast<const float4*>(x)[j];
          }
          s1 = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        s1 = warpSum(s1);
        if (lane == 0) ssw[warp][0] = s1;
        __syncthreads();
        float t = 0.f;
        for (int i = 0; i < NW; i++) t += ssw[i][0];
        if (j < n4) {
          normScale4g(v, rsqrtf(t / (float)inDim + eps), nw0, bfa);
          xs[(j & 1) * n8 + (j >> 1)] = v;
        }
        __syncthreads();
        return;
      }
    }
    // (Not with EMB: its row is always one float4 a thread.)
    if constexpr (!EMB) {
      float ss[R];
#pragma unroll
      for (int r = 0; r < R; r++) {
        ss[r] = 0.f;
        if (r < rows) {
          const float4* xr = reinterpret_cast<const float4*>(x + (size_t)r * inDim);
          for (int j = threadIdx.x; j < n4; j += blockDim.x) {
            float4 v = xr[j];
            ss[r] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            xs[r * n4 + (j & 1) * n8 + (j >> 1)] = v;
          }
        }
        ss[r] = warpSum(ss[r]);
        if (lane == 0) ssw[warp][r] = ss[r];
      }
      __syncthreads();
      if (threadIdx.x < R) {
        float t = 0.f;
        for (int j = 0; j < NW; j++) t += ssw[j][threadIdx.x];
        invs[threadIdx.x] = rsqrtf(t / (float)inDim + eps);
      }
      __syncthreads();
#pragma unroll
      for (int r = 0; r < R; r++) {
        if (r < rows) {
          float inv = invs[r];
          for (int j = threadIdx.x; j < n4; j += blockDim.x) {
            float4 g = j == (int)threadIdx.x ? nw0 : loadNw4(nw, nwbf, j);
            normScale4g(xs[r * n4 + (j & 1) * n8 + (j >> 1)], inv, g, bfa);
          }
        }
      }
      __syncthreads();
    }
  };

  constexpr int ST = 32 * KS;
  for (int blk = blockIdx.x; blk < tiles; blk += gridDim.x) {
  const bool first = blk == (int)blockIdx.x;
  if (!first) place(blk);
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int n = 0; n < NO; n++) acc[n][r] = 0.f;
  int k = lane + ks * 32;
  // The weights do not depend on the previous kernel: the first group of loads (with P = 4 the
  // whole tile of a 1024-wide row) is issued before the dependency wait, so under PDL it
  // streams while the previous kernel drains (and while NORM stages its rows).
  {
    uint4 q[P][NO];
#pragma unroll
    for (int u = 0; u < P; u++)
#pragma unroll
      for (int n = 0; n < NO; n++)
        if (k + u * ST < n8) q[u][n] = __ldcs(wr[n] + k + u * ST);
    if (NORM && first && (int)threadIdx.x < n4) nw0 = loadNw4(nw, nwbf, threadIdx.x);
    if (accPre) {
      // The values this GEMV accumulates into, read before the wait (see accPre above).
      if constexpr (O == 1) {
        if (KS == 1) {
#pragma unroll
          for (int r = 0; r < R; r++)
            if (lane == 0 && r < rows) pre[r] = __ldcg(out + (size_t)r * outDim + o);
        } else if (warp == 0 && lane < R && lane < rows) {
          preLane = __ldcg(out + (size_t)lane * outDim + o);
        }
      } else if (KS == 1) {
#pragma unroll
        for (int s = 0; s < NP; s++) {
          const int p = s * 32 + lane, n = p / R, r = p % R;
          if (p < O * R && r < rows && o0 + n < outDim) pre[s] = __ldcg(out + (size_t)r * outDim + o0 + n);
        }
      } else {
        const int p = threadIdx.x, n = p / R, r = p % R;
        if (p < O * R && r < rows && o0 + n < outDim) preLane = __ldcg(out + (size_t)r * outDim + o0 + n);
      }
    }
    if (first) {
      pdlWait();
      pdlTrigger();
      if (NORM) stageNorm();
    }
#pragma unroll
    for (int u = 0; u < P; u++)
      if (k + u * ST < n8) fma8(q[u], k + u * ST);
    k += P * ST;
  }
  for (; k + (P - 1) * ST < n8; k += P * ST) {
    uint4 q[P][NO];
#pragma unroll
    for (int u = 0; u < P; u++)
#pragma unroll
      for (int n = 0; n < NO; n++) q[u][n] = __ldcs(wr[n] + k + u * ST);
#pragma unroll
    for (int u = 0; u < P; u++) fma8(q[u], k + u * ST);
  }
  for (; k < n8; k += ST) {
    uint4 q[NO];
#pragma unroll
    for (int n = 0; n < NO; n++) q[n] = __ldcs(wr[n] + k);
    fma8(q, k);
  }
  // Output oo's epilogue: bias (bo), silu(gate) * up with GLU, accumulate into prev (accPre) or out.
  auto finish = [&](int oo, float bo, int r, float g, float u, float prev) {
    float y = bfr(g + bo, bfa);
    if (GLU) y = bfr(bfr(y / (1.f + expf(-y)), bfa) * bfr(u, bfa), bfa);
    // (O == 1: o, not oo, keeps the batch-1 kernels' code as it was: same registers, same SASS.)
    float* d = out + (size_t)r * outDim + (O == 1 ? o : oo);
    *d = accumulate ? bfr((accPre ? prev : *d) + y, bfa) : y;
  };
  if constexpr (O == 1) {
    float bo = bias ? ldf(bias, bdt, o) : 0.f;
#pragma unroll
    for (int r = 0; r < R; r++) {
      float v0 = warpSum(acc[0][r]);
      float v1 = GLU ? warpSum(acc[NO - 1][r]) : 0.f;
      if (KS == 1) {
        if (live && lane == 0 && r < rows) finish(o, bo, r, v0, v1, pre[r]);
      } else if (lane == 0) {
        red[warp][0][r] = v0;
        if (GLU) red[warp][1][r] = v1;
      }
    }
    if (KS > 1) {
      // The block is one output (the grid has exactly outDim blocks).
      __syncthreads();
      if (warp == 0 && lane < R && lane < rows) {
        float g = 0.f, u = 0.f;
        for (int j = 0; j < KS; j++) {
          g += red[j][0][lane];
          if (GLU) u += red[j][1][lane];
        }
        finish(o, bo, lane, g, u, preLane);
      }
    }
  } else {
    // O > 1. Unsplit: the warp sums land on the lane that finishes the pair (every lane of a
    // butterfly warpSum holds the same bits). Split: the block is O outputs; thread p = n * R + r
    // sums pair p's KS partials in warp order.
    float gv[NP], uv[NP];
#pragma unroll
    for (int s = 0; s < NP; s++) gv[s] = uv[s] = 0.f;
#pragma unroll
    for (int n = 0; n < O; n++)
#pragma unroll
      for (int r = 0; r < R; r++) {
        if (r < rows) {
          float v0 = warpSum(acc[n][r]);
          float v1 = GLU ? warpSum(acc[NO - O + n][r]) : 0.f;
          if (KS == 1) {
            const int p = n * R + r;
            if (lane == (p & 31)) {
              gv[p >> 5] = v0;
              uv[p >> 5] = v1;
            }
          } else if (lane == 0) {
            red[warp][n][r] = v0;
            if (GLU) red[warp][NO - O + n][r] = v1;
          }
        }
      }
    if (KS == 1) {
#pragma unroll
      for (int s = 0; s < NP; s++) {
        const int p = s * 32 + lane, n = p / R, r = p % R;
        if (p < O * R && r < rows && o0 + n < outDim)
          finish(o0 + n, bias ? ldf(bias, bdt, o0 + n) : 0.f, r, gv[s], uv[s], pre[s]);
      }
    } else {
      __syncthreads();
      const int p = threadIdx.x, n = p / R, r = p % R;
      if (p < O * R && r < rows && o0 + n < outDim) {
        float g = 0.f, u = 0.f;
        for (int j = 0; j < KS; j++) {
          g += red[j][n][r];
          if (GLU) u += red[j][NO - O + n][r];
        }
        finish(o0 + n, bias ? ldf(bias, bdt, o0 + n) : 0.f, r, g, u, preLane);
      }
    }
  }
  if constexpr (!TILES) break;
  }
}

template <int R, int KS, bool NORM, bool GLU, int O = 1>
__global__ void __launch_bounds__(gemvThreadsMax(KS, O), gemvMinBlocks(O)) k_gemv_bf16(GEMV_BF16_PARAMS) {
  NERVA_TRACE_KERNEL();
  gemvBf16<R, KS, NORM, GLU, O>(GEMV_BF16_ARGS);
}

// The one-row normed projection at batch 1 (qkv) in at most 48 registers a thread (51 unbounded,
// 12 bytes spilled): two of its 512-thread blocks an SM then leave 16 K registers, room for a
// block of the cluster attention that follows it (k_attn_decode_short: 128 threads of at most 128
// registers), which is then resident, copies its keys and passes its prologue while qkv still
// runs instead of after it (qkv's release lag 2.1 -> 0.5 us, 1.02x decode on the H100). Same
// code, same bits.
constexpr int GEMV_LEAN_REGS = 48;
template <int R, int KS, bool NORM, bool GLU, int O = 1>
__global__ void __maxnreg__(GEMV_LEAN_REGS) k_gemv_bf16_lean(GEMV_BF16_PARAMS) {
  NERVA_TRACE_KERNEL();
  gemvBf16<R, KS, NORM, GLU, O>(GEMV_BF16_ARGS);
}
// The first layer's qkv of a one-row op decoder_layers with embed: k_gemv_bf16_lean with the
// row gathered from the embedding table (gemvBf16's EMB).
__global__ void __maxnreg__(GEMV_LEAN_REGS) k_gemv_bf16_lean_embed(GEMV_BF16_PARAMS, const uint16_t* etab, const int* eids,
                                                                  float* eout) {
  NERVA_TRACE_KERNEL();
  gemvBf16<1, 1, true, false, 1, true>(GEMV_BF16_ARGS, etab, eids, eout);
}

// One row (GEMV_WIDE_OUTPUTS): k_gemv_bf16<1, KS>'s split projection with OPB outputs a block and the
// input staged once in shared memory, so the input crosses from L2 once per block instead of
// once per output: at batch 1, o's and down's 1024 one-output blocks each read the whole 8-12 KB
// input right after their dependency wait, 8-13 MB on the critical path (qkv and gate_up, which
// read about 1 MB, had the shortest shares of a layer). The same bits: per output the same lane
// chunks, expression, warp sum and KS reduction.
template <int KS, int OPB>
__global__ void __launch_bounds__(32 * KS * OPB) k_gemv_wide(const float* __restrict__ x, const uint16_t* __restrict__ w,
                                                             float* __restrict__ out, int inDim, int outDim, const void* bias,
                                                             int bdt, int acc, int bfa, int accPre, int trig) {
  NERVA_TRACE_KERNEL();
  if (trig) pdlTrigger();
  constexpr int NW = KS * OPB, P = 4, ST = 32 * KS;
  extern __shared__ float4 xs[];  // float4 j at (j & 1) * n8 + (j >> 1), as k_gemv_bf16's NORM staging
  __shared__ float red[NW];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n8 = inDim >> 3;
  int o = blockIdx.x * OPB + warp / KS;
  const int ks = warp % KS;
  const bool live = o < outDim;
  if (!live) o = outDim - 1;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)o * inDim);
  int k = lane + ks * 32;
  uint4 q[P];
#pragma unroll
  for (int u = 0; u < P; u++)
    if (k + u * ST < n8) q[u] = __ldcs(wr + k + u * ST);
  float preLane = 0.f;
  if (accPre && ks == 0 && lane == 0) preLane = __ldcg(out + o);
  pdlWait();
  pdlTrigger();
  for (int j = threadIdx.x; j < (inDim >> 2); j += blockDim.x)
    xs[(j & 1) * n8 + (j >> 1)] = __ldg(reinterpret_cast<const float4*>(x) + j);
  __syncthreads();
  float a = 0.f;
  auto fma8 = [&](const uint4& qq, int k8) {
    const float4 p0 = xs[k8], p1 = xs[n8 + k8];
    float xv[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
    a += dot8bf16(qq, xv);
  };
#pragma unroll
  for (int u = 0; u < P; u++)
    if (k + u * ST < n8) fma8(q[u], k + u * ST);
  for (k += P * ST; k < n8; k += ST) fma8(__ldcs(wr + k), k);
  const float v0 = warpSum(a);
  if (lane == 0) red[warp] = v0;
  __syncthreads();
  if (ks == 0 && lane == 0 && live) {
    float g = v0;
    if (KS > 1) {
      g = 0.f;
      for (int j = 0; j < KS; j++) g += red[warp + j];
    }
    const float bo = bias ? ldf(bias, bdt, o) : 0.f;
    const float y = bfr(g + bo, bfa);
    float* d = out + o;
    *d = acc ? bfr((accPre ? preLane : *d) + y, bfa) : y;
  }
}

// RMSNorm of one row per block into `out`, bit for bit what k_gemv_bf16's NORM staging computes
// for that row when launched with the GEMV's block size (32 * gemvWarps(KS) threads): the same
// per-thread float4 partial sums, warp sums and warp-ordered total, the same scaling. The GEMV
// takes this path when the staged rows do not fit its shared memory, and always with O > 1
// outputs a warp (other block sizes), so the norm's bits do not depend on how many rows share
// the call. inDim % 4 == 0, x and nw 16-byte aligned.
__global__ void k_rmsnorm_gemv(const float* x, const void* nw, int nwbf, float* out, int inDim, float eps, int bfa) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  __shared__ float ssw[GEMV_MAX_THREADS / 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nWarps = blockDim.x >> 5;
  const int n4 = inDim >> 2;
  const float4* xr = reinterpret_cast<const float4*>(x + (size_t)blockIdx.x * inDim);
  float ss = 0.f;
  for (int j = threadIdx.x; j < n4; j += blockDim.x) {
    float4 v = xr[j];
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  ss = warpSum(ss);
  if (lane == 0) ssw[warp] = ss;
  __syncthreads();
  float t = 0.f;
  for (int j = 0; j < nWarps; j++) t += ssw[j];
  const float inv = rsqrtf(t / (float)inDim + eps);
  float4* o = reinterpret_cast<float4*>(out + (size_t)blockIdx.x * inDim);
  for (int j = threadIdx.x; j < n4; j += blockDim.x) {
    float4 v = xr[j];
    normScale4g(v, inv, loadNw4(nw, nwbf, j), bfa);
    o[j] = v;
  }
}

// Any dtype, any alignment: one warp per (row, output), with the same fusions as k_gemv_bf16.
__global__ void k_gemv_generic(const float* x, const void* w, int wdt, float* out, int rows, int inDim, int outDim,
                               const void* bias, int bdt, const void* nw, int nwdt, float eps, int glu, int accumulate,
                               int bfa) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int o = blockIdx.x * 4 + warp;
  int r = blockIdx.y;
  if (o >= outDim) return;
  const float* xr = x + (size_t)r * inDim;
  float g = 0.f, u = 0.f, sq = 0.f;
  for (int i = lane; i < inDim; i += 32) {
    float xv = xr[i];
    if (nw) {
      sq += xv * xv;
      xv *= ldf(nw, nwdt, i);
    }
    g += xv * ldf(w, wdt, (size_t)o * inDim + i);
    if (glu) u += xv * ldf(w, wdt, (size_t)(o + outDim) * inDim + i);
  }
  g = warpSum(g);
  if (glu) u = warpSum(u);
  if (nw) sq = warpSum(sq);
  if (lane == 0) {
    float inv = nw ? rsqrtf(sq / (float)inDim + eps) : 1.f;
    // (bf16 numerics never get here with nw: the rounded norm runs as k_rmsnorm first.)
    float y = bfr(g * inv + (bias ? ldf(bias, bdt, o) : 0.f), bfa);
    if (glu) y = bfr(bfr(y / (1.f + expf(-y)), bfa) * bfr(u * inv, bfa), bfa);
    float* d = out + (size_t)r * outDim + o;
    *d = accumulate ? bfr(*d + y, bfa) : y;
  }
}

// Whether gemvRun runs this call as k_gemv_bf16_lean<1, 1, true, false, 1> (one row, staged
// norm, unsplit, at most two blocks an SM, one float4 of the row a thread): the one kernel that
// gathers an embedded row itself. Mirrors gemvRun's choice for that shape.
bool gemvLeanNormOneRow(NervaExec* ex, const float* x, Buf w, int rows, int inDim, int outDim, const Fuse& f) {
  if (rows != 1 || ex->batchInv || !f.nw.p || f.glu) return false;
  const bool nwOk = (f.nw.dt == NV_BF16 || f.nw.dt == NV_F32) && ((uintptr_t)f.nw.p & 15) == 0;
  if (!(w.dt == NV_BF16 && inDim % 8 == 0 && ((uintptr_t)w.p & 15) == 0 && ((uintptr_t)x & 15) == 0 && nwOk)) return false;
  if ((size_t)outDim < (size_t)ex->smCount * 16 && inDim >= 1024) return false;  // split
  if ((size_t)inDim * sizeof(float) > 48 * 1024 || (size_t)inDim * sizeof(float) > ex->wsBytes) return false;
  const int threads = 32 * gemvWarps(1);
  const unsigned grid = (unsigned)((outDim + gemvWarps(1) - 1) / gemvWarps(1));
  return grid <= 2u * (unsigned)ex->smCount && inDim / 4 <= threads;
}

// Rows of one k_gemv_bf16 launch. Numerics do not depend on it (a row's reduction order is the
// same for every R); speed does: 16 reads the weights once per 16 rows (8 measured slower).
constexpr int GEMV_MAX_ROWS = 16;

// Outputs a warp of k_gemv_bf16 computes (O), by the launch's rows R (1, 2, 4, 8, 16) and GLU.
// At R rows a warp's activation loads per weight byte scale as R / NO (NO = O, or 2 * O weight
// rows with GLU): at R = 16 and O = 1 the x traffic through L1/L2, not the weight stream, bound
// the kernel (an 8B step of 32 rows took 100 ms against 7 for one row). R = 1 keeps O = 1 (~95 %
// of copy bandwidth already); otherwise NO * R <= 64 accumulators a lane. Numerics do not
// depend on O (each (row, output) pair is computed as at R = 1, O = 1).
__host__ __device__ constexpr int gemvOuts(int R, bool glu) { return R == 1 ? 1 : R <= 4 ? 2 : glu ? 2 : 4; }
// One-row split projections (o and down at batch 1) run k_gemv_wide with this many outputs a
// block: H100, 0.6B, batch 1, alternating: 1388-1396 tok/s a block an output (k_gemv_bf16),
// 1420-1428 with 4 outputs a block, 1430-1437 with 8; the same tokens.
constexpr int GEMV_WIDE_OUTPUTS = 8;

// One k_gemv_bf16 launch's arguments.
struct GemvLaunch {
  const float* x;
  const uint16_t* w;
  float* out;
  int rows, inDim, outDim;
  const void* bias;
  int bdt;
  const void* nw;
  int nwbf;
  float eps;
  int acc, bfa, accPre, trig;
  size_t smem;
  // Fuse::embed, passed on only where gemvLeanNormOneRow holds (the lean kernel folds it).
  const uint16_t* etab = nullptr;
  const int* eids = nullptr;
  float* eout = nullptr;
};

// Blocks of `kernel` that fit the GPU at once (one wave).
template <typename K>
static unsigned gemvWave(NervaExec* ex, K kernel, int threads, size_t smem) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  return (unsigned)std::max(n, 1) * (unsigned)ex->smCount;
}

// One-row normed projections of at most two blocks an SM run k_gemv_bf16_lean (qkv at batch 1;
// not the LM head, many waves, which the register bound slowed by 4 %). One-row launches of more
// tiles than a wave take one wave, each block looping over tiles (gemvBf16's TILES).
template <int R, int KS, bool N, bool G, int O>
int gemvLaunch(NervaExec* ex, const GemvLaunch& a) {
  constexpr int perBlock = gemvWarpsO(KS, O) / KS * O;  // outputs a block
  unsigned grid = (unsigned)((a.outDim + perBlock - 1) / perBlock);
  if constexpr (R == 1 && KS == 1 && N && !G && O == 1) {
    if (grid <= 2u * (unsigned)ex->smCount) {
      if (a.etab) {
        LAUNCH(k_gemv_bf16_lean_embed, grid, 32 * gemvWarpsO(KS, O), a.smem, a.x, a.w, a.out, a.rows, a.inDim, a.outDim,
               a.bias, a.bdt, a.nw, a.nwbf, a.eps, a.acc, a.bfa, a.accPre, a.trig, a.etab, a.eids, a.eout);
        return NERVA_OK;
      }
      LAUNCH((k_gemv_bf16_lean<1, 1, true, false, 1>), grid, 32 * gemvWarpsO(KS, O), a.smem, a.x, a.w, a.out, a.rows,
             a.inDim, a.outDim, a.bias, a.bdt, a.nw, a.nwbf, a.eps, a.acc, a.bfa, a.accPre, a.trig);
      return NERVA_OK;
    }
  }
  if (a.etab) return bad(ex, "fused_matmul: embed reached a kernel that does not gather (gemvLeanNormOneRow)");
  if constexpr (R == 1 && KS == 1 && O == 1)
    grid = std::min(grid, gemvWave(ex, k_gemv_bf16<R, KS, N, G, O>, 32 * gemvWarpsO(KS, O), a.smem));
  LAUNCH((k_gemv_bf16<R, KS, N, G, O>), grid, 32 * gemvWarpsO(KS, O), a.smem,
         a.x, a.w, a.out, a.rows, a.inDim, a.outDim, a.bias, a.bdt, a.nw, a.nwbf, a.eps, a.acc, a.bfa, a.accPre, a.trig);
  return NERVA_OK;
}

template <int R, int KS, int O>
int gemvNG(NervaExec* ex, const GemvLaunch& a, bool norm, bool glu) {
  if constexpr (O == 1) {
    if (norm && glu) return gemvLaunch<R, KS, true, true, 1>(ex, a);
    if (norm) return gemvLaunch<R, KS, true, false, 1>(ex, a);
  }
  if (glu) return gemvLaunch<R, KS, false, true, O>(ex, a);
  return gemvLaunch<R, KS, false, false, O>(ex, a);
}

// The launch of R (padded) rows: ks as matmulRows chose it (1, 2 or 3 lean, 4); norm: staged in
// the kernel (O == 1 only); else O = gemvOuts(R, glu).
template <int R>
int gemvPick(NervaExec* ex, const GemvLaunch& a, int ks, bool norm, bool glu) {
  constexpr int OP = gemvOuts(R, false), OG = gemvOuts(R, true);
  if constexpr (OP > 1 && OG > 1) {
    if (!norm) {
      if (glu) return ks != 1 ? gemvLaunch<R, 4, false, true, OG>(ex, a) : gemvLaunch<R, 1, false, true, OG>(ex, a);
      switch (ks) {
        case 1: return gemvLaunch<R, 1, false, false, OP>(ex, a);
        case 2: return gemvLaunch<R, 2, false, false, OP>(ex, a);
        case 3: return gemvLaunch<R, 3, false, false, OP>(ex, a);
        default: return gemvLaunch<R, 4, false, false, OP>(ex, a);
      }
    }
  }
  if (ks == 2 && !norm && !glu) return gemvLaunch<R, 2, false, false, 1>(ex, a);
  if (ks == 3 && !norm && !glu) return gemvLaunch<R, 3, false, false, 1>(ex, a);
  return ks != 1 ? gemvNG<R, 4, 1>(ex, a, norm, glu) : gemvNG<R, 1, 1>(ex, a, norm, glu);
}

// The GEMV kernels for what matmulRows gives them: up to 16 rows a k_gemv_bf16 launch
// (GEMV_MAX_ROWS), each warp O outputs (gemvOuts). What fixes a row's bits, and so must not
// depend on the rows or O of a launch: KS (split and ksLean, chosen once per call from the
// shapes, as for one row) and the norm's block size (staged in the kernel by 32 * gemvWarps(KS)
// threads, or k_rmsnorm_gemv with that block size first, which launches with O > 1 always take
// since their blocks differ). f: the call with the embedding folded off; fIn: as given (gather:
// the lean kernel gathers fIn's rows into x).
int gemvRun(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias, const Fuse& f,
            const Fuse& fIn, bool gather) {
  bool nwOk = !f.nw.p || ((f.nw.dt == NV_BF16 || f.nw.dt == NV_F32) && ((uintptr_t)f.nw.p & 15) == 0);
  bool fast = w.dt == NV_BF16 && inDim % 8 == 0 && ((uintptr_t)w.p & 15) == 0 && ((uintptr_t)x & 15) == 0 && nwOk;
  unsigned gx = (unsigned)((outDim + 3) / 4);
  int bfa = ex->bf16act ? 1 : 0;
  if (!fast) {
    for (int r0 = 0; r0 < rows; r0 += 65535) {
      int nr = std::min(65535, rows - r0);
      const float* xr = x + (size_t)r0 * inDim;
      Buf nw = f.nw;
      if (bfa && nw.p) {
        // The generic kernel folds the norm into its dot product; bf16 numerics rounds the
        // normalized input first, so the norm runs as its own (rounding) kernel.
        if ((size_t)nr * inDim * sizeof(float) > ex->wsBytes) return bad(ex, "fused_matmul: workspace too small");
        int rc = launchRmsnorm(ex, nr, 256, xr, nw.p, nw.dt, (float*)ex->ws, (float*)nullptr, inDim, f.eps, nullptr, nullptr, true);
        if (rc) return rc;
        xr = (const float*)ex->ws;
        nw = Buf{nullptr, 0};
      }
      LAUNCH(k_gemv_generic, dim3(gx, nr), 128, 0, xr, w.p, w.dt, out + (size_t)r0 * outDim, nr, inDim, outDim, bias.p,
             bias.dt, nw.p, nw.dt, f.eps, f.glu ? 1 : 0, f.accumulate ? 1 : 0, bfa);
    }
    return NERVA_OK;
  }
  // Few outputs (e.g. 1024-wide projections): four warps per output so the GPU fills up.
  bool split = (size_t)outDim * (f.glu ? 2 : 1) < (size_t)ex->smCount * 16 && inDim >= 1024;
  // early: the fewest warps per output (2 or 3 instead of 4) with which each lane still
  // prefetches its whole share of a row (1024 elements a warp): fewer threads and registers, so
  // the next kernel's blocks fit beside this one while it waits. (Without early, 2 warps
  // measured slower.)
  const int ksLean = split && f.early ? (inDim + 1023) / 1024 : 0;
  // Would one row stage its norm in the kernel? Then the split stays at 4 warps, whose block
  // stages (or k_rmsnorm_gemv computes) it; the lean shapes take no in-kernel norm. Decided as
  // for one row so that KS is the same at every row count.
  const bool stage1 = f.nw.p && (size_t)inDim * sizeof(float) <= 48 * 1024;
  const int ks = !split ? 1 : (ksLean == 2 || ksLean == 3) && !f.glu && !stage1 ? ksLean : 4;
  int nwbf = f.nw.dt == NV_BF16 ? 1 : 0, acc = f.accumulate ? 1 : 0;
  const int maxR = GEMV_MAX_ROWS;
  if (rows == 1 && split && !f.nw.p && !f.glu && (ks == 2 || ks == 3 || ks == 4) &&
      (size_t)inDim * sizeof(float) <= 48 * 1024) {
    const size_t sm = (size_t)inDim * sizeof(float);
    const unsigned g8 = (unsigned)((outDim + GEMV_WIDE_OUTPUTS - 1) / GEMV_WIDE_OUTPUTS);
    const uint16_t* wp = (const uint16_t*)w.p;
    const int ap = f.accPre ? 1 : 0, tg = f.early ? 1 : 0;
#define GW(KS_)                                                                                                     \
  LAUNCH((k_gemv_wide<KS_, GEMV_WIDE_OUTPUTS>), g8, 32 * KS_ * GEMV_WIDE_OUTPUTS, sm, x, wp, out, inDim, outDim, bias.p, \
         bias.dt, acc, bfa, ap, tg)
    if (ks == 2) GW(2);
    else if (ks == 3) GW(3);
    else GW(4);
#undef GW
    return NERVA_OK;
  }
  for (int r0 = 0; r0 < rows; r0 += maxR) {
    int nr = std::min(maxR, rows - r0);
    const float* xr = x + (size_t)r0 * inDim;
    float* orow = out + (size_t)r0 * outDim;
    const uint16_t* wp = (const uint16_t*)w.p;
    // Staged normalized rows must fit the default 48 KiB of dynamic shared memory (the kernel
    // pads nr up to R); else, and always with O > 1, the norm runs as its own kernel into the
    // workspace first, one that computes the staged norm's bits (k_rmsnorm_gemv with the block
    // size of the O = 1 GEMV).
    int rPad = nr == 1 ? 1 : nr == 2 ? 2 : nr <= 4 ? 4 : nr <= 8 ? 8 : 16;
    const bool multiO = gemvOuts(rPad, f.glu) > 1;
    size_t smem = f.nw.p ? (size_t)rPad * inDim * sizeof(float) : 0;
    bool norm = f.nw.p != nullptr;
    if (norm && (multiO || smem > 48 * 1024 || (size_t)nr * inDim * sizeof(float) > ex->wsBytes)) {
      if ((size_t)nr * inDim * sizeof(float) > ex->wsBytes) return bad(ex, "fused_matmul: workspace too small");
      if (inDim % 4 == 0 && ((uintptr_t)f.nw.p & 15) == 0) {
        // The block size of the GEMV that would have staged it (split: KS = 4; else 1).
        LAUNCH(k_rmsnorm_gemv, nr, 32 * gemvWarps(split ? 4 : 1), 0, xr, f.nw.p, nwbf, (float*)ex->ws, inDim, f.eps, bfa);
      } else {
        int rc = launchRmsnorm(ex, nr, 256, xr, f.nw.p, f.nw.dt, (float*)ex->ws, (float*)nullptr, inDim, f.eps, nullptr, nullptr, true);
        if (rc) return rc;
      }
      xr = (const float*)ex->ws;
      norm = false;
      smem = 0;
    }
    GemvLaunch a{xr, wp, orow, nr, inDim, outDim, bias.p, bias.dt, f.nw.p, nwbf, f.eps, acc, bfa,
                 f.accPre ? 1 : 0, f.early ? 1 : 0, smem};
    if (gather) {
      a.etab = (const uint16_t*)fIn.embTable;
      a.eids = fIn.embIds;
      a.eout = (float*)x;
    }
    int rc;
    switch (rPad) {
      case 1: rc = gemvPick<1>(ex, a, ks, norm, f.glu); break;
      case 2: rc = gemvPick<2>(ex, a, ks, norm, f.glu); break;
      case 4: rc = gemvPick<4>(ex, a, ks, norm, f.glu); break;
      case 8: rc = gemvPick<8>(ex, a, ks, norm, f.glu); break;
      default: rc = gemvPick<16>(ex, a, ks, norm, f.glu); break;
    }
    if (rc) return rc;
  }
  return NERVA_OK;
}

int launchRmsnormGemv(NervaExec* ex, int rows, int threads, const float* x, const void* nw, int nwbf, float* out, int inDim,
                      float eps) {
  LAUNCH(k_rmsnorm_gemv, rows, threads, 0, x, nw, nwbf, out, inDim, eps, ex->bf16act ? 1 : 0);
  return NERVA_OK;
}

}  // namespace nerva::ops
