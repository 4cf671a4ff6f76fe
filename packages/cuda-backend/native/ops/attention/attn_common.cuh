// Device helpers shared by the attention forms.
#pragma once
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/ops.h"

namespace nerva::ops {

// Split-KV paged attention, one block per (split, head, row), W warps; each warp takes every
// W-th key of the split with an online softmax, then the warps merge. Writes (m, l, acc[hd]).
// 8 warps: a 32-key split is one batch of ATT_KB keys per warp, one memory round trip (4 warps
// took two; the 0.6B shape decoded ~4 % faster with 8).
constexpr int ATT_WARPS = 8;
constexpr int ATT_MAX_EPL = 8;  // headDim <= 256
constexpr int ATT_KB = 4;       // keys each warp has in flight

constexpr int PF_ROWS = 64;  // query rows per block (4 warps x 16)
constexpr int PF_KEYS = 64;  // keys per shared-memory tile

// Blocks along x of a prefill tile launch: one per 64-row tile of a one-sequence call, else the
// most tiles a plan can hold (a run of L >= 64 rows has at most 2L/64 tiles); the blocks past the
// plan's count return at once.
inline int pfTileBlocks(int rows, int oneSeq) {
  return oneSeq ? (rows + PF_ROWS - 1) / PF_ROWS : (rows + PF_ROWS / 2 - 1) / (PF_ROWS / 2);
}

// A prefill tile block's rows [r0, rows) and its head group: without a plan (tiles null, a
// one-sequence call) every 64 rows, else the plan's tile (k_attn_tile_plan), its end as `rows`.
// False: a block past the plan's count. The grid is (tile slots, head groups); blocks are
// dispatched about in linear order, so the linear index takes tile ranks slowest and groups
// fastest: a one-sequence call runs its latest (heaviest, causal) tiles of every group first and
// the grid's last wave is every group's short tiles, not all of the last groups' tiles (an 8B
// prompt of 4096 tokens: 1024 blocks of 1..64 key tiles in ~4 waves).
__device__ __forceinline__ bool pfTileRows(const int2* tiles, const int* tileCount, int& r0, int& rows, int& group) {
  const int b = (int)(blockIdx.x + blockIdx.y * gridDim.x);
  const int rank = b / (int)gridDim.y;
  group = b - rank * (int)gridDim.y;
  if (!tiles) {
    r0 = (int)(gridDim.x - 1 - rank) * PF_ROWS;
    return true;
  }
  if (rank >= *tileCount) return false;
  const int2 t = tiles[rank];
  r0 = t.x;
  rows = t.y;
  return true;
}

// The keys any row of a tile [r0, rows) sees, {first, last}: the rows' window starts and
// positions reduced in shared memory `lo` and `hi`, which the block set to INT_MAX and -1 behind
// a barrier before the call. Ends with a barrier, so every thread reads both.
__device__ __forceinline__ int2 pfTileKeys(const int* positions, int r0, int rows, int window, int& lo, int& hi) {
  if (threadIdx.x < PF_ROWS && r0 + (int)threadIdx.x < rows) {
    const int p = positions[r0 + threadIdx.x];
    atomicMin(&lo, window > 0 ? max(0, p - window + 1) : 0);
    atomicMax(&hi, p);
  }
  __syncthreads();
  return make_int2(lo, hi);
}

// Each key's element offset in the cache (its KV head's row, `head` elements in) for the tile of
// PF_KEYS keys at k0, one thread a key, from its block-table entry e (-1: none, or the block lives
// in another cache: -1). Returns, to every thread, whether all the tile's keys are present.
// Key k0 + threadIdx.x's offset (a thread below PF_KEYS; e its block-table entry), -1 without a slot.
__device__ __forceinline__ long long pfKeyOffset(int k0, int e, int bs, size_t width, long long head) {
  const int p = k0 + (int)threadIdx.x;
  return e >= 0 ? ((long long)e * bs + p % bs) * (long long)width + head : -1;
}
__device__ __forceinline__ bool pfKeyOffsets(int k0, int e, int bs, size_t width, long long head, long long* sl) {
  bool ok = true;
  if (threadIdx.x < PF_KEYS) {
    const long long v = pfKeyOffset(k0, e, bs, width, head);
    sl[threadIdx.x] = v;
    ok = v >= 0;
  }
  return __syncthreads_and(ok) != 0;
}

__device__ __forceinline__ uint32_t pfPack(float lo, float hi) {
  return (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16);
}

__device__ __forceinline__ void pfMma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

template <bool TRANS>
__device__ __forceinline__ void pfLdsm4(uint32_t (&r)[4], const uint16_t* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#endif
}

// Whether the cache's keys and values need a lo half: f32 caches under SPLIT (a bf16 cache holds
// bf16 values exactly, so its lo half is zero and those products are skipped).
template <bool SPLIT, typename KT>
__host__ __device__ constexpr bool pfKvLo() {
  return SPLIT && sizeof(KT) == 4;
}

__device__ __forceinline__ void pfCopy16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  int n = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n) : "memory");
#endif
}
// A tile of PF_KEYS keys' K and V rows (ROW elements of T each) into shared rows of stride LD,
// from each key's element offset in the cache (`off`, -1: no slot, the row zero-filled), NTH
// threads each copying one fixed 16-byte column of every (NTH / columns)-th key, unrolled: the
// offsets are computed once a key (one thread each) instead of an address a copy.
template <typename T, int ROW, int LD, int NTH>
__device__ __forceinline__ void pfCopyTile(T* kd, T* vd, const T* kc, const T* vc, const long long* off) {
  constexpr int E = 16 / sizeof(T), COLS = ROW / E, KEYS_A_PASS = NTH / COLS;
  static_assert(NTH % COLS == 0 && PF_KEYS % KEYS_A_PASS == 0, "pfCopyTile: threads must split the tile evenly");
  const int e = (threadIdx.x % COLS) * E, j0 = threadIdx.x / COLS;
#pragma unroll
  for (int it = 0; it < PF_KEYS / KEYS_A_PASS; it++) {
    const int j = j0 + it * KEYS_A_PASS;
    const long long sv = off[j];
    const size_t o = (size_t)max(sv, 0ll) + e;
    pfCopy16(kd + j * LD + e, kc + o, sv >= 0);
    pfCopy16(vd + j * LD + e, vc + o, sv >= 0);
  }
}
__device__ __forceinline__ void pfCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void pfWaitAll() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}
__device__ __forceinline__ void pfWaitPrev() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}


