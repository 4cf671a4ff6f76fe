// Decode attention without a global merge (k_attn_decode_short).
// One thread block cluster per (row, KV head): its C blocks share the keys 0..last evenly, each
// serving the G q heads of the KV head. A block copies its keys and values into shared memory
// with cp.async before its dependency wait (they were written by earlier steps), so they arrive
// while qkv still runs; after the wait it takes q and the new key from the qkv rows (rope_append's
// arithmetic, as the split-KV kernel does), scores and folds its keys, and the cluster merges the
// blocks' partials through distributed shared memory (st.async, counted by each merging block's
// transaction barrier): no fence, counter or L2 round trip between the keys and the output. The
// tile is sized from the caller's bound (op decoder_layers' maxKeys), so one pass takes a block's
// keys; should a row exceed the bound, the keys beyond the tile are taken in further passes
// (loaded after the wait), slower but the same attention. headDim 128, exact numerics (f32
// arithmetic), f32 or bf16 caches.
#include <cooperative_groups.h>

#include "common/elem.cuh"
#include "common/exec.cuh"
#include "common/cluster.cuh"
#include "ops/attention/attn_common.cuh"
#include "ops/ops.h"

namespace nerva::ops {

constexpr int SA_THREADS = 128;
constexpr int SA_HD = 128;
constexpr int SA_MAX_C = 16;  // cluster size (16: non-portable)
constexpr int SA_MAX_KEYS = 1024;  // the most keys (maxKeys) the kernel is chosen for
// At most 128 registers a thread (65536 / (4 * 128)): a block then fits beside two of qkv's lean
// blocks (GEMV_LEAN_REGS), which is what lets it copy its keys while qkv runs.
constexpr int SA_MIN_BLOCKS = 4;

template <typename KT>
__host__ __device__ constexpr int saRowElems() {
  return SA_HD + 64 / (int)sizeof(KT);  // padded: a row starts 64 bytes on (16 banks) from the one before
}
template <typename KT>
size_t saSmemBytes(int cap) {
  return (size_t)cap * 2 * saRowElems<KT>() * sizeof(KT) + (size_t)cap * sizeof(long long);
}

__device__ __forceinline__ void saLoad8(const float* p, float (&v)[8]) {
  const float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void saLoad8(const uint16_t* p, float (&v)[8]) {
  const uint4 a = *(const uint4*)p;
  const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void saLoad4(const float* p, float (&v)[4]) {
  const float4 a = *(const float4*)p;
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}
__device__ __forceinline__ void saLoad4(const uint16_t* p, float (&v)[4]) {
  const uint2 a = *(const uint2*)p;
  v[0] = __uint_as_float(a.x << 16), v[1] = __uint_as_float(a.x & 0xffff0000u);
  v[2] = __uint_as_float(a.y << 16), v[3] = __uint_as_float(a.y & 0xffff0000u);
}
// Softmax partials (m, l), one a lane (lanes 0..n-1; l = 0 elsewhere and for an empty partial),
// merged by a warp: each lane's weight exp(m - M) under their maximum M (0 where l = 0), and
// L = sum of l * weight in lane order.
__device__ __forceinline__ float saWeight(float l, float m, int n, float& M, float& L) {
  const float mm = l > 0.f ? m : -INFINITY;
  M = mm;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  const float w = l > 0.f ? expf(mm - M) : 0.f;
  L = 0.f;
  for (int b = 0; b < n; b++) L += __shfl_sync(0xffffffffu, l * w, b);
  return w;
}
// saWeight for the G heads at once: head g's n partials on lanes g S .. g S + n - 1 (S, a power
// of two >= n with G S <= 32; l = 0 on the group's other lanes), so the heads' shuffle and exp
// chains run side by side instead of one after the other. Each lane gets its group's M and L;
// the same values as saWeight per head (the maximum does not depend on order, L sums in lane
// order within the group).
template <int S>
__device__ __forceinline__ float saWeightGroup(float l, float m, int n, int lane, float& M, float& L) {
  const float mm = l > 0.f ? m : -INFINITY;
  M = mm;
#pragma unroll
  for (int o = S / 2; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  const float w = l > 0.f ? expf(mm - M) : 0.f;
  const float lw = l * w;
  const int base = lane & ~(S - 1);
  L = 0.f;
#pragma unroll
  for (int b = 0; b < S; b++) {
    const float t = __shfl_sync(0xffffffffu, lw, base + b);
    if (b < n) L += t;
  }
  return w;
}
__device__ __forceinline__ void saCopy16(void* dst, const void* src, bool in) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(in ? 16 : 0) : "memory");
}
__device__ __forceinline__ void saCopyWait() { asm volatile("cp.async.wait_all;" ::: "memory"); }

template <typename KT, int G>
__global__ void __launch_bounds__(SA_THREADS, SA_MIN_BLOCKS) k_attn_decode_short(const float* q, KT* kc, KT* vc, const int* bt,
                                                                 const int* rowSeq, const int* positions, float* out,
                                                                 int H, int KVH, int bs, int mbps, int qStride, int qOff,
                                                                 float scale, int cap, RopeFuse rf, int markAt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters need sm_90: never launched there (attnShortFits, capabilities.decodeShortKeys)
#else
  namespace cg = cooperative_groups;
  constexpr int LD = saRowElems<KT>();
  constexpr int CPR = SA_HD * (int)sizeof(KT) / 16;  // 16-byte copies a row
  constexpr int NW = SA_THREADS / 32;
  extern __shared__ __align__(16) unsigned char sasm[];
  KT* const ks = (KT*)sasm;                  // cap rows of keys
  KT* const vs = ks + (size_t)cap * LD;      // then cap rows of values
  long long* const slotS = (long long*)(vs + (size_t)cap * LD);  // -1: not in this cache; -2: the new key
  __shared__ __align__(16) float qs[G][SA_HD];
  __shared__ __align__(16) float accW[NW][G][SA_HD];
  __shared__ double shcs[64][2];

  NERVA_TRACE_KERNEL_AT(300000);  // trace_timeline.py: decode_short.cu:300000
#ifdef NERVA_ATTN_SKIP
  pdlWait();
  pdlTrigger();
  return;
#endif
  cg::cluster_group cl = cg::this_cluster();
  const int C = (int)cl.num_blocks(), rank = (int)cl.block_rank();
  const int kvh = blockIdx.y, r = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int last = positions[r];
  const int chunk = (last + C) / C;  // keys 0..last over the C blocks
  const int start = rank * chunk, stop = min(start + chunk, last + 1);  // [start, stop)
  const int* btr = bt + (size_t)rowSeq[r] * mbps;
  const size_t width = (size_t)KVH * SA_HD;
  // This block's slice of the merge: C partials of SL elements and C (m, l) pairs a head.
  constexpr int NE = G * SA_HD;
  const int SL = NE / C;
  __shared__ __align__(8) unsigned long long txBar;
  const unsigned bar = saShared(&txBar);
  if (tid == 0) saTxInit(bar, (unsigned)(C * (SL + 2 * G) * sizeof(float)));
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");

  // Slots and copies of keys [t0, t0 + n). The first tile is copied before the wait, when the new
  // key (last) is not in the cache yet: the owner warp puts it in from registers (-2). A later tile
  // reads it back from the cache, where that warp has stored it.
  auto issue = [&](int t0, int n, bool first) {
    for (int i = tid; i < n; i += SA_THREADS) {
      const int p = t0 + i;
      long long s = -2;
      if (p != last || !first) {
        const int e = btr[p / bs];
        s = e >= 0 ? (long long)e * bs + p % bs : -1;  // a negative entry: the block lives in another cache
      }
      slotS[i] = s;
    }
    __syncthreads();
    for (int c = tid; c < n * CPR; c += SA_THREADS) {
      const int i = c / CPR, part = c % CPR;
      const long long s = slotS[i];
      const size_t off = (size_t)max(s, 0ll) * width + (size_t)kvh * SA_HD + (size_t)part * (16 / sizeof(KT));
      saCopy16(ks + (size_t)i * LD + part * (16 / sizeof(KT)), kc + off, s >= 0);
      saCopy16(vs + (size_t)i * LD + part * (16 / sizeof(KT)), vc + off, s >= 0);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };

  const int n0 = max(0, min(cap, stop - start));
  if (n0 > 0) issue(start, n0, true);
  if (tid < 64) sincos((double)__fmul_rn((float)last, rf.invFreq[tid]), &shcs[tid][1], &shcs[tid][0]);
  // What the q heads and the new key need besides the qkv rows, taken before the wait (weights,
  // and the new key's slot: advance_positions, which wrote it, completed before qkv's wait,
  // after which qkv let this kernel launch).
  const bool owner = last >= start && last < stop;
  float nwq[4], nwk[4];
  headNormWeights<true>(nwq, warp < G ? rf.qn : nullptr, rf.ndt, lane);
  headNormWeights<true>(nwk, owner && warp == G % NW ? rf.kn : nullptr, rf.ndt, lane);
  const int newSlot = owner ? rf.slots[r] : -1;
  __syncthreads();
  pdlWait();
  // (Letting o in only after the keys are folded, or at the exit, was slower.)
  pdlTrigger();

  // q heads (warps 0..G-1) and, in the block that holds key `last`, the new key and value.
  if (warp < G) {
    const float* qr = q + (size_t)r * qStride + qOff + (size_t)(kvh * G + warp) * SA_HD;
    float a[4];
#pragma unroll
    for (int j = 0; j < 4; j++) a[j] = qr[attnElem<true>(j, lane)];
    ropeHeadWarpW<true>(a, rf.qn != nullptr, nwq, rf.eps, shcs, lane);
#pragma unroll
    for (int j = 0; j < 4; j++) qs[warp][attnElem<true>(j, lane)] = a[j] * scale;
  }
  if (owner && warp == G % NW) {  // (G = NW: warp 0, after its q head)
    const float* krow = q + (size_t)r * qStride + qOff + (size_t)(H + kvh) * SA_HD;
    const float* vrow = krow + width;
    float kr4[4], vr4[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      kr4[j] = krow[attnElem<true>(j, lane)];
      vr4[j] = vrow[attnElem<true>(j, lane)];
    }
    ropeHeadWarpW<true>(kr4, rf.kn != nullptr, nwk, rf.eps, shcs, lane);
    const int sl = newSlot;
    const int li = last - start;  // its row in the tile (the new key is in the first pass when it fits)
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int e = attnElem<true>(j, lane);
      if (sl >= 0) {
        stk(kc + (size_t)sl * width + (size_t)kvh * SA_HD, e, kr4[j]);
        stk(vc + (size_t)sl * width + (size_t)kvh * SA_HD, e, vr4[j]);
      }
      if (li < cap) {
        // As the cache stores it, so the row sees the same key whether it reads it back or not.
        if constexpr (std::is_same<KT, float>::value) {
          ks[(size_t)li * LD + e] = kr4[j];
          vs[(size_t)li * LD + e] = vr4[j];
        } else {
          ks[(size_t)li * LD + e] = f2bf(kr4[j]);
          vs[(size_t)li * LD + e] = f2bf(vr4[j]);
        }
      }
    }
  }

  // A warp takes 8 keys at a time (keys 32 j + 8 warp ..), a quad of lanes a key: lane `qp` of
  // the quad holds every fourth 16-byte chunk of q and of the key (padded rows put the 8 keys of
  // a phase in distinct banks), so a score is 32 products and two shuffles. The warp keeps its
  // own running softmax, as the split-KV kernel's warps do; lane `lane` owns the value columns
  // 4 lane .. 4 lane + 3.
  constexpr int EPC = 16 / (int)sizeof(KT);  // elements a 16-byte chunk
  constexpr int CH = SA_HD / EPC / 4;        // chunks a lane of a quad takes
  const int qp = lane & 3, kq = lane >> 2;
  float m[G], l[G], acc[G][4];
#pragma unroll
  for (int g = 0; g < G; g++) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) acc[g][j] = 0.f;
  }
  float qr[G][CH * EPC];
  bool qLoaded = false;
  // NB batches of 8 keys (k0 + b NW 8 + kq, a quad a key) folded into the warp's running softmax
  // in one step. NB = 1 is the one-batch fold; a batch with no live key yet (mn = -inf) leaves m,
  // l and acc as they are (corr 0 on zeros, p 0).
  auto fold = [&](auto nbc, int k0, int n) {
    constexpr int NB = decltype(nbc)::value;
    float d[NB][G], p[NB][G], mx[G], ps[G];
    bool live[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) {
      const int i = k0 + b * NW * 8 + kq;  // this quad's key
      live[b] = i < n && slotS[i] != -1;
#pragma unroll
      for (int g = 0; g < G; g++) d[b][g] = 0.f;
      // Past the tile's n keys a quad scores row n - 1 again (loaded, so finite) and drops it
      // (live is false): no branch, so both batches' loads are in flight at once.
      const KT* kr = ks + (size_t)min(i, n - 1) * LD + qp * EPC;
#pragma unroll
      for (int c = 0; c < CH; c++) {
        float kv[EPC];
        if constexpr (EPC == 4) {
          saLoad4(kr + c * 4 * EPC, kv);
        } else {
          saLoad8(kr + c * 4 * EPC, kv);
        }
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
          for (int e = 0; e < EPC; e++) d[b][g] += qr[g][c * EPC + e] * kv[e];
      }
    }
    // Every head and batch step by step, so their shuffle and exp chains overlap.
#pragma unroll
    for (int b = 0; b < NB; b++)
#pragma unroll
      for (int g = 0; g < G; g++) d[b][g] += __shfl_xor_sync(0xffffffffu, d[b][g], 1);
#pragma unroll
    for (int b = 0; b < NB; b++)
#pragma unroll
      for (int g = 0; g < G; g++) d[b][g] += __shfl_xor_sync(0xffffffffu, d[b][g], 2);
#pragma unroll
    for (int g = 0; g < G; g++) {
      mx[g] = live[0] ? d[0][g] : -INFINITY;
#pragma unroll
      for (int b = 1; b < NB; b++) mx[g] = fmaxf(mx[g], live[b] ? d[b][g] : -INFINITY);
    }
#pragma unroll
    for (int o = 4; o < 32; o <<= 1)
#pragma unroll
      for (int g = 0; g < G; g++) mx[g] = fmaxf(mx[g], __shfl_xor_sync(0xffffffffu, mx[g], o));
#pragma unroll
    for (int g = 0; g < G; g++) {
      const float mn = fmaxf(m[g], mx[g]);
      ps[g] = 0.f;
#pragma unroll
      for (int b = 0; b < NB; b++) {
        p[b][g] = live[b] ? expf(d[b][g] - mn) : 0.f;  // live: d finite, so mn is
        ps[g] = b == 0 ? p[b][g] : ps[g] + p[b][g];
      }
      mx[g] = m[g] == -INFINITY ? 0.f : expf(m[g] - mn);  // now the rescale of what came before
      m[g] = mn;
    }
#pragma unroll
    for (int o = 4; o < 32; o <<= 1)  // one key a quad (a lane's keys summed first): the sum over the 8 quads
#pragma unroll
      for (int g = 0; g < G; g++) ps[g] += __shfl_xor_sync(0xffffffffu, ps[g], o);
#pragma unroll
    for (int g = 0; g < G; g++) {
      l[g] = l[g] * mx[g] + ps[g];
#pragma unroll
      for (int j = 0; j < 4; j++) acc[g][j] *= mx[g];
    }
    // The batch's 8 value rows, loaded together (a row past n is row n - 1 again, finite, and
    // its weight p is 0: a dead key adds exactly 0): no branch between the loads, so they are all
    // in flight at once instead of one shared-memory round trip a key.
#pragma unroll
    for (int b = 0; b < NB; b++) {
      const int kb = k0 + b * NW * 8;
      float v4[8][4];
#pragma unroll
      for (int kk = 0; kk < 8; kk++) saLoad4(vs + (size_t)min(kb + kk, n - 1) * LD + 4 * lane, v4[kk]);
#pragma unroll
      for (int kk = 0; kk < 8; kk++) {
#pragma unroll
        for (int g = 0; g < G; g++) {
          const float pk = __shfl_sync(0xffffffffu, p[b][g], kk * 4);
#pragma unroll
          for (int j = 0; j < 4; j++) acc[g][j] += pk * v4[kk][j];
        }
      }
    }
  };
  for (int t0 = start; t0 < stop; t0 += cap) {
    const int n = min(cap, stop - t0);
    if (t0 != start) {
      __syncthreads();  // the tile before is used up
      issue(t0, n, false);
    }
    saCopyWait();
    __syncthreads();
    if (t0 == start && markAt == 1) NERVA_TRACE_MARK();  // q, the new key and the first tile are in
    if (!qLoaded) {
      qLoaded = true;
#pragma unroll
      for (int g = 0; g < G; g++)
#pragma unroll
        for (int c = 0; c < CH; c++)
#pragma unroll
          for (int e = 0; e < EPC; e++) qr[g][c * EPC + e] = qs[g][(c * 4 + qp) * EPC + e];
    }
    // A warp's batches two at a time where it has two (keys k0 and k0 + NW * 8): their loads,
    // shuffles and exps overlap, and the running softmax takes one step for both.
    for (int k0 = warp * 8; k0 < n;) {
      if (k0 + NW * 8 < n) {
        fold(std::integral_constant<int, 2>{}, k0, n);
        k0 += 2 * NW * 8;
      } else {
        fold(std::integral_constant<int, 1>{}, k0, n);
        k0 += NW * 8;
      }
    }
  }
  if (markAt == 3) NERVA_TRACE_MARK();  // keys folded
  // The block's partial (the warps' in order), each element pushed to the block of the cluster
  // that merges it (block c merges elements c * SL ..), with the block's (m, l) to every block:
  // once its transaction barrier has counted them all, each block merges from its own shared
  // memory.
  __shared__ float mW[NW][G], lW[NW][G];
  __shared__ __align__(16) float inbox[NE];          // [C][SL]: the cluster's partials of my slice
  __shared__ float inM[SA_MAX_C][G], inL[SA_MAX_C][G];
#pragma unroll
  for (int g = 0; g < G; g++) *(float4*)&accW[warp][g][4 * lane] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; g++) {
      mW[warp][g] = m[g];
      lW[warp][g] = l[g];
    }
  }
  __syncthreads();
  // The warps' weights under the block's maximum, a lane of warp 0 each (in parallel, not a chain
  // of exps a thread); the sums then run in warp order as before.
  __shared__ float wW[NW][G], mB[G], lB[G];
  static_assert(NW == 4 && G * NW <= 32, "a lane a (head, warp) pair");
  if (warp == 0) {
    const int g = lane / NW, w = lane % NW;
    const bool in = g < G;
    float M, L;
    const float wt = saWeightGroup<NW>(in ? lW[w][g] : 0.f, in ? mW[w][g] : 0.f, NW, lane, M, L);
    if (in) wW[w][g] = wt;
    if (in && w == 0) {
      mB[g] = M;
      lB[g] = L;
    }
  }
  __syncthreads();
  const int slLog = __ffs(SL) - 1;  // SL = G 128 / C, a power of two: shifts, not divisions
  // Every block's barrier is initialized (the relaxed arrive at the start; long passed by now).
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  for (int e = tid; e < NE; e += SA_THREADS) {
    const int g = e / SA_HD;
    float a = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) a += accW[w][g][e % SA_HD] * wW[w][g];
    const int dst = e >> slLog;
    saStAsync(saMapa(saShared(&inbox[rank * SL + (e & (SL - 1))]), dst), a, saMapa(bar, dst));
  }
  if (tid < C * G) {
    const int c = tid / G, g = tid % G;
    const unsigned rb = saMapa(bar, c);
    saStAsync(saMapa(saShared(&inM[rank][g]), c), mB[g], rb);
    saStAsync(saMapa(saShared(&inL[rank][g]), c), lB[g], rb);
  }
  if (markAt == 4) NERVA_TRACE_MARK();  // partial pushed
  saTxWait(bar);  // the cluster's partials of this block's slice are in (its own included)
  if (markAt == 5) NERVA_TRACE_MARK();  // the cluster's partials are in
  // The C partials' weights, a lane of warp 0 each; then every output of this block's slice.
  __shared__ float wC[SA_MAX_C][G], lC[G];
  if (warp == 0) {
    // The G heads side by side where their groups of lanes fit the warp (C and S powers of two).
    auto grouped = [&](auto sc) {
      constexpr int S = decltype(sc)::value;
      const int g = lane / S, c = lane % S;
      const bool in = g < G && c < C;
      float M, L;
      const float wt = saWeightGroup<S>(in ? inL[c][g] : 0.f, in ? inM[c][g] : 0.f, C, lane, M, L);
      if (in) wC[c][g] = wt;
      if (in && c == 0) lC[g] = L;
    };
    if (C <= 2) {
      grouped(std::integral_constant<int, 2>{});
    } else if (C <= 4) {
      grouped(std::integral_constant<int, 4>{});
    } else if (C <= 8 && G <= 4) {
      grouped(std::integral_constant<int, 8>{});
    } else if (G <= 2) {
      grouped(std::integral_constant<int, 16>{});
    } else {
#pragma unroll
      for (int g = 0; g < G; g++) {
        float M, L;
        const float wt = saWeight(lane < C ? inL[lane][g] : 0.f, lane < C ? inM[lane][g] : 0.f, C, M, L);
        if (lane < C) wC[lane][g] = wt;
        if (lane == 0) lC[g] = L;
      }
    }
  }
  __syncthreads();
  for (int t = tid; t < SL; t += SA_THREADS) {
    const int e = rank * SL + t, g = e / SA_HD;
    float a = 0.f;
    for (int b = 0; b < C; b++) a += inbox[b * SL + t] * wC[b][g];
    const float L = lC[g];
    out[(size_t)r * H * SA_HD + (size_t)(kvh * G) * SA_HD + e] = L > 0.f ? a / L : 0.f;
  }
  if (markAt == 6) NERVA_TRACE_MARK();  // merged
