// Causal attention of prefill tiles on tensor cores (k_attn_prefill2), FlashAttention-2's scheme:
// blocks of 64 query rows of one sequence (4 warps of 16 rows each hold their q fragments, the
// scores and the output in registers), keys and values in tiles of 64 converted to bf16 in shared
// memory, mma.sync m16n8k16 (bf16 in, fp32 accumulate), online softmax per row. Helpers in
// attn_common.cuh (PF_ROWS, PF_KEYS, pa2Split, pfMma, pfLdsm4, pfCopy16,
// pfCommit, pfWaitPrev, pfKvLo, pa2Pack).
//
// SPLIT (exact numerics): q, k, p and v are each split into a bf16 high part and a bf16 low part
// (x - hi), and every product keeps hi*hi + hi*lo + lo*hi. The dropped lo*lo term and the
// rounding of lo are about 2^-16 of each product: f32-grade against the declared relTol 1e-4
// (the same split the many-row GEMMs use). Without SPLIT (matmul precision 'bf16') the operands
// are rounded to bf16 once, as PyTorch's bf16 sdpa does.
//
// A tile holds rows of one sequence: every 64 rows of a one-sequence call, else the tiles of
// k_attn_tile_plan (runs of at least 64 rows of one sequence, cut from their first row); the
// split-KV kernel skips exactly the rows they cover and handles the rest (decode rows, short runs).
// Organized for throughput:
// - HPB q heads of one KV head per block (GQA): warps 4i..4i+3 take head HPB*group + i, 16
//   rows each, and share every K/V tile the block loads (the L2 and shared-memory traffic of a
//   tile is paid once for HPB heads);
// - scores in log2 units (q scaled by scale*log2(e) before it is rounded or split), ex2.approx;
//   bf16 rounding by cvt (two values an instruction); no rescale of the output once the row
//   maxima stop moving;
// - the block-table entries of a key tile are loaded a tile ahead of their use;
// - a key tile wholly visible to a thread's rows (all 64 slots present, inside the causal bound
//   and the window) skips the mask; a tile wholly outside a warp's rows skips the warp's math;
// - f32 caches: the next tile's rows are copied raw with cp.async into a staging area while this
//   tile is used, then converted to bf16 (and lo halves under SPLIT) once for the whole block;
//   bf16 caches: two cp.async stages.
// oneSeq (the caller says every row has one sequence): every 64-row tile of the call, no plan.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/attention/attn_common.cuh"
#include "ops/ops.h"