constexpr float PA2_LOG2E = 1.4426950408889634f;
constexpr float PA2_LN2 = 0.6931471805599453f;

// (lo, hi) rounded to bf16 (nearest even) and packed, lo in the low 16 bits: one cvt for two
// values (pfPack's result for every finite input).
__device__ __forceinline__ uint32_t pa2Pack(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return pfPack(lo, hi);
#endif
}
// hi and lo halves of the pair (a, b), packed as mma operands (a in the low 16 bits).
__device__ __forceinline__ void pa2Split(float a, float b, uint32_t& hi, uint32_t& lo) {
  hi = pa2Pack(a, b);
  lo = pa2Pack(a - __uint_as_float(hi << 16), b - __uint_as_float(hi & 0xffff0000u));
}
// 2^x (ex2.approx: relative error about 2^-22; -inf gives 0).
__device__ __forceinline__ float pa2Exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

__device__ __forceinline__ void pa2WaitAll() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}


template <typename KT>
__device__ __forceinline__ float ldk(const KT* p, size_t i);
template <>
__device__ __forceinline__ float ldk<float>(const float* p, size_t i) { return p[i]; }
template <>
__device__ __forceinline__ float ldk<uint16_t>(const uint16_t* p, size_t i) { return bf2f(p[i]); }
template <>
__device__ __forceinline__ float ldk<__half>(const __half* p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void stk(float* p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void stk(uint16_t* p, size_t i, float v) { p[i] = f2bf(v); }
__device__ __forceinline__ void stk(__half* p, size_t i, float v) { p[i] = __float2half_rn(v); }
// v as a cache of element type KT holds it (what ldk reads back after stk).
__device__ __forceinline__ float asStored(const float*, float v) { return v; }
__device__ __forceinline__ float asStored(const uint16_t*, float v) { return rbf(v); }
__device__ __forceinline__ float asStored(const __half*, float v) { return __half2float(__float2half_rn(v)); }
// Elements p[0], p[1] (p two-element aligned) in one load; zeros when !in.
__device__ __forceinline__ void ldk2(const float* p, bool in, float& a, float& b) {
  float2 v = in ? *(const float2*)p : make_float2(0.f, 0.f);
  a = v.x;
  b = v.y;
}
__device__ __forceinline__ void ldk2(const __half* p, bool in, float& a, float& b) {
  __half2 v = in ? *(const __half2*)p : __floats2half2_rn(0.f, 0.f);
  a = __low2float(v);
  b = __high2float(v);
}

// Many splits (a long context): the merge of attnArrive in a fixed number of round trips. The
// (m, l) of every split are loaded at once (one per thread), reduced to the block's max M and
// weights w_j = exp(m_j - M) (sW) and L = sum of l_j w_j; then each column sums w_j acc_j over
// its splits with ATT_WIDE_UNROLL loads in flight (a 256-thread block: two threads a column, each
// half of the splits, then added in order). Eight splits a round, as attnArrive folds them in,
// took ceil(nAct / 8) dependent L2 round trips: seven at 50 splits (a 1.5K context on the 0.6B).
// The bits depend on nAct and the block size only, so a row's result is the same in any batch.
constexpr int ATT_WIDE_MIN = 17;    // fewer splits: attnArrive's own loop (one or two rounds)
constexpr int ATT_WIDE_MAX = 256;   // more: attnArrive's own loop (sW's size)
constexpr int ATT_WIDE_UNROLL = 32;
// attnMergeWide's shared memory, given by the caller: a kernel whose tiles are done by then lends
// it from their buffer, so a static array does not count against every block's occupancy.
struct AttnWideScratch {
  float w[ATT_WIDE_MAX], red[32], a[128];
};
__device__ inline void attnMergeWide(const float* base, size_t stride, float* out, int r, int h, int H, int nAct, float* lse,
                              uint16_t* outHi, size_t loOff, AttnWideScratch& sm) {
  constexpr int hd = 128;
  float* const sW = sm.w;
  float* const sRed = sm.red;
  float* const sA = sm.a;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nW = blockDim.x >> 5;
  // (m, l) of every split in one round trip: blockDim >= 128 and nAct <= 256, so at most two a thread.
  float mj[2], lj[2], mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < 2; k++) {
    const int j = tid + k * blockDim.x;
    mj[k] = -INFINITY;
    lj[k] = 0.f;
    if (j < nAct) {
      const float* ps = base + (size_t)j * stride;
      mj[k] = __ldcg(ps);
      lj[k] = __ldcg(ps + 1);
    }
    if (lj[k] > 0.f) mx = fmaxf(mx, mj[k]);
  }
  mx = warpMax(mx);
  if (lane == 0) sRed[warp] = mx;
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < nW; w++) M = fmaxf(M, sRed[w]);
  __syncthreads();  // sRed is reused for L
  float lw = 0.f;
#pragma unroll
  for (int k = 0; k < 2; k++) {
    const int j = tid + k * blockDim.x;
    if (j < nAct) {
      const float w = lj[k] > 0.f ? expf(mj[k] - M) : 0.f;
      sW[j] = w;
      lw += lj[k] * w;
    }
  }
  lw = warpSum(lw);
  if (lane == 0) sRed[warp] = lw;
  __syncthreads();
  float L = 0.f;
  for (int w = 0; w < nW; w++) L += sRed[w];
  // Columns: thread tid takes column tid % hd and every halves-th split from tid / hd.
  const int halves = (int)blockDim.x / hd, t = tid % hd, half = tid / hd;
  float a = 0.f;
  if (half < halves) {
    for (int j0 = half; j0 < nAct; j0 += ATT_WIDE_UNROLL * halves) {
      float v[ATT_WIDE_UNROLL];
#pragma unroll
      for (int u = 0; u < ATT_WIDE_UNROLL; u++) {
        const int j = j0 + u * halves;
        v[u] = j < nAct ? __ldcg(base + (size_t)j * stride + 2 + t) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < ATT_WIDE_UNROLL; u++) {
        const int j = j0 + u * halves;
        if (j < nAct) a += sW[j] * v[u];
      }
    }
  }
  // Halves past the first add theirs in order (at most two halves at blockDim <= 256).
  for (int k = 1; k < halves; k++) {
    if (half == k) sA[t] = a;
    __syncthreads();
    if (half == 0) a += sA[t];
    __syncthreads();
  }
  if (half == 0) {
    const size_t oi = (size_t)r * H * hd + (size_t)h * hd + t;
    const float v = L > 0.f ? a / L : 0.f;
    out[oi] = v;
    if (outHi) storeSplit(v, outHi, loOff ? outHi + loOff : nullptr, oi);
    if (lse && t == 0) lse[(size_t)r * H + h] = L > 0.f ? M + logf(L) : -INFINITY;
  }
}