#endif
}

// Blocks a cluster (a KV head) of k_attn_decode_short: 8 measured fastest on the 0.6B at 128-384
// keys (4 and 16 about 3.5 % slower).
constexpr int SA_CLUSTER = 8;

template <typename KT, int G>
cudaError_t attnShortLaunch(NervaExec* ex, int C, int cap, int rows, const float* q, KT* kc, KT* vc, const int* bt,
                            const int* rowSeq, const int* pos, float* out, int H, int KVH, int bs, int mbps, int qStride,
                            int qOff, float scale, const RopeFuse& rf) {
  // Where blocks mark the trace (1..6; trace builds: -DNERVA_SA_MARK=N).
#ifdef NERVA_SA_MARK
  const int markAt = NERVA_SA_MARK;
#else
  const int markAt = 0;
#endif
  auto fn = k_attn_decode_short<KT, G>;
  const size_t smem = saSmemBytes<KT>(cap);
  cudaError_t e = allowDynamicSmem(fn, smem);
  if (e != cudaSuccess) return e;
  if (C > 8 && (e = allowKernelAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)) != cudaSuccess) return e;
  ClusterLaunch L(dim3((unsigned)C, (unsigned)KVH, (unsigned)rows), SA_THREADS, smem, C, ex->stream, ex->pdl);
  return cudaLaunchKernelEx(&L.cfg, fn, q, kc, vc, bt, rowSeq, pos, out, H, KVH, bs, mbps, qStride, qOff, scale, cap, rf, markAt);
}

