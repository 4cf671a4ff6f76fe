// Causal attention of prefill tiles, third form (k_attn_prefill3: plain bf16 operands, two q heads
// a warp), the f32 cache gather it reads through, and the choice among the tile forms.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/attention/attn_common.cuh"
#include "ops/ops.h"

namespace nerva::ops {

// Third form, for plain bf16 operands (matmul precision 'bf16') over bf16 keys and values: each
// warp takes 16 rows of BOTH q heads of the block (FlashAttention-2's 32 rows a warp, here two
// heads of one KV head), so every K and V fragment read from shared memory feeds two mma; q is
// kept in shared memory (bf16, read per k-step) to leave the registers to the two heads' scores
// and outputs. Four warps a block and about 230 registers a thread: two independent blocks a
// SM, whose phases (tensor-core products, softmax) interleave. The arithmetic per head is
// k_attn_prefill2's (log2 units, ex2.approx, cvt rounding). `btStride`: the block-table row
// stride of sequences (0: every sequence reads row 0, the identity table of gathered keys).
template <int HD>
constexpr size_t attnPrefill3Smem() {
  return (size_t)(2 + 4) * PF_KEYS * (HD + 8) * sizeof(uint16_t);  // q of two heads, two stages of K and V
}

template <int HD>
__global__ void __launch_bounds__(128) k_attn_prefill3(const float* q, const uint16_t* kc, const uint16_t* vc,
                                                      const int* bt, int btStride, const int* rowSeq,
                                                      const int* positions, float* out, int rows, int H, int KVH, int bs,
                                                      int qStride, int qOff, float scale, int window, float* lse,
                                                      const int2* tiles, const int* tileCount) {
  PDL_ENTER();
  constexpr int LD = HD + 8;
  constexpr int KS = HD / 16;
  constexpr int NT = HD / 8;
  constexpr int TILE = PF_KEYS * LD;
  extern __shared__ __align__(16) uint16_t pa3sm[];
  // Q of head 0 and head 1 ([64 rows][LD] each), then K, V of stage 0, then of stage 1.
  uint16_t* const Qs = pa3sm;
  uint16_t* const KV = pa3sm + 2 * TILE;
  __shared__ long long slotSt[2][PF_KEYS];
  __shared__ int sLo, sHi;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int r0, pair;
  if (!pfTileRows(tiles, tileCount, r0, rows, pair)) return;
  const int h0 = pair * 2;
  if (threadIdx.x == 0) {
    sLo = INT_MAX;
    sHi = -1;
  }
  // q of both heads, scaled by scale * log2(e) in f32, rounded to bf16 (rows past the end: 0).
  {
    const float qs = scale * PA2_LOG2E;
    constexpr int P2 = HD / 2;  // float pairs a head row
    for (int i = threadIdx.x; i < 2 * PF_ROWS * P2; i += 128) {
      const int hh = i / (PF_ROWS * P2), rem = i - hh * PF_ROWS * P2, rr = rem / P2, d = (rem - rr * P2) * 2;
      float2 v = make_float2(0.f, 0.f);
      if (r0 + rr < rows) v = *reinterpret_cast<const float2*>(q + (size_t)(r0 + rr) * qStride + qOff + (size_t)(h0 + hh) * HD + d);
      *reinterpret_cast<uint32_t*>(Qs + hh * TILE + rr * LD + d) = pa2Pack(v.x * qs, v.y * qs);
    }
  }
  __syncthreads();
  const int2 keys = pfTileKeys(positions, r0, rows, window, sLo, sHi);
  const int kLo = keys.x, kHi = keys.y;
  const int seq = rowSeq[r0];
  const int kvh = h0 / (H / KVH);
  const int* btr = bt + (size_t)seq * btStride;
  const size_t width = (size_t)KVH * HD;

  const int g = lane >> 2, c = lane & 3;
  const int ra = r0 + warp * 16 + g, rb = ra + 8;
  const int pa = ra < rows ? positions[ra] : -1, pb = rb < rows ? positions[rb] : -1;
  const int la = window > 0 ? max(0, pa - window + 1) : 0, lb = window > 0 ? max(0, pb - window + 1) : 0;
  const int wHi = __reduce_max_sync(0xffffffffu, max(pa, pb));
  const int wLo = __reduce_min_sync(0xffffffffu, min(la, lb));

  float o[2][NT][4];
#pragma unroll
  for (int hh = 0; hh < 2; hh++)
#pragma unroll
    for (int n = 0; n < NT; n++) o[hh][n][0] = o[hh][n][1] = o[hh][n][2] = o[hh][n][3] = 0.f;
  float ma[2] = {-INFINITY, -INFINITY}, mb[2] = {-INFINITY, -INFINITY}, sa[2] = {0.f, 0.f}, sb[2] = {0.f, 0.f};

  auto entryFor = [&](int k0) -> int {
    const int p = k0 + (int)threadIdx.x;
    return threadIdx.x < PF_KEYS && p >= kLo && p <= kHi ? btr[p / bs] : -1;
  };
  // The tile's key offsets in this block's KV head (pfKeyOffsets).
  auto slotsFrom = [&](int k0, int e, long long* sl) { return pfKeyOffsets(k0, e, bs, width, (long long)kvh * HD, sl); };
  auto issue = [&](const long long* sl, int st) {
    uint16_t* kd = KV + (size_t)st * 2 * TILE;
    pfCopyTile<uint16_t, HD, LD, 128>(kd, kd + TILE, kc, vc, sl);
  };

  const int kBeg = kLo & ~(PF_KEYS - 1);
  bool fullCur = slotsFrom(kBeg, entryFor(kBeg), slotSt[0]);
  int eNext = entryFor(kBeg + PF_KEYS);
  issue(slotSt[0], 0);
  pfCommit();
  const int mat = lane >> 3, mr = lane & 7;
  for (int k0 = kBeg, it = 0; k0 <= kHi; k0 += PF_KEYS, it++) {
    const int cur = it & 1;
    const long long* slot = slotSt[cur];
    const uint16_t* Kh = KV + (size_t)cur * 2 * TILE;
    const uint16_t* Vh = Kh + TILE;
    const bool hasNext = k0 + PF_KEYS <= kHi;
    bool fullNext = false;
    if (hasNext) {
      fullNext = slotsFrom(k0 + PF_KEYS, eNext, slotSt[cur ^ 1]);
      eNext = entryFor(k0 + 2 * PF_KEYS);
      issue(slotSt[cur ^ 1], cur ^ 1);
    }
    pfCommit();
    pfWaitPrev();
    __syncthreads();

    if (k0 <= wHi && k0 + PF_KEYS - 1 >= wLo) {
      float sc[2][8][4];
#pragma unroll
      for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int n = 0; n < 8; n++) sc[hh][n][0] = sc[hh][n][1] = sc[hh][n][2] = sc[hh][n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KS; kk++) {
        // A operands: rows 16 warp .. +15 of each head, dims 16 kk .. +15 (matrices: rows 0-7 / 8-15
        // of dims +0..7, then of dims +8..15).
        uint32_t qa[2][4];
#pragma unroll
        for (int hh = 0; hh < 2; hh++) pfLdsm4<false>(qa[hh], Qs + hh * TILE + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < 4; np++) {
          int key = (2 * np + (mat >> 1)) * 8 + mr, col = kk * 16 + (mat & 1) * 8;
          uint32_t b[4];
          pfLdsm4<false>(b, Kh + key * LD + col);
#pragma unroll
          for (int hh = 0; hh < 2; hh++) {
            pfMma(sc[hh][2 * np], qa[hh], b[0], b[1]);
            pfMma(sc[hh][2 * np + 1], qa[hh], b[2], b[3]);
          }
        }
      }
      const bool needMask = !(fullCur && k0 + PF_KEYS - 1 <= min(pa, pb) && k0 >= max(la, lb));
      if (needMask) {
#pragma unroll
        for (int n = 0; n < 8; n++) {
#pragma unroll
          for (int e = 0; e < 2; e++) {
            int j = n * 8 + 2 * c + e, p = k0 + j;
            bool have = slot[j] >= 0;
            bool va = have && p >= la && p <= pa, vb = have && p >= lb && p <= pb;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
              if (!va) sc[hh][n][e] = -INFINITY;
              if (!vb) sc[hh][n][2 + e] = -INFINITY;
            }
          }
        }
      }
      uint32_t ph[2][4][4];  // P of each head as A operands, by k-step of 16 keys
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
        for (int n = 0; n < 8; n++) {
          xa = fmaxf(xa, fmaxf(sc[hh][n][0], sc[hh][n][1]));
          xb = fmaxf(xb, fmaxf(sc[hh][n][2], sc[hh][n][3]));
        }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
          xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, off));
          xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, off));
        }
        const float na = fmaxf(ma[hh], xa), nb = fmaxf(mb[hh], xb);
        const float ba = na == -INFINITY ? 0.f : na, bb = nb == -INFINITY ? 0.f : nb;
        const float ca = pa2Exp2(ma[hh] - ba), cb = pa2Exp2(mb[hh] - bb);
        ma[hh] = na;
        mb[hh] = nb;
        sa[hh] *= ca;
        sb[hh] *= cb;
        if (__any_sync(0xffffffffu, ca != 1.f || cb != 1.f)) {
#pragma unroll
          for (int n = 0; n < NT; n++) {
            o[hh][n][0] *= ca;
            o[hh][n][1] *= ca;
            o[hh][n][2] *= cb;
            o[hh][n][3] *= cb;
          }
        }