// The split's partials counted at counter c: true in the block that arrives last of the nAct
// (which re-arms the counter), whose reads of the others' partials follow.
__device__ inline bool attnCount(int* c, int nAct) {
  NERVA_TRACE_MARK();  // the split's partial is written
  __shared__ int lastFlag;
  __threadfence();  // this block's partial is visible before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    int old = atomicAdd(c, 1);
    lastFlag = old == nAct - 1;
    if (lastFlag) *c = 0;
  }
  __syncthreads();
  if (!lastFlag) return false;
  __threadfence();
  return true;
}

// The nAct live splits' partials of (row, head h) merged into out (the last arriving block's).
__device__ inline void attnMergeSplits(const float* part, float* out, int rl, int r, int h, int H, int hd, int S, int nAct,
                                       float* lse, AttnWideScratch& wide, uint16_t* outHi, size_t loOff) {
  // Each thread merges its output columns on its own: (m, l, acc) of eight splits are loaded
  // at once and folded in with an online rescale, so the merge is one L2 round trip per eight
  // splits with no block reductions between the loads. (Loading every (m, l) first, reducing M
  // and L across the block, then the accumulators cost two round trips and four barriers.)
  const size_t stride = (size_t)hd + 2;
  const float* base = part + ((size_t)rl * H + h) * S * stride;
  if (hd == 128 && blockDim.x >= 128 && nAct >= ATT_WIDE_MIN && nAct <= ATT_WIDE_MAX) {
    attnMergeWide(base, stride, out, r, h, H, nAct, lse, outHi, loOff, wide);
    return;
  }
  for (int t = threadIdx.x; t < hd; t += blockDim.x) {
    float M = -INFINITY, L = 0.f, a = 0.f;
    for (int s0 = 0; s0 < nAct; s0 += 8) {
      float mm[8], ll[8], aa[8];
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const float* ps = base + (size_t)(s0 + j) * stride;
        const bool in = s0 + j < nAct;
        mm[j] = in ? __ldcg(ps) : -INFINITY;
        ll[j] = in ? __ldcg(ps + 1) : 0.f;
        aa[j] = in ? __ldcg(ps + 2 + t) : 0.f;
      }
      float bm = M;
#pragma unroll
      for (int j = 0; j < 8; j++)
        if (ll[j] > 0.f) bm = fmaxf(bm, mm[j]);
      if (bm == -INFINITY) continue;  // no live split yet
      const float c = M == -INFINITY ? 0.f : expf(M - bm);
      L *= c;
      a *= c;
#pragma unroll
      for (int j = 0; j < 8; j++)
        if (ll[j] > 0.f) {
          const float w = expf(mm[j] - bm);
          L += ll[j] * w;
          a += aa[j] * w;
        }
      M = bm;
    }
    const size_t oi = (size_t)r * H * hd + (size_t)h * hd + t;
    const float v = L > 0.f ? a / L : 0.f;
    out[oi] = v;
    if (outHi) storeSplit(v, outHi, loOff ? outHi + loOff : nullptr, oi);
    if (lse && t == 0) lse[(size_t)r * H + h] = L > 0.f ? M + logf(L) : -INFINITY;
  }
}