// Whether clusters of C blocks of k_attn_decode_short<KT, G> holding SA_MAX_KEYS / C keys fit
// this GPU (asked once; where they do not, the split-KV kernel runs instead).
template <typename KT, int G>
bool attnShortFits(NervaExec* ex, int C) {
  static int fits[17] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  if (C <= 0 || C > 16) return false;
  if (fits[C] >= 0) return fits[C] == 1;
  auto fn = k_attn_decode_short<KT, G>;
  const size_t smem = saSmemBytes<KT>((SA_MAX_KEYS + C - 1) / C);
  ClusterLaunch L(dim3((unsigned)C, 1, 1), SA_THREADS, smem, C, nullptr, false);
  int clusters = 0;
  if (ex->smemOptin < (int)smem || allowDynamicSmem(fn, smem) != cudaSuccess ||
      (C > 8 && allowKernelAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) ||
      cudaOccupancyMaxActiveClusters(&clusters, fn, &L.cfg) != cudaSuccess) {
    cudaGetLastError();
    clusters = 0;
  }
  fits[C] = clusters > 0 ? 1 : 0;
  return fits[C] == 1;
}

// Decode rows with the fused rope whose keys the caller bounds (maxKeys, op decoder_layers):
// k_attn_decode_short, a cluster a KV head holding every key in shared memory, no global merge
// (0.6B at batch 1, f32 KV: 1.05x at 384 keys, 1.06-1.08x at 512-1024 against the split kernel;
// the 8B's four q heads a KV head measured 0.99x, so it takes G <= 2 only; one row only, the case
// measured).
int attnShortTry(NervaExec* ex, const float* qPtr, Buf kc, Buf vc, float* outPtr, Buf bt, Buf rowSeq, Buf pos, int rows,
                 int H, int KVH, int hd, int bs, int mbps, int qStride, int qOff, float scale, int decodeOnly,
                 const RopeFuse* rope, int maxKeys) {
  const int saC = SA_CLUSTER;
  if (!(rope && decodeOnly && !ex->batchInv && hd == 128 && maxKeys > 0 && maxKeys <= SA_MAX_KEYS && rows == 1 &&
        (H / KVH == 1 || H / KVH == 2) && (kc.dt == NV_F32 || kc.dt == NV_BF16)))
    return -1;
  const bool fits = kc.dt == NV_F32 ? (H == KVH ? attnShortFits<float, 1>(ex, saC) : attnShortFits<float, 2>(ex, saC))
                                    : (H == KVH ? attnShortFits<uint16_t, 1>(ex, saC) : attnShortFits<uint16_t, 2>(ex, saC));
  if (!fits) return -1;
  const int cap = ((maxKeys + saC - 1) / saC + 7) / 8 * 8;  // keys a block holds: its share, in whole warps' batches
  const int *btp = (const int*)bt.p, *rsp = (const int*)rowSeq.p, *pp = (const int*)pos.p;
  cudaError_t e;
#define SA_L(KT, GG)                                                                                              \
  attnShortLaunch<KT, GG>(ex, saC, cap, rows, qPtr, (KT*)kc.p, (KT*)vc.p, btp, rsp, pp, outPtr, H, KVH, bs, mbps, \
                          qStride, qOff, scale, *rope)
  if (kc.dt == NV_F32) e = H == KVH ? SA_L(float, 1) : SA_L(float, 2);
  else e = H == KVH ? SA_L(uint16_t, 1) : SA_L(uint16_t, 2);
#undef SA_L
  return check(ex, "k_attn_decode_short", e);
}

}  // namespace nerva::ops

int nerva_decode_short_keys(const NervaExec* ex) {
  if (ex->bf16act || ex->batchInv) return 0;
  int dev = 0, clusters = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters ? nerva::ops::SA_MAX_KEYS : 0;
}