namespace nerva::ops {

// Dynamic shared memory: bf16 caches two stages of K and V tiles; f32 caches the converted K and
// V tiles (and their lo halves under SPLIT) plus the f32 staging of the next tile.
template <int HD, bool SPLIT, typename KT>
constexpr size_t attnPrefill2Smem() {
  return sizeof(KT) == 2 ? (size_t)4 * PF_KEYS * (HD + 8) * sizeof(uint16_t)
                         : (size_t)(pfKvLo<SPLIT, KT>() ? 4 : 2) * PF_KEYS * (HD + 8) * sizeof(uint16_t) +
                               (size_t)2 * PF_KEYS * HD * sizeof(float);
}

template <int HD, bool SPLIT, typename KT, int HPB>
__global__ void __launch_bounds__(128 * HPB) k_attn_prefill2(const float* q, const KT* kc, const KT* vc, const int* bt,
                                                           const int* rowSeq, const int* positions, float* out,
                                                           int rows, int H, int KVH, int bs, int mbps, int qStride,
                                                           int qOff, float scale, int window, float* lse, const int2* tiles, const int* tileCount) {
  PDL_ENTER();
  constexpr int NTH = 128 * HPB;
  constexpr int LD = HD + 8;
  constexpr int KS = HD / 16;  // k-steps of q.k
  constexpr int NT = HD / 8;   // n-tiles of the output
  constexpr bool KLO = pfKvLo<SPLIT, KT>();
  constexpr bool BF = sizeof(KT) == 2;
  constexpr int TILE = PF_KEYS * LD;
  extern __shared__ __align__(16) uint16_t pa2sm[];
  // f32: Kh, Vh, (Kl, Vl), then the f32 staging Fk, Fv. bf16: Kh, Vh of stage 0, then of stage 1.
  uint16_t* const Kl = pa2sm + 2 * TILE;
  uint16_t* const Vl = pa2sm + 3 * TILE;
  float* const Fk = reinterpret_cast<float*>(pa2sm + (KLO ? 4 : 2) * TILE);
  float* const Fv = Fk + PF_KEYS * HD;
  __shared__ long long slotSt[2][PF_KEYS];
  __shared__ int sLo, sHi;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int r0, grp;
  if (!pfTileRows(tiles, tileCount, r0, rows, grp)) return;
  const int h = grp * HPB + (warp >> 2);
  if (threadIdx.x == 0) {
    sLo = INT_MAX;
    sHi = -1;
  }
  __syncthreads();
  const int2 keys = pfTileKeys(positions, r0, rows, window, sLo, sHi);
  const int kLo = keys.x, kHi = keys.y;
  const int seq = rowSeq[r0];
  const int kvh = h / (H / KVH);
  const int* btr = bt + (size_t)seq * mbps;
  const size_t width = (size_t)KVH * HD;

  const int g = lane >> 2, c = lane & 3;
  const int ra = r0 + (warp & 3) * 16 + g, rb = ra + 8;
  // A row past the end attends to nothing (its position -1 masks every key).
  const int pa = ra < rows ? positions[ra] : -1, pb = rb < rows ? positions[rb] : -1;
  const int la = window > 0 ? max(0, pa - window + 1) : 0, lb = window > 0 ? max(0, pb - window + 1) : 0;
  // The keys any row of this warp sees: [wLo, wHi].
  const int wHi = __reduce_max_sync(0xffffffffu, max(pa, pb));
  const int wLo = __reduce_min_sync(0xffffffffu, min(la, lb));

  // q fragments, scaled by scale * log2(e) in f32 first: A operand of q.k^T in log2 units.
  const float qs = scale * PA2_LOG2E;
  uint32_t qh[KS][4], ql[SPLIT ? KS : 1][4];
  {
    const float* qa = q + (size_t)ra * qStride + qOff + (size_t)h * HD;
    const float* qb = q + (size_t)rb * qStride + qOff + (size_t)h * HD;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
      int d0 = kk * 16 + 2 * c;
      float2 a01 = make_float2(0.f, 0.f), a89 = a01, b01 = a01, b89 = a01;
      if (ra < rows) {
        a01 = *reinterpret_cast<const float2*>(qa + d0);
        a89 = *reinterpret_cast<const float2*>(qa + d0 + 8);
      }
      if (rb < rows) {
        b01 = *reinterpret_cast<const float2*>(qb + d0);
        b89 = *reinterpret_cast<const float2*>(qb + d0 + 8);
      }
      uint32_t lo[4];
      pa2Split(a01.x * qs, a01.y * qs, qh[kk][0], lo[0]);
      pa2Split(b01.x * qs, b01.y * qs, qh[kk][1], lo[1]);
      pa2Split(a89.x * qs, a89.y * qs, qh[kk][2], lo[2]);
      pa2Split(b89.x * qs, b89.y * qs, qh[kk][3], lo[3]);
      if (SPLIT) {
#pragma unroll
        for (int i = 0; i < 4; i++) ql[SPLIT ? kk : 0][i] = lo[i];
      }
    }
  }

  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float ma = -INFINITY, mb = -INFINITY, sa = 0.f, sb = 0.f;  // row max (log2 units) and this thread's part of the row sum

  // The block-table entry of key k0 + threadIdx.x (threads < 64; -1 outside [kLo, kHi]): loaded a
  // tile ahead of its use, so the load's latency hides behind a tile's math.
  auto entryFor = [&](int k0) -> int {
    const int p = k0 + (int)threadIdx.x;
    return threadIdx.x < PF_KEYS && p >= kLo && p <= kHi ? btr[p / bs] : -1;
  };
  // The tile's key offsets in this block's KV head (pfKeyOffsets).
  auto slotsFrom = [&](int k0, int e, long long* sl) { return pfKeyOffsets(k0, e, bs, width, (long long)kvh * HD, sl); };
  // bf16: the tile's rows as they are, into stage st.
  auto issueBf = [&](const long long* sl, int st) {
    uint16_t* kd = pa2sm + (size_t)st * 2 * TILE;
    pfCopyTile<uint16_t, HD, LD, NTH>(kd, kd + TILE, (const uint16_t*)kc, (const uint16_t*)vc, sl);
  };
  // f32: the tile's rows raw into the staging area.
  auto issueF32 = [&](const long long* sl) { pfCopyTile<float, HD, HD, NTH>(Fk, Fv, (const float*)kc, (const float*)vc, sl); };
  // f32: staging -> bf16 tiles (hi, and lo under SPLIT).
  auto convert = [&]() {
    constexpr int F4 = HD / 4;
    for (int i = threadIdx.x; i < PF_KEYS * F4; i += NTH) {
      int j = i / F4, f = i - j * F4;
      float4 kx = *reinterpret_cast<const float4*>(Fk + j * HD + f * 4);
      float4 vx = *reinterpret_cast<const float4*>(Fv + j * HD + f * 4);
      uint32_t k01, k23, v01, v23, kl01, kl23, vl01, vl23;
      pa2Split(kx.x, kx.y, k01, kl01);
      pa2Split(kx.z, kx.w, k23, kl23);
      pa2Split(vx.x, vx.y, v01, vl01);
      pa2Split(vx.z, vx.w, v23, vl23);
      *reinterpret_cast<uint2*>(pa2sm + j * LD + f * 4) = make_uint2(k01, k23);
      *reinterpret_cast<uint2*>(pa2sm + TILE + j * LD + f * 4) = make_uint2(v01, v23);
      if (KLO) {
        *reinterpret_cast<uint2*>(Kl + j * LD + f * 4) = make_uint2(kl01, kl23);
        *reinterpret_cast<uint2*>(Vl + j * LD + f * 4) = make_uint2(vl01, vl23);
      }
    }
  };