// The block that arrives last of the nAct live splits of its (row, head) merges their partials
// into out and re-arms the counter: the combine needs no kernel (node) of its own. Splits past
// the live length do not arrive at all (every block derives the same nAct from positions[r]),
// so a short context pays no fence or atomic for the idle splits of the grid.
// outHi (a many-row GEMM's operand hand-off, see SplitHandoff): the merged values also as their
// bf16 split (storeSplit), the lo halves loOff elements on (loOff 0: none).
// (Measured without gain on the 0.6B shape: sixteen splits a load round; the fences of thread 0
// alone around the counter; merging in thread block clusters over distributed shared memory, and
// the last split polling for the others.)
// wide: attnMergeWide's shared memory (used past ATT_WIDE_MIN live splits).
__device__ inline void attnArrive(const float* part, float* out, int* counters, int rl, int r, int h, int H, int hd, int S,
                                  int nAct, float* lse, AttnWideScratch& wide, uint16_t* outHi = nullptr, size_t loOff = 0) {
  if (attnCount(counters + (size_t)rl * H + h, nAct))
    attnMergeSplits(part, out, rl, r, h, H, hd, S, nAct, lse, wide, outHi, loOff);
}

// attnArrive for a block holding the partials of G heads h0 .. h0 + G - 1 (a KV head's): one
// fence and one count for all of them, on head h0's counter, and the last block merges every
// head, each as attnArrive would (the same merge, so the same bits). Counting each head apart
// cost G fenced round trips to L2 in a row at the end of every block.
__device__ inline void attnArriveGroup(const float* part, float* out, int* counters, int rl, int r, int h0, int G, int H,
                                       int hd, int S, int nAct, float* lse, AttnWideScratch& wide, uint16_t* outHi,
                                       size_t loOff) {
  if (!attnCount(counters + (size_t)rl * H + h0, nAct)) return;
  for (int g = 0; g < G; g++) {
    if (g > 0) __syncthreads();  // the wide merge's shared memory is reused
    attnMergeSplits(part, out, rl, r, h0 + g, H, hd, S, nAct, lse, wide, outHi, loOff);
  }
}

