#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/attention/attn_common.cuh"
#include "ops/ops.h"

namespace nerva::ops {

// Causal attention of prefill tiles on tensor cores, first form (k_attn_prefill): the tiles whose
// q rows the later forms cannot read in pairs (an odd q stride or offset). FlashAttention-2's scheme: one block per (64 query rows of one sequence,
// q head); four warps of 16 rows each hold their q fragments, the scores and the output in
// registers; keys and values come from the paged f32 cache in tiles of 64, converted to bf16 in
// shared memory; mma.sync m16n8k16 (bf16 in, fp32 accumulate); online softmax per row.
//
// SPLIT (exact numerics): q, k, p and v are each split into a bf16 high part and a bf16 low part
// (x - hi), and every product keeps hi*hi + hi*lo + lo*hi. The dropped lo*lo term and the
// rounding of lo are about 2^-16 of each product: f32-grade against the declared relTol 1e-4
// (the same split the many-row GEMMs use). Without SPLIT (matmul precision 'bf16') the operands
// are rounded to bf16 once, as PyTorch's bf16 sdpa does.
//
// A tile takes this path only when all its rows belong to one sequence (attnTileUniform); the
// split-KV kernel skips exactly those rows and handles the rest (decode rows, sequence seams).

// KT: float (f32 cache) or uint16_t (bf16 cache).
template <int HD, bool SPLIT, typename KT>
__global__ void __launch_bounds__(128) k_attn_prefill(const float* q, const KT* kc, const KT* vc, const int* bt,
                                                     const int* rowSeq, const int* positions, float* out, int rows,
                                                     int H, int KVH, int bs, int mbps, int qStride, int qOff,
                                                     float scale, int window, float* lse) {
  PDL_ENTER();
  constexpr int LD = HD + 8;
  constexpr int KS = HD / 16;  // k-steps of q.k
  constexpr int NT = HD / 8;   // n-tiles of the output
  constexpr bool KLO = pfKvLo<SPLIT, KT>();
  constexpr bool BF = sizeof(KT) == 2;  // bf16 cache: two cp.async stages
  constexpr int TILE = PF_KEYS * LD;
  extern __shared__ __align__(16) uint16_t pfsm[];
  // f32: Kh, Vh, Kl, Vl (KLO). bf16: Kh, Vh of stage 0, then of stage 1.
  uint16_t* const Kl = pfsm + 2 * TILE;
  uint16_t* const Vl = pfsm + 3 * TILE;
  __shared__ long long slotSt[BF ? 2 : 1][PF_KEYS];
  __shared__ int sLo, sHi;

  // Heaviest tiles (latest positions) first: the grid's tail is then short tiles.
  int tile = gridDim.x - 1 - blockIdx.x;
  int h = blockIdx.y;
  int r0 = tile * PF_ROWS;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (!attnTileUniform(rowSeq, rows, tile)) return;  // the split-KV kernel takes these rows
  if (threadIdx.x == 0) {
    sLo = INT_MAX;
    sHi = -1;
  }
  __syncthreads();
  if (threadIdx.x < PF_ROWS && r0 + (int)threadIdx.x < rows) {
    int p = positions[r0 + threadIdx.x];
    atomicMin(&sLo, window > 0 ? max(0, p - window + 1) : 0);
    atomicMax(&sHi, p);
  }
  __syncthreads();
  const int kLo = sLo, kHi = sHi;
  const int seq = rowSeq[r0];
  const int kvh = h / (H / KVH);
  const int* btr = bt + (size_t)seq * mbps;
  const size_t width = (size_t)KVH * HD;

  const int g = lane >> 2, c = lane & 3;
  const int ra = r0 + warp * 16 + g, rb = ra + 8;
  // A row past the end attends to nothing (its position -1 masks every key).
  const int pa = ra < rows ? positions[ra] : -1, pb = rb < rows ? positions[rb] : -1;
  const int la = window > 0 ? max(0, pa - window + 1) : 0, lb = window > 0 ? max(0, pb - window + 1) : 0;

  // q fragments (scaled in f32 first, as the split-KV kernel does): A operand of q.k^T.
  uint32_t qh[KS][4], ql[SPLIT ? KS : 1][4];
  {
    const float* qa = q + (size_t)ra * qStride + qOff + (size_t)h * HD;
    const float* qb = q + (size_t)rb * qStride + qOff + (size_t)h * HD;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
      int d0 = kk * 16 + 2 * c;
      float a0 = 0.f, a1 = 0.f, a8 = 0.f, a9 = 0.f, b0 = 0.f, b1 = 0.f, b8 = 0.f, b9 = 0.f;
      if (ra < rows) {
        a0 = qa[d0] * scale;
        a1 = qa[d0 + 1] * scale;
        a8 = qa[d0 + 8] * scale;
        a9 = qa[d0 + 9] * scale;
      }
      if (rb < rows) {
        b0 = qb[d0] * scale;
        b1 = qb[d0 + 1] * scale;
        b8 = qb[d0 + 8] * scale;
        b9 = qb[d0 + 9] * scale;
      }
      uint32_t lo[4];
      pfSplit(a0, a1, qh[kk][0], lo[0]);
      pfSplit(b0, b1, qh[kk][1], lo[1]);
      pfSplit(a8, a9, qh[kk][2], lo[2]);
      pfSplit(b8, b9, qh[kk][3], lo[3]);
      if (SPLIT) {
#pragma unroll
        for (int i = 0; i < 4; i++) ql[SPLIT ? kk : 0][i] = lo[i];
      }
    }
  }

  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float ma = -INFINITY, mb = -INFINITY, sa = 0.f, sb = 0.f;  // row max and (this thread's part of) the row sum