  const int kBeg = kLo & ~(PF_KEYS - 1);
  bool fullCur = slotsFrom(kBeg, entryFor(kBeg), slotSt[0]);
  int eNext = entryFor(kBeg + PF_KEYS);
  if (BF) {
    issueBf(slotSt[0], 0);
    pfCommit();
  } else {
    issueF32(slotSt[0]);
    pfCommit();
    pa2WaitAll();
    __syncthreads();
    convert();
    __syncthreads();
  }
  const int mat = lane >> 3, mr = lane & 7;
  for (int k0 = kBeg, it = 0; k0 <= kHi; k0 += PF_KEYS, it++) {
    const int cur = it & 1;
    const long long* slot = slotSt[cur];
    const uint16_t* Kh = BF ? pa2sm + (size_t)cur * 2 * TILE : pa2sm;
    const uint16_t* Vh = Kh + TILE;
    const bool hasNext = k0 + PF_KEYS <= kHi;
    bool fullNext = false;
    // The next tile's copies go out before this one is used (the buffers they fill were last
    // read before the barrier that ended the iteration before).
    if (hasNext) {
      fullNext = slotsFrom(k0 + PF_KEYS, eNext, slotSt[cur ^ 1]);
      eNext = entryFor(k0 + 2 * PF_KEYS);
      if (BF) issueBf(slotSt[cur ^ 1], cur ^ 1);
      else issueF32(slotSt[cur ^ 1]);
    }
    pfCommit();
    if (BF) {
      pfWaitPrev();  // this tile's copies have landed (the next tile's may still be in flight)
      __syncthreads();
    }

    if (k0 <= wHi && k0 + PF_KEYS - 1 >= wLo) {
      // Scores: S[16 rows x 64 keys] per warp, log2 units.
      float sc[8][4];
#pragma unroll
      for (int n = 0; n < 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
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
      // Mask (causal bound, window, missing blocks) unless every key is visible to both rows.
      const bool needMask = !(fullCur && k0 + PF_KEYS - 1 <= min(pa, pb) && k0 >= max(la, lb));
      if (needMask) {
#pragma unroll
        for (int n = 0; n < 8; n++) {
#pragma unroll
          for (int e = 0; e < 2; e++) {
            int j = n * 8 + 2 * c + e, p = k0 + j;
            bool have = slot[j] >= 0;
            if (!(have && p >= la && p <= pa)) sc[n][e] = -INFINITY;
            if (!(have && p >= lb && p <= pb)) sc[n][2 + e] = -INFINITY;
          }
        }
      }
      float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; n++) {
        xa = fmaxf(xa, fmaxf(sc[n][0], sc[n][1]));
        xb = fmaxf(xb, fmaxf(sc[n][2], sc[n][3]));
      }
#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) {
        xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, off));
        xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, off));
      }
      const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
      // A row with nothing visible yet keeps max -inf: exponents taken against 0 give 0, not NaN.
      const float ba = na == -INFINITY ? 0.f : na, bb = nb == -INFINITY ? 0.f : nb;
      const float ca = pa2Exp2(ma - ba), cb = pa2Exp2(mb - bb);
      ma = na;
      mb = nb;
      sa *= ca;
      sb *= cb;
      // Once the row maxima settle (most tiles) nothing needs rescaling.
      if (__any_sync(0xffffffffu, ca != 1.f || cb != 1.f)) {
#pragma unroll
        for (int n = 0; n < NT; n++) {
          o[n][0] *= ca;
          o[n][1] *= ca;
          o[n][2] *= cb;
          o[n][3] *= cb;
        }
      }
#pragma unroll
      for (int n = 0; n < 8; n++) {
        sc[n][0] = pa2Exp2(sc[n][0] - ba);
        sc[n][1] = pa2Exp2(sc[n][1] - ba);
        sc[n][2] = pa2Exp2(sc[n][2] - bb);
        sc[n][3] = pa2Exp2(sc[n][3] - bb);
        sa += sc[n][0] + sc[n][1];
        sb += sc[n][2] + sc[n][3];
      }
      // out += P . V: the score accumulators are the A operand (keys 16 ks .. 16 ks + 15).