#pragma unroll
        for (int n = 0; n < 8; n++) {
          sc[hh][n][0] = pa2Exp2(sc[hh][n][0] - ba);
          sc[hh][n][1] = pa2Exp2(sc[hh][n][1] - ba);
          sc[hh][n][2] = pa2Exp2(sc[hh][n][2] - bb);
          sc[hh][n][3] = pa2Exp2(sc[hh][n][3] - bb);
          sa[hh] += sc[hh][n][0] + sc[hh][n][1];
          sb[hh] += sc[hh][n][2] + sc[hh][n][3];
        }
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
          ph[hh][ks][0] = pa2Pack(sc[hh][2 * ks][0], sc[hh][2 * ks][1]);
          ph[hh][ks][1] = pa2Pack(sc[hh][2 * ks][2], sc[hh][2 * ks][3]);
          ph[hh][ks][2] = pa2Pack(sc[hh][2 * ks + 1][0], sc[hh][2 * ks + 1][1]);
          ph[hh][ks][3] = pa2Pack(sc[hh][2 * ks + 1][2], sc[hh][2 * ks + 1][3]);
        }
      }
#pragma unroll
      for (int ks = 0; ks < 4; ks++) {
#pragma unroll
        for (int dp = 0; dp < NT / 2; dp++) {
          int key = ks * 16 + (mat & 1) * 8 + mr, col = dp * 16 + (mat >> 1) * 8;
          uint32_t b[4];
          pfLdsm4<true>(b, Vh + key * LD + col);
#pragma unroll
          for (int hh = 0; hh < 2; hh++) {
            pfMma(o[hh][2 * dp], ph[hh][ks], b[0], b[1]);
            pfMma(o[hh][2 * dp + 1], ph[hh][ks], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // this stage is refilled two tiles on
    fullCur = fullNext;
  }
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      sa[hh] += __shfl_xor_sync(0xffffffffu, sa[hh], off);
      sb[hh] += __shfl_xor_sync(0xffffffffu, sb[hh], off);
    }
    const int h = h0 + hh;
    const float ia = sa[hh] > 0.f ? 1.f / sa[hh] : 0.f, ib = sb[hh] > 0.f ? 1.f / sb[hh] : 0.f;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      int d = n * 8 + 2 * c;
      if (ra < rows) *reinterpret_cast<float2*>(out + (size_t)ra * H * HD + (size_t)h * HD + d) = make_float2(o[hh][n][0] * ia, o[hh][n][1] * ia);
      if (rb < rows) *reinterpret_cast<float2*>(out + (size_t)rb * H * HD + (size_t)h * HD + d) = make_float2(o[hh][n][2] * ib, o[hh][n][3] * ib);
    }
    if (lse && c == 0) {
      if (ra < rows) lse[(size_t)ra * H + h] = sa[hh] > 0.f ? (ma[hh] + log2f(sa[hh])) * PA2_LN2 : -INFINITY;
      if (rb < rows) lse[(size_t)rb * H + h] = sb[hh] > 0.f ? (mb[hh] + log2f(sb[hh])) * PA2_LN2 : -INFINITY;
    }
  }
}