  // The cache slots of the 64 keys of the tile at k0 (-1: none, or the block lives in another cache).
  auto slotsFor = [&](int k0, long long* sl) {
    if (threadIdx.x < PF_KEYS) {
      int p = k0 + threadIdx.x;
      long long v = -1;
      if (p >= kLo && p <= kHi) {
        int e = btr[p / bs];
        if (e >= 0) v = (long long)e * bs + p % bs;
      }
      sl[threadIdx.x] = v;
    }
  };
  // bf16: the tile's rows as they are, 16 bytes per cp.async, into stage st.
  auto issue = [&](const long long* sl, int st) {
    constexpr int F8 = HD / 8;
    uint16_t* kd = pfsm + (size_t)st * 2 * TILE;
    uint16_t* vd = kd + TILE;
    for (int i = threadIdx.x; i < PF_KEYS * F8; i += 128) {
      int j = i / F8, f = i - j * F8;
      long long sv = sl[j];
      size_t off = (size_t)max(sv, 0ll) * width + (size_t)kvh * HD + f * 8;
      pfCopy16(kd + j * LD + f * 8, (const uint16_t*)kc + off, sv >= 0);
      pfCopy16(vd + j * LD + f * 8, (const uint16_t*)vc + off, sv >= 0);
    }
  };
  const int kBeg = kLo & ~(PF_KEYS - 1);
  if (BF) {
    slotsFor(kBeg, slotSt[0]);
    __syncthreads();
    issue(slotSt[0], 0);
    pfCommit();
  }
  for (int k0 = kBeg, it = 0; k0 <= kHi; k0 += PF_KEYS, it++) {
    const int cur = BF ? (it & 1) : 0;
    const long long* slot = slotSt[cur];
    const uint16_t* Kh = pfsm + (size_t)cur * 2 * TILE;
    const uint16_t* Vh = Kh + TILE;
    if (BF) {
      // The next tile's copies go out before this one is used (its stage was last read by the
      // iteration before, which ended at a barrier).
      if (k0 + PF_KEYS <= kHi) {
        slotsFor(k0 + PF_KEYS, slotSt[cur ^ 1]);
        __syncthreads();
        issue(slotSt[cur ^ 1], cur ^ 1);
      }
      pfCommit();
      pfWaitPrev();
      __syncthreads();
    } else {
      __syncthreads();  // the previous tile is no longer read
      slotsFor(k0, slotSt[0]);
      __syncthreads();
      constexpr int F4 = HD / 4;
      uint16_t* kd = pfsm;
      uint16_t* vd = pfsm + TILE;
      for (int i = threadIdx.x; i < PF_KEYS * F4; i += 128) {
        int j = i / F4, f = i - j * F4;
        long long sv = slot[j];
        float4 kx = make_float4(0.f, 0.f, 0.f, 0.f), vx = kx;
        if (sv >= 0) {
          kx = *(const float4*)((const float*)kc + (size_t)sv * width + (size_t)kvh * HD + f * 4);
          vx = *(const float4*)((const float*)vc + (size_t)sv * width + (size_t)kvh * HD + f * 4);
        }
        uint32_t k01, k23, v01, v23, kl01, kl23, vl01, vl23;
        pfSplit(kx.x, kx.y, k01, kl01);
        pfSplit(kx.z, kx.w, k23, kl23);
        pfSplit(vx.x, vx.y, v01, vl01);
        pfSplit(vx.z, vx.w, v23, vl23);
        *(uint2*)(kd + j * LD + f * 4) = make_uint2(k01, k23);
        *(uint2*)(vd + j * LD + f * 4) = make_uint2(v01, v23);
        if (KLO) {
          *(uint2*)(Kl + j * LD + f * 4) = make_uint2(kl01, kl23);
          *(uint2*)(Vl + j * LD + f * 4) = make_uint2(vl01, vl23);
        }
      }
      __syncthreads();
    }

    // Scores: S[16 rows x 64 keys] per warp.
    float sc[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
    const int mat = lane >> 3, mr = lane & 7;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
#pragma unroll
      for (int np = 0; np < 4; np++) {
        // Matrices: (keys of n-tile 2np, dims lo/hi half of the k-step), then n-tile 2np + 1.
        int key = (2 * np + (mat >> 1)) * 8 + mr, col = kk * 16 + (mat & 1) * 8;
        uint32_t b[4];
        pfLdsm4<false>(b, Kh + key * LD + col);
        pfMma(sc[2 * np], qh[kk], b[0], b[1]);
        pfMma(sc[2 * np + 1], qh[kk], b[2], b[3]);
        if (SPLIT) {
          pfMma(sc[2 * np], ql[SPLIT ? kk : 0], b[0], b[1]);
          pfMma(sc[2 * np + 1], ql[SPLIT ? kk : 0], b[2], b[3]);
        }
        if (KLO) {
          uint32_t bl[4];
          pfLdsm4<false>(bl, Kl + key * LD + col);
          pfMma(sc[2 * np], qh[kk], bl[0], bl[1]);
          pfMma(sc[2 * np + 1], qh[kk], bl[2], bl[3]);
        }
      }
    }
    // Mask (causal bound, window, missing blocks) and the row maxima.
    float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
    for (int n = 0; n < 8; n++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        int j = n * 8 + 2 * c + e, p = k0 + j;
        bool have = slot[j] >= 0;
        if (!(have && p >= la && p <= pa)) sc[n][e] = -INFINITY;
        if (!(have && p >= lb && p <= pb)) sc[n][2 + e] = -INFINITY;
        xa = fmaxf(xa, sc[n][e]);
        xb = fmaxf(xb, sc[n][2 + e]);
      }
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, off));
      xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, off));
    }
    float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
    // A row with nothing visible yet keeps max -inf: exponents taken against 0 give 0, not NaN.
    float ba = na == -INFINITY ? 0.f : na, bb = nb == -INFINITY ? 0.f : nb;
    float ca = expf(ma - ba), cb = expf(mb - bb);
    ma = na;
    mb = nb;
    sa *= ca;
    sb *= cb;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      o[n][0] *= ca;
      o[n][1] *= ca;
      o[n][2] *= cb;
      o[n][3] *= cb;
    }
