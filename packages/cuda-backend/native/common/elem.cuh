// Element helpers shared by every kernel: bf16/f32 loads and stores, the bf16 rounding of bf16
// numerics, programmatic dependent launch, warp and block reductions, argmax merges.
// Header-only (inline __device__): each op family's translation unit gets its own copy.
#pragma once
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "nerva.h"
#include "common/quant.cuh"
#include "common/trace.cuh"

namespace nerva {

// ---------------------------------------------------------------- element access

__device__ __forceinline__ float bf2f(uint16_t b) { return __uint_as_float(((uint32_t)b) << 16); }

// Round to nearest even, NaN kept NaN: the same rule as f32ToBf16 in @nerva/core. On sm_80+ the
// hardware conversion rounds finite values and infinities alike (subnormals kept) in one
// instruction instead of ~11; a NaN keeps its sign and payload with the quiet bit set, as the
// software form does (the conversion would give the canonical NaN).
__device__ __forceinline__ uint16_t f2bf(float x) {
  const uint32_t b = __float_as_uint(x);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
  return isnan(x) ? (uint16_t)((b >> 16) | 0x40) : r;
#else
  if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu)) return (uint16_t)(((b >> 16) | 0x40) & 0xffff);
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
#endif
}

// bf16 numerics (NervaExec::bf16act, passed to kernels as `bfa`): R(v) of the op catalogue, the
// value rounded to bf16 where transformers' bf16 eager forward rounds it; the identity otherwise.
__device__ __forceinline__ float rbf(float v) { return bf2f(f2bf(v)); }
__device__ __forceinline__ float bfr(float v, int bfa) { return bfa ? rbf(v) : v; }

__device__ __forceinline__ float ldf(const void* p, int dt, size_t i) {
  switch (dt) {
    case NV_F32: return ((const float*)p)[i];
    case NV_BF16: return bf2f(((const uint16_t*)p)[i]);
    case NV_F16: return __half2float(((const __half*)p)[i]);
    case NV_I32: return (float)((const int*)p)[i];
    default: return qElem(p, dt, i);
  }
}

__device__ __forceinline__ void stf(void* p, int dt, size_t i, float v) {
  switch (dt) {
    case NV_F32: ((float*)p)[i] = v; break;
    case NV_BF16: ((uint16_t*)p)[i] = f2bf(v); break;
    case NV_F16: ((__half*)p)[i] = __float2half_rn(v); break;
    default: ((int*)p)[i] = (int)v; break;
  }
}

// Programmatic dependent launch (sm_90+). Every kernel is launched with programmatic stream
// serialization when the context enables it (NervaExec::pdl), so a kernel may start while the
// one before it in the stream is still running. Hence every kernel calls pdlWait() before it
// reads or writes anything another kernel touches (inputs, outputs, counters, host-visible
// rings), and only work on immutable data (weights) may come before it. griddepcontrol.wait
// returns once the previous grid has completed and its writes are visible; since every kernel
// waits, completion is transitive down the stream. pdlTrigger() lets the next kernel's blocks be
// scheduled now (onto free SM slots, where they prefetch their weights) instead of at our exit.
// Without the launch attribute (older archs, PDL off) both are no-ops.
__device__ __forceinline__ void pdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef NERVA_TRACE
  if (threadIdx.x == 0) s_trWait = trNow();
#endif
}
// Block b of n asks its share of [p, p + bytes) into L2 (one thread, bulk prefetches of at most
// 64 KiB; p 16-byte aligned): fire and forget, the block does not wait for it.
__device__ __forceinline__ void pullL2(const uint8_t* p, unsigned long long bytes, unsigned b, unsigned n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (!p || threadIdx.x != 0) return;
  const unsigned long long share = ((bytes + n - 1) / n + 15) & ~15ull;
  const unsigned long long lo = share * b, hi = min(bytes, lo + share);
  for (unsigned long long o = lo; o < hi; o += 65536) {
    const unsigned sz = (unsigned)min(65536ull, hi - o) & ~15u;
    if (sz) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + o), "r"(sz) : "memory");
  }
#endif
}
__device__ __forceinline__ void pdlTrigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// The entry of every kernel that has nothing to prefetch.
#define PDL_ENTER() \
  do {              \
    pdlWait();      \
    pdlTrigger();   \
  } while (0)

__device__ __forceinline__ float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum; every thread gets the result. `sh` needs 32 slots.
template <typename T>
__device__ T blockSum(T v, T* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  T t = 0;
  for (int i = 0; i < nw; i++) t += sh[i];
  __syncthreads();
  return t;
}