#pragma unroll
      for (int ks = 0; ks < 4; ks++) {
        uint32_t ph[4], pl[4];
        pa2Split(sc[2 * ks][0], sc[2 * ks][1], ph[0], pl[0]);
        pa2Split(sc[2 * ks][2], sc[2 * ks][3], ph[1], pl[1]);
        pa2Split(sc[2 * ks + 1][0], sc[2 * ks + 1][1], ph[2], pl[2]);
        pa2Split(sc[2 * ks + 1][2], sc[2 * ks + 1][3], ph[3], pl[3]);
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
    }
    if (BF) {
      __syncthreads();  // this stage is refilled two tiles on
    } else {
      if (hasNext) {
        pa2WaitAll();
        __syncthreads();  // every warp is done with this tile, and the next one's rows have landed
        convert();
      }
      __syncthreads();
    }
    fullCur = fullNext;
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    sa += __shfl_xor_sync(0xffffffffu, sa, off);
    sb += __shfl_xor_sync(0xffffffffu, sb, off);
  }
  const float ia = sa > 0.f ? 1.f / sa : 0.f, ib = sb > 0.f ? 1.f / sb : 0.f;
#pragma unroll
  for (int n = 0; n < NT; n++) {
    int d = n * 8 + 2 * c;
    if (ra < rows) *reinterpret_cast<float2*>(out + (size_t)ra * H * HD + (size_t)h * HD + d) = make_float2(o[n][0] * ia, o[n][1] * ia);
    if (rb < rows) *reinterpret_cast<float2*>(out + (size_t)rb * H * HD + (size_t)h * HD + d) = make_float2(o[n][2] * ib, o[n][3] * ib);
  }
  if (lse && c == 0) {
    if (ra < rows) lse[(size_t)ra * H + h] = sa > 0.f ? (ma + log2f(sa)) * PA2_LN2 : -INFINITY;
    if (rb < rows) lse[(size_t)rb * H + h] = sb > 0.f ? (mb + log2f(sb)) * PA2_LN2 : -INFINITY;
  }
}

template <int HD, bool SPLIT, typename KT, int HPB>
int attnPrefill2Run(NervaExec* ex, const float* q, Buf kc, Buf vc, Buf bt, Buf rowSeq, Buf pos, float* out, int rows,
                    int H, int KVH, int bs, int mbps, int qStride, int qOff, float scale, int window, float* lse,
                    int oneSeq) {
  constexpr size_t smem = attnPrefill2Smem<HD, SPLIT, KT>();
  cudaError_t e = allowDynamicSmem(k_attn_prefill2<HD, SPLIT, KT, HPB>, smem);
  if (e != cudaSuccess) return check(ex, "k_attn_prefill2 (shared memory opt-in)", e);
  dim3 grid((unsigned)pfTileBlocks(rows, oneSeq), (unsigned)(H / HPB));
  LAUNCH((k_attn_prefill2<HD, SPLIT, KT, HPB>), grid, 128 * HPB, smem, q, (const KT*)kc.p, (const KT*)vc.p, (const int*)bt.p,
         (const int*)rowSeq.p, (const int*)pos.p, out, rows, H, KVH, bs, mbps, qStride, qOff, scale, window, lse,
         oneSeq ? nullptr : (const int2*)ex->tiles, (const int*)ex->tileCount);
  return NERVA_OK;
}

// Two q heads a block where the group size allows (G even), else one.
int attnPrefillGqa(NervaExec* ex, int hd, const float* q, Buf kc, Buf vc, Buf bt, Buf rowSeq, Buf pos, float* out,
                       int rows, int H, int KVH, int bs, int mbps, int qStride, int qOff, float scale, int window,
                       float* lse, int oneSeq) {
  const bool split = ex->gemmMode != GEMM_BF16, f32 = kc.dt == NV_F32, two = (H / KVH) % 2 == 0;
#define PA2_RUN(HD, SP, KT, HPB)                                                                                       \
  return attnPrefill2Run<HD, SP, KT, HPB>(ex, q, kc, vc, bt, rowSeq, pos, out, rows, H, KVH, bs, mbps, qStride, qOff, \
                                          scale, window, lse, oneSeq)
#define PA2_HPB(HD, SP, KT) \
  if (two) PA2_RUN(HD, SP, KT, 2); \
  else PA2_RUN(HD, SP, KT, 1);
#define PA2_KT(HD, SP) \
  if (f32) { PA2_HPB(HD, SP, float) } \
  else { PA2_HPB(HD, SP, uint16_t) }
#define PA2_SP(HD) \
  if (split) { PA2_KT(HD, true) } \
  else { PA2_KT(HD, false) }
  if (hd == 128) { PA2_SP(128) }
  PA2_SP(64)
#undef PA2_SP
#undef PA2_KT
#undef PA2_HPB
#undef PA2_RUN
}

}  // namespace nerva::ops