// One sequence over an f32 cache (matmul precision 'bf16'): its keys and values at positions
// [lo, hi] (lo = positions[0] - window + 1 or 0, hi = positions[rows - 1]: a prompt chunk's rows
// are in position order) rounded to bf16 into `dk`, `dv` laid out as a cache whose slot is the
// position ([maxLen][KVH * HD]), and the identity block table `idt` (mbps entries), so that
// k_attn_prefill3 reads them as a bf16 cache. The attention rounds keys and values to bf16
// itself, so the result is the same.
__global__ void k_kv_gather_bf16(const float* kc, const float* vc, const int* bt, const int* rowSeq, const int* positions,
                                 int rows, int width, int bs, int mbps, int window, uint16_t* dk, uint16_t* dv, int* idt) {
  PDL_ENTER();
  const int lo = window > 0 ? max(0, positions[0] - window + 1) : 0, hi = positions[rows - 1];
  const int* btr = bt + (size_t)rowSeq[0] * mbps;
  const int w4 = width / 4;
  const size_t n = (size_t)(hi + 1) * w4;
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x) {
    if (t < (size_t)mbps) idt[t] = (int)t;
    const int p = (int)(t / w4), f = (int)(t - (size_t)p * w4);
    if (p < lo) continue;
    const int e = btr[p / bs];
    if (e < 0) continue;
    const size_t src = ((size_t)e * bs + p % bs) * width + (size_t)f * 4, dst = (size_t)p * width + (size_t)f * 4;
    const float4 k = *reinterpret_cast<const float4*>(kc + src), v = *reinterpret_cast<const float4*>(vc + src);
    *reinterpret_cast<uint2*>(dk + dst) = make_uint2(pa2Pack(k.x, k.y), pa2Pack(k.z, k.w));
    *reinterpret_cast<uint2*>(dv + dst) = make_uint2(pa2Pack(v.x, v.y), pa2Pack(v.z, v.w));
  }
  // The table's entries past hi (t >= n) when mbps exceeds the work.
  for (size_t t = n + blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < (size_t)mbps; t += (size_t)gridDim.x * blockDim.x) idt[t] = (int)t;
}