__device__ inline float blockMax(float v, float* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warpMax(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  float t = -INFINITY;
  for (int i = 0; i < nw; i++) t = fmaxf(t, sh[i]);
  __syncthreads();
  return t;
}

// Argmax of (value, index) pairs with the reference's rule: strictly greater wins, so the
// lowest index among equal maxima. idx < 0 means "nothing seen" (all -inf or NaN).
__device__ __forceinline__ void argmaxMerge(float& v, int& i, float v2, int i2) {
  if (i2 < 0) return;
  if (i < 0 || v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}
// The warp's (value, index) pairs merged by argmaxMerge in a butterfly: every lane gets the result.
__device__ __forceinline__ void warpArgmax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, i, o);
    argmaxMerge(v, i, v2, i2);
  }
}

// A block's per-thread (value, index) pairs reduced to one a warp, in shv/shi[warp] for every
// thread to read (the barrier before the writes: the arrays may hold an earlier call's pairs).
__device__ __forceinline__ void blockArgmaxStage(float bv, int bi, float* shv, int* shi) {
  warpArgmax(bv, bi);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    shv[threadIdx.x >> 5] = bv;
    shi[threadIdx.x >> 5] = bi;
  }
  __syncthreads();
}

// Block-wide argmax over L[begin, end); every thread gets (value, index), index -1 when nothing
// was seen (all -inf or NaN).
__device__ inline void blockArgmaxRange(const float* L, int begin, int end, float* shv, int* shi, float& outV, int& outI) {
  float bv = -INFINITY;
  int bi = -1;
  // U of the thread's logits loaded before any comparison (one round trip, not U), then taken in
  // index order as before: the same result.
  constexpr int U = 4;
  for (int i0 = begin + threadIdx.x; i0 < end; i0 += U * blockDim.x) {
    float v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int i = i0 + u * blockDim.x;
      v[u] = i < end ? L[i] : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (v[u] > bv) {  // (a slot past `end` holds -inf, never greater)
        bv = v[u];
        bi = i0 + u * blockDim.x;
      }
    }
  }
  blockArgmaxStage(bv, bi, shv, shi);
  const int nw = (blockDim.x + 31) >> 5;
  float v = -INFINITY;
  int idx = -1;
  for (int k = 0; k < nw; k++) argmaxMerge(v, idx, shv[k], shi[k]);
  __syncthreads();
  outV = v;
  outI = idx;
}

__device__ inline int blockArgmax(const float* L, int vocab, float* shv, int* shi) {
  float v;
  int idx;
  blockArgmaxRange(L, 0, vocab, shv, shi, v, idx);
  return idx < 0 ? 0 : idx;
}


// an operand stores it through here, so the bits are the same whichever kernel wrote it.
__device__ __forceinline__ void storeSplit(float v, uint16_t* hi, uint16_t* lo, size_t i) {
  const uint16_t h = f2bf(v);
  hi[i] = h;
  if (lo) lo[i] = f2bf(v - bf2f(h));
}

// Rows of floats, `stride` apart: row r's element j. An input of k_rmsnorm and k_rope_append
// beside GemmSum; both inputs are read as load() (the memory reads, several issued before any
// result is used) then finish() (the arithmetic on them).
struct FloatRows {
  using Raw = float;
  const float* x;
  int stride;
  __device__ __forceinline__ Raw load(int r, int j) const { return x[(size_t)r * stride + j]; }
  __device__ __forceinline__ float finish(Raw v, int) const { return v; }
};

// A many-row GEMM's output before its epilogue (gemmRowsBlas): t holds x.W^T as [rows, wOut] and,
// split, the lo half's product as rows more, loOff floats on. raw(): hi + lo of element (r, o);
// value(): the epilogue's y = R(hi + lo + bias), the bias a zero when BIAS is false (GemmSum: a
// compile-time zero, so a kernel's loads of several elements are not split by the bias's dtype
// switch). The one formula of k_gemm_epilogue and of the kernels that take over a deferred
// epilogue (k_rmsnorm, k_rope_append over a GemmSum), so all give the same bits.
template <bool BIAS>
struct GemmOutT {
  const float* t;
  size_t loOff;
  int wOut, split;
  const void* bias;
  int bdt, bfa;
  struct Raw {
    float hi, lo;
  };
  __device__ __forceinline__ Raw load(int r, int o) const {
    const float* tr = t + (size_t)r * wOut;
    return Raw{tr[o], split ? tr[loOff + o] : 0.f};
  }
  __device__ __forceinline__ float finish(Raw a, int o) const {
    return bfr(a.hi + a.lo + (BIAS && bias ? ldf(bias, bdt, o) : 0.f), bfa);
  }
  __device__ __forceinline__ float raw(int r, int o) const {
    const Raw a = load(r, o);
    return a.hi + a.lo;
  }
  __device__ __forceinline__ float value(int r, int o) const { return finish(load(r, o), o); }
  // The same output read with (B = true) or without (B = false) the bias.
  template <bool B>
  __host__ __device__ GemmOutT<B> as() const {
    return GemmOutT<B>{t, loOff, wOut, split, bias, bdt, bfa};
  }
};
using GemmOut = GemmOutT<true>;
using GemmSum = GemmOutT<false>;

}  // namespace nerva