#pragma unroll
    for (int n = 0; n < 8; n++) {
      sc[n][0] = expf(sc[n][0] - ba);
      sc[n][1] = expf(sc[n][1] - ba);
      sc[n][2] = expf(sc[n][2] - bb);
      sc[n][3] = expf(sc[n][3] - bb);
      sa += sc[n][0] + sc[n][1];
      sb += sc[n][2] + sc[n][3];
    }
    // out += P . V: the score accumulators are the A operand (keys 16 ks .. 16 ks + 15).
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
      uint32_t ph[4], pl[4];
      pfSplit(sc[2 * ks][0], sc[2 * ks][1], ph[0], pl[0]);
      pfSplit(sc[2 * ks][2], sc[2 * ks][3], ph[1], pl[1]);
      pfSplit(sc[2 * ks + 1][0], sc[2 * ks + 1][1], ph[2], pl[2]);
      pfSplit(sc[2 * ks + 1][2], sc[2 * ks + 1][3], ph[3], pl[3]);
#pragma unroll
      for (int dp = 0; dp < NT / 2; dp++) {
        // Matrices (transposed): keys 0-7 / 8-15 of the k-step for dims 16 dp .. +7, then +8 .. +15.
        int key = ks * 16 + (mat & 1) * 8 + mr, col = dp * 16 + (mat >> 1) * 8;
        uint32_t b[4];
        pfLdsm4<true>(b, Vh + key * LD + col);
        pfMma(o[2 * dp], ph, b[0], b[1]);
        pfMma(o[2 * dp + 1], ph, b[2], b[3]);
        if (SPLIT) {
          pfMma(o[2 * dp], pl, b[0], b[1]);
          pfMma(o[2 * dp + 1], pl, b[2], b[3]);
        }
        if (KLO) {
          uint32_t bl[4];
          pfLdsm4<true>(bl, Vl + key * LD + col);
          pfMma(o[2 * dp], ph, bl[0], bl[1]);
          pfMma(o[2 * dp + 1], ph, bl[2], bl[3]);
        }
      }
    }
    if (BF) __syncthreads();  // this stage is refilled two tiles on
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    sa += __shfl_xor_sync(0xffffffffu, sa, off);
    sb += __shfl_xor_sync(0xffffffffu, sb, off);
  }
  float ia = sa > 0.f ? 1.f / sa : 0.f, ib = sb > 0.f ? 1.f / sb : 0.f;