// Which head element lane `lane` holds as its j-th. PAIR (headDim a multiple of 64): lanes hold
// adjacent pairs, (2 lane, 2 lane + 1) then the same 64 elements on, so a lane loads its keys and
// values two elements at a time (a bf16 pair is one 4-byte load: whole 128-byte lines per warp).
// Otherwise element j * 32 + lane. Either way the rotated pair (i, i + 64) is (j, j + 2) of one
// lane.
template <bool PAIR>
__device__ __forceinline__ int attnElem(int j, int lane) {
  return PAIR ? (j & 1) + 2 * lane + 64 * (j >> 1) : j * 32 + lane;
}

// The lane's four head-norm weights (attnElem order), 1 without a norm: loaded apart from the
// head so a kernel can take them before its dependency wait.
template <bool PAIR>
__device__ __forceinline__ void headNormWeights(float (&w)[4], const void* nw, int ndt, int lane) {
#pragma unroll
  for (int j = 0; j < 4; j++) w[j] = nw ? ldf(nw, ndt, attnElem<PAIR>(j, lane)) : 1.f;
}

// rope_append's arithmetic on one head held by a warp, headDim 128, lane elements as attnElem,
// with the head norm's weights w (headNormWeights) where `norm`. cs[i] holds the float64 cos and
// sin of angle i.
template <bool PAIR>
__device__ __forceinline__ void ropeHeadWarpW(float (&a)[4], bool norm, const float (&w)[4], float eps,
                                              const double (*cs)[2], int lane) {
  if (norm) {
    float ss = warpSum(a[0] * a[0] + a[1] * a[1] + a[2] * a[2] + a[3] * a[3]);
    float inv = rsqrtf(ss / 128.f + eps);
#pragma unroll
    for (int j = 0; j < 4; j++) a[j] = a[j] * inv * w[j];
  }
#pragma unroll
  for (int j = 0; j < 2; j++) {
    const int i = attnElem<PAIR>(j, lane);
    double c = cs[i][0], sn = cs[i][1];
    float x = a[j], y = a[j + 2];
    a[j] = (float)((double)x * c - (double)y * sn);
    a[j + 2] = (float)((double)y * c + (double)x * sn);
  }
}

template <bool PAIR>
__device__ __forceinline__ void ropeHeadWarp(float (&a)[4], const void* nw, int ndt, float eps, const double (*cs)[2],
                                             int lane) {
  float w[4];
  headNormWeights<PAIR>(w, nw, ndt, lane);
  ropeHeadWarpW<PAIR>(a, nw != nullptr, w, eps, cs, lane);
}

// EPL: head elements per lane (headDim <= 32 * EPL). Sizing the key/value registers to the
// head (4 for headDim 128) rather than to the largest head takes the kernel from 128 registers a
// thread to 80 (103 with ROPE), so more of the next kernel's blocks fit beside it.
// The body of the split-KV kernels k_attn_partial and k_attn_partial_rope (below).

}  // namespace nerva::ops