template <int HD>
int attnPrefill3Run(NervaExec* ex, const float* q, const uint16_t* kc, const uint16_t* vc, const int* bt, int btStride,
                    Buf rowSeq, Buf pos, float* out, int rows, int H, int KVH, int bs, int qStride, int qOff, float scale,
                    int window, float* lse, int oneSeq) {
  constexpr size_t smem = attnPrefill3Smem<HD>();
  cudaError_t e = allowDynamicSmem(k_attn_prefill3<HD>, smem);
  if (e != cudaSuccess) return check(ex, "k_attn_prefill3 (shared memory opt-in)", e);
  dim3 grid((unsigned)pfTileBlocks(rows, oneSeq), (unsigned)(H / 2));
  LAUNCH(k_attn_prefill3<HD>, grid, 128, smem, q, kc, vc, bt, btStride, (const int*)rowSeq.p, (const int*)pos.p, out, rows, H,
         KVH, bs, qStride, qOff, scale, window, lse, oneSeq ? nullptr : (const int2*)ex->tiles, (const int*)ex->tileCount);
  return NERVA_OK;
}

// Prefill tiles of op attention, by case: the third form (above) for plain bf16 operands where
// two q heads share a KV head (head dim 128 on an sm_90a image: its wgmma form, prefill_wgmma.cu),
// the second (k_attn_prefill2) otherwise. Both read q in pairs of
// floats: the caller passes even q strides and offsets only. Returns an error code, 0 when done.
int attnPrefillTiles(NervaExec* ex, int hd, const float* q, Buf kc, Buf vc, Buf bt, Buf rowSeq, Buf pos, float* out,
                     int rows, int H, int KVH, int bs, int mbps, int qStride, int qOff, float scale, int window,
                     float* lse, int oneSeq) {
  const bool plain = ex->gemmMode == GEMM_BF16, twoHeads = (H / KVH) % 2 == 0;
  // The bf16-operand forms over bf16 keys k and values v through block table `table` (row stride
  // `stride`): the wgmma form where the image has it (head dim 128), else k_attn_prefill3.
  auto bf16Tiles = [&](const uint16_t* k, const uint16_t* v, const int* table, int stride) -> int {
    if (hd == 128) {
      const int rc = attnPrefillWgmmaRun(ex, q, k, v, table, stride, rowSeq, pos, out, rows, H, KVH, bs, qStride, qOff, scale,
                                         window, lse, oneSeq);
      if (rc >= 0) return rc;
      return attnPrefill3Run<128>(ex, q, k, v, table, stride, rowSeq, pos, out, rows, H, KVH, bs, qStride, qOff, scale, window,
                                  lse, oneSeq);
    }
    return attnPrefill3Run<64>(ex, q, k, v, table, stride, rowSeq, pos, out, rows, H, KVH, bs, qStride, qOff, scale, window, lse,
                               oneSeq);
  };
  if (plain && twoHeads) {
    if (kc.dt == NV_BF16) return bf16Tiles((const uint16_t*)kc.p, (const uint16_t*)vc.p, (const int*)bt.p, mbps);
    // An f32 cache: the sequence's keys and values gathered to bf16 in the workspace first. Not
    // under batch invariance: a chunk in a call of several sequences takes the second form, so it
    // takes that form alone too.
    const size_t maxLen = (size_t)mbps * bs, width = (size_t)KVH * hd;
    const size_t kvBytes = align256(maxLen * width * sizeof(uint16_t));
    if (oneSeq && !lse && !ex->batchInv && 2 * kvBytes + align256((size_t)mbps * sizeof(int)) <= ex->wsBytes) {
      uint16_t* dk = (uint16_t*)ex->ws;
      uint16_t* dv = (uint16_t*)(ex->ws + kvBytes);
      int* idt = (int*)(ex->ws + 2 * kvBytes);
      LAUNCH(k_kv_gather_bf16, gridFor(maxLen * width / 4, 256, ex->smCount), 256, 0, (const float*)kc.p, (const float*)vc.p,
             (const int*)bt.p, (const int*)rowSeq.p, (const int*)pos.p, rows, (int)width, bs, mbps, window, dk, dv, idt);
      return bf16Tiles(dk, dv, idt, 0);
    }
  }
  return attnPrefillGqa(ex, hd, q, kc, vc, bt, rowSeq, pos, out, rows, H, KVH, bs, mbps, qStride, qOff, scale, window, lse,
                            oneSeq);
}

}  // namespace nerva::ops