#pragma unroll
  for (int n = 0; n < NT; n++) {
    int d = n * 8 + 2 * c;
    if (ra < rows) {
      float* oa = out + (size_t)ra * H * HD + (size_t)h * HD + d;
      oa[0] = o[n][0] * ia;
      oa[1] = o[n][1] * ia;
    }
    if (rb < rows) {
      float* ob = out + (size_t)rb * H * HD + (size_t)h * HD + d;
      ob[0] = o[n][2] * ib;
      ob[1] = o[n][3] * ib;
    }
  }
  if (lse && c == 0) {
    if (ra < rows) lse[(size_t)ra * H + h] = sa > 0.f ? ma + logf(sa) : -INFINITY;
    if (rb < rows) lse[(size_t)rb * H + h] = sb > 0.f ? mb + logf(sb) : -INFINITY;
  }
}

template <int HD, bool SPLIT, typename KT>
int attnPrefillRun(NervaExec* ex, const float* q, Buf kc, Buf vc, Buf bt, Buf rowSeq, Buf pos, float* out, int rows, int H,
                   int KVH, int bs, int mbps, int qStride, int qOff, float scale, int window, float* lse) {
  constexpr size_t smem = attnPrefillSmem<HD, SPLIT, KT>();
  // Above 48 KiB a block must opt in (per function, per device: set on every launch).
  cudaError_t e = cudaFuncSetAttribute(k_attn_prefill<HD, SPLIT, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return check(ex, "k_attn_prefill (shared memory opt-in)", e);
  dim3 grid((unsigned)((rows + PF_ROWS - 1) / PF_ROWS), (unsigned)H);
  LAUNCH((k_attn_prefill<HD, SPLIT, KT>), grid, 128, smem, q, (const KT*)kc.p, (const KT*)vc.p, (const int*)bt.p,
         (const int*)rowSeq.p, (const int*)pos.p, out, rows, H, KVH, bs, mbps, qStride, qOff, scale, window, lse);
  return NERVA_OK;
}

// Exact numerics split every operand in two bf16 halves; matmul precision 'bf16' rounds once.
int attnPrefillMma(NervaExec* ex, int hd, const float* q, Buf kc, Buf vc, Buf bt, Buf rowSeq, Buf pos, float* out,
                      int rows, int H, int KVH, int bs, int mbps, int qStride, int qOff, float scale, int window,
                      float* lse) {
  const bool split = ex->gemmMode != GEMM_BF16, f32 = kc.dt == NV_F32;
#define PF_RUN(HD, SP, KT) \
  return attnPrefillRun<HD, SP, KT>(ex, q, kc, vc, bt, rowSeq, pos, out, rows, H, KVH, bs, mbps, qStride, qOff, scale, window, lse)
#define PF_KT(HD, SP) \
  if (f32) PF_RUN(HD, SP, float); \
  else PF_RUN(HD, SP, uint16_t);
#define PF_SP(HD) \
  if (split) { PF_KT(HD, true) } \
  else { PF_KT(HD, false) }
  if (hd == 128) { PF_SP(128) }
  PF_SP(64)
#undef PF_SP
#undef PF_KT
#undef PF_RUN
}

}  // namespace nerva::ops
