// CUDA kernels of every op in the catalogue (packages/core/src/ops.ts) and their launchers.
// Storage: weights bf16 (f32/f16 accepted), activations f32; accumulation is always fp32 (fp64
// where the reference rule is defined in float64: the sampler, rotary angles).
// Per-step values (ids, positions, slots, sequence lengths, RNG counters) are read from device
// buffers, never from kernel arguments, so a captured graph replays with new values.
#include "nerva.h"

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <climits>
#include <cstdlib>

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

constexpr int CUBLAS_OP_N = 0;
constexpr int CUBLAS_OP_T = 1;
constexpr int CUDA_R_32F_ = 0;
constexpr int CUDA_R_16BF_ = 14;
constexpr int CUBLAS_COMPUTE_32F_ = 68;
constexpr int CUBLAS_GEMM_DEFAULT_ = -1;

// ---------------------------------------------------------------- element access

__device__ __forceinline__ float bf2f(uint16_t b) { return __uint_as_float(((uint32_t)b) << 16); }

// Round to nearest even, NaN kept NaN: the same rule as f32ToBf16 in @nerva/core.
__device__ __forceinline__ uint16_t f2bf(float x) {
  uint32_t b = __float_as_uint(x);
  if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu)) return (uint16_t)(((b >> 16) | 0x40) & 0xffff);
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
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
    default: return (float)((const int*)p)[i];
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
// Device timeline (a build with -DNERVA_TRACE only; tools/gpu/trace_timeline.py reads it): thread 0
// of each block of a traced kernel appends {tag, block, entry, wait, exit, grid, mark}
// (%globaltimer ns; mark: NERVA_TRACE_MARK, a kernel's own midpoint) to its SM's ring, so the
// kernels of a replayed graph can be placed on one clock, PDL overlap included.
#ifdef NERVA_TRACE
__device__ unsigned long long* g_tr = nullptr;
__device__ unsigned* g_trCount = nullptr;
__device__ unsigned g_trCap = 0;
__shared__ unsigned long long s_trWait, s_trMark;
__device__ __forceinline__ unsigned long long trNow() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
struct TraceScope {
  unsigned tag;
  unsigned long long t0;
  __device__ explicit TraceScope(unsigned line) : tag(line), t0(0) {
    if (threadIdx.x == 0) {
      t0 = trNow();
      s_trWait = 0;
      s_trMark = 0;
    }
  }
  __device__ ~TraceScope() {
    if (threadIdx.x != 0 || !g_tr) return;
    unsigned sm;
    asm volatile("mov.u32 %0, %smid;" : "=r"(sm));
    const unsigned i = atomicAdd(g_trCount + sm, 1u) % g_trCap;
    unsigned long long* r = g_tr + ((size_t)sm * g_trCap + i) * 6;
    const unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r[0] = ((unsigned long long)tag << 40) | ((unsigned long long)sm << 32) | blk;
    r[1] = t0;
    r[2] = s_trWait;
    r[4] = gridDim.x * gridDim.y * gridDim.z;
    r[5] = s_trMark;
    r[3] = trNow();
  }
};
#define NERVA_TRACE_KERNEL() TraceScope nervaTraceScope_(__LINE__)
// A kernel in an included file: its tag is BASE + its line there, so it cannot take the name of a
// kernels.cu kernel at the same line (trace_timeline.py --src PATH:BASE).
#define NERVA_TRACE_KERNEL_AT(BASE) TraceScope nervaTraceScope_((BASE) + __LINE__)
#define NERVA_TRACE_MARK()                 \
  do {                                     \
    if (threadIdx.x == 0) s_trMark = trNow(); \
  } while (0)
#else
#define NERVA_TRACE_MARK() \
  do {                     \
  } while (0)
#define NERVA_TRACE_KERNEL() \
  do {                       \
  } while (0)
#define NERVA_TRACE_KERNEL_AT(BASE) \
  do {                              \
  } while (0)
#endif

__device__ __forceinline__ void pdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef NERVA_TRACE
  if (threadIdx.x == 0) s_trWait = trNow();
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

__device__ float blockMax(float v, float* sh) {
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
__device__ void blockArgmaxRange(const float* L, int begin, int end, float* shv, int* shi, float& outV, int& outI) {
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

__device__ int blockArgmax(const float* L, int vocab, float* shv, int* shi) {
  float v;
  int idx;
  blockArgmaxRange(L, 0, vocab, shv, shi, v, idx);
  return idx < 0 ? 0 : idx;
}

// ---------------------------------------------------------------- simple ops

__global__ void k_embedding(const void* table, int tdt, const int* ids, float* out, int hidden, int bfa) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  int r = blockIdx.x;
  size_t id = (size_t)ids[r];
  float* o = out + (size_t)r * hidden;
  // A bf16 row in 16-byte loads, all in flight at once: the first kernel of a decode step, on its
  // critical path (element loads took a round trip each per 256).
  if (tdt == NV_BF16 && hidden % 8 == 0 && (((uintptr_t)table | (uintptr_t)out) & 15) == 0) {
    const uint4* src = reinterpret_cast<const uint4*>((const uint16_t*)table + id * hidden);
    for (int j = threadIdx.x; j < hidden / 8; j += blockDim.x) {
      const uint4 t = src[j];
      const uint32_t w[4] = {t.x, t.y, t.z, t.w};
      float v[8];
#pragma unroll
      for (int i = 0; i < 4; i++) {
        v[2 * i] = bfr(__uint_as_float(w[i] << 16), bfa);
        v[2 * i + 1] = bfr(__uint_as_float(w[i] & 0xffff0000u), bfa);
      }
      reinterpret_cast<float4*>(o)[2 * j] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(o)[2 * j + 1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    return;
  }
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = bfr(ldf(table, tdt, id * hidden + i), bfa);
}

// x = hi + lo with both halves bf16 (lo optional): the split of an activation into a bf16
// tensor-core GEMM's operand, which keeps ~16 bits of its mantissa. Every kernel that writes such
// an operand stores it through here, so the bits are the same whichever kernel wrote it.
__device__ __forceinline__ void storeSplit(float v, uint16_t* hi, uint16_t* lo, size_t i) {
  const uint16_t h = f2bf(v);
  hi[i] = h;
  if (lo) lo[i] = f2bf(v - bf2f(h));
}

// hi (and lo): the normalized rows go there as their bf16 split (storeSplit) instead of to `out`,
// the operand of a cuBLAS(Lt) GEMM (gemmRowsBlas): norm and split in one launch.
__global__ void k_rmsnorm(const float* x, const void* w, int wdt, float* out, float* residual, int dim, float eps, int bfa,
                          uint16_t* hi, uint16_t* lo) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  __shared__ float sh[32];
  int r = blockIdx.x;
  const float* xr = x + (size_t)r * dim;
  float* rr = residual ? residual + (size_t)r * dim : nullptr;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    if (rr) {
      v = bfr(v + rr[i], bfa);
      rr[i] = v;
    }
    ss += v * v;
  }
  ss = blockSum(ss, sh);
  float inv = rsqrtf(ss / (float)dim + eps);
  const float* src = rr ? rr : xr;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = bfr(bfr(src[i] * inv, bfa) * ldf(w, wdt, i), bfa);
    if (hi)
      storeSplit(v, hi, lo, (size_t)r * dim + i);
    else
      out[(size_t)r * dim + i] = v;
  }
}

// The NeoX rotation of the pair (a, b) by the float32 angle `ang`. Exact: cos/sin and the
// products in float64. bf16 numerics: cos/sin rounded to bf16 and each product and sum rounded,
// as transformers computes (q * cos) + (rotate_half(q) * sin) on bf16 tensors.
__device__ __forceinline__ void rotateHalf(float a, float b, float ang, int bfa, float& ra, float& rb) {
  double s, c;
  sincos((double)ang, &s, &c);
  if (bfa) {
    float cf = rbf((float)c), sf = rbf((float)s);
    ra = rbf(rbf(__fmul_rn(a, cf)) - rbf(__fmul_rn(b, sf)));
    rb = rbf(rbf(__fmul_rn(b, cf)) + rbf(__fmul_rn(a, sf)));
  } else {
    ra = (float)((double)a * c - (double)b * s);
    rb = (float)((double)b * c + (double)a * s);
  }
}

// One block per (row, head), headDim/2 threads: optional per-head RMSNorm, then NeoX rotation.
// The angle is the float32 product positions[r] * invFreq[i] (as Hugging Face and the CPU
// reference compute it); cos/sin of it are then taken in float64.
__global__ void k_rope(float* x, const int* positions, const float* invFreq, const void* nw, int nwdt, int headDim,
                       int rowStride, int headOffset, float eps, int bfa) {
  PDL_ENTER();
  __shared__ float sh[32];
  int r = blockIdx.x, h = blockIdx.y, i = threadIdx.x, half = headDim / 2;
  bool act = i < half;  // the block is rounded up to whole warps for the shuffles
  float* base = x + (size_t)r * rowStride + headOffset + (size_t)h * headDim;
  float a = act ? base[i] : 0.f, b = act ? base[i + half] : 0.f;
  if (nw) {
    float ss = blockSum(a * a + b * b, sh);
    float inv = rsqrtf(ss / (float)headDim + eps);
    if (act) {
      a = bfr(bfr(a * inv, bfa) * ldf(nw, nwdt, i), bfa);
      b = bfr(bfr(b * inv, bfa) * ldf(nw, nwdt, i + half), bfa);
    }
  }
  if (!act) return;
  float ra, rb;
  rotateHalf(a, b, __fmul_rn((float)positions[r], invFreq[i]), bfa, ra, rb);
  base[i] = ra;
  base[i + half] = rb;
}

// Op rope_append: one block per (row, head) over the q heads then the k heads of a packed qkv
// row; a k-head block also stores its rotated key and the matching value head in the cache.
__global__ void k_rope_append(float* x, const int* positions, const float* invFreq, const void* qn, const void* kn,
                              int ndt, int nq, int headDim, int rowStride, float eps, const int* slots, void* kc, void* vc,
                              int cdt, int nkv, int bfa) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  __shared__ float sh[32];
  int r = blockIdx.x, h = blockIdx.y, i = threadIdx.x, half = headDim / 2;
  bool isK = h >= nq;
  const void* nw = isK ? kn : qn;
  bool act = i < half;
  float* base = x + (size_t)r * rowStride + (size_t)h * headDim;  // k heads follow the q heads
  float a = act ? base[i] : 0.f, b = act ? base[i + half] : 0.f;
  if (nw) {
    float ss = blockSum(a * a + b * b, sh);
    float inv = rsqrtf(ss / (float)headDim + eps);
    if (act) {
      a = bfr(bfr(a * inv, bfa) * ldf(nw, ndt, i), bfa);
      b = bfr(bfr(b * inv, bfa) * ldf(nw, ndt, i + half), bfa);
    }
  }
  if (!act) return;
  float ra, rb;
  rotateHalf(a, b, __fmul_rn((float)positions[r], invFreq[i]), bfa, ra, rb);
  base[i] = ra;
  base[i + half] = rb;
  if (!isK) return;
  int slot = slots[r];
  if (slot < 0) return;
  int kh = h - nq;
  size_t width = (size_t)nkv * headDim, c0 = (size_t)slot * width + (size_t)kh * headDim;
  stf(kc, cdt, c0 + i, ra);
  stf(kc, cdt, c0 + i + half, rb);
  const float* v = base + (size_t)nkv * headDim;  // value head kh sits nkv heads after key head kh
  stf(vc, cdt, c0 + i, v[i]);
  stf(vc, cdt, c0 + i + half, v[i + half]);
}

__global__ void k_kv_append(const float* src, void* kc, void* vc, int cdt, const int* slots, int width, int rowStride,
                            int kOff, int vOff) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  int r = blockIdx.x;
  int slot = slots[r];
  if (slot < 0) return;
  const float* s = src + (size_t)r * rowStride;
  for (int j = threadIdx.x; j < width; j += blockDim.x) {
    stf(kc, cdt, (size_t)slot * width + j, s[kOff + j]);
    stf(vc, cdt, (size_t)slot * width + j, s[vOff + j]);
  }
}

__global__ void k_silu_mul(const float* x, float* out, int rows, int dim, int bfa) {
  PDL_ENTER();
  size_t n = (size_t)rows * dim;
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x) {
    size_t r = t / dim, i = t % dim;
    float g = x[r * 2 * dim + i], u = x[r * 2 * dim + dim + i];
    out[t] = bfr(bfr(g / (1.f + expf(-g)), bfa) * u, bfa);
  }
}

__global__ void k_add(const float* a, const float* b, float* out, size_t n, int bfa) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x)
    out[t] = bfr(a[t] + b[t], bfa);
}

// One row a block; a negative index skips its row. Rows of 16-byte multiples move in 16-byte
// loads, four in flight a thread: x may be mapped host memory (tiered KV pages staged over the
// link), where each load waits a PCIe round trip.
__global__ void k_gather_rows(const char* x, const int* rowIdx, char* out, size_t rowBytes) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  int i = blockIdx.x;
  if (rowIdx[i] < 0) return;
  const char* s = x + (size_t)rowIdx[i] * rowBytes;
  char* d = out + (size_t)i * rowBytes;
  if ((rowBytes & 15) == 0 && ((uintptr_t)s & 15) == 0 && ((uintptr_t)d & 15) == 0) {
    const uint4* s4 = reinterpret_cast<const uint4*>(s);
    uint4* d4 = reinterpret_cast<uint4*>(d);
    const size_t n = rowBytes / 16, step = blockDim.x;
    size_t j = threadIdx.x;
    for (; j + 3 * step < n; j += 4 * step) {
      uint4 a = s4[j], b = s4[j + step], c = s4[j + 2 * step], e = s4[j + 3 * step];
      d4[j] = a;
      d4[j + step] = b;
      d4[j + 2 * step] = c;
      d4[j + 3 * step] = e;
    }
    for (; j < n; j += step) d4[j] = s4[j];
  } else if ((rowBytes & 3) == 0 && ((uintptr_t)s & 3) == 0 && ((uintptr_t)d & 3) == 0) {
    for (size_t j = threadIdx.x; j < rowBytes / 4; j += blockDim.x) ((int*)d)[j] = ((const int*)s)[j];
  } else {
    for (size_t j = threadIdx.x; j < rowBytes; j += blockDim.x) d[j] = s[j];
  }
}

// GEMM epilogue: out += bias (when given), then R (bf16 numerics).
__global__ void k_bias_add(float* out, const void* bias, int bdt, int rows, int outDim, int bfa) {
  PDL_ENTER();
  size_t n = (size_t)rows * outDim;
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x)
    out[t] = bfr(bias ? out[t] + ldf(bias, bdt, t % outDim) : out[t], bfa);
}

// Epilogue of fused_matmul's many-row GEMM (gemmRowsBlas): t holds x.W^T as [rows, wOut] (and,
// split, the lo half's product as rows more), wOut = outDim (2 outDim with glu: gate then up).
// The same formulas as k_gemv_generic: y = R(g + bias); glu: R(R(silu(y)) * R(u)); accumulate.
// nextHi (and nextLo): out's values also as their bf16 split (storeSplit), the next GEMM's operand.
__global__ void k_gemm_epilogue(const float* t, int split, float* out, const void* bias, int bdt, int rows, int outDim,
                                int glu, int accumulate, int bfa, uint16_t* nextHi, uint16_t* nextLo) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  size_t n = (size_t)rows * outDim;
  int wOut = glu ? 2 * outDim : outDim;
  size_t loOff = (size_t)rows * wOut;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / outDim, o = i % outDim;
    const float* tr = t + r * wOut;
    float g = tr[o] + (split ? tr[loOff + o] : 0.f);
    float y = bfr(g + (bias ? ldf(bias, bdt, o) : 0.f), bfa);
    if (glu) {
      float u = tr[outDim + o] + (split ? tr[loOff + outDim + o] : 0.f);
      y = bfr(bfr(y / (1.f + expf(-y)), bfa) * bfr(u, bfa), bfa);
    }
    const float v = accumulate ? bfr(out[i] + y, bfa) : y;
    out[i] = v;
    if (nextHi) storeSplit(v, nextHi, nextLo, i);
  }
}

// x = hi + lo with both halves bf16: the split lets a bf16 tensor-core GEMM keep ~16 bits of
// every activation's mantissa.
__global__ void k_split_bf16(const float* x, uint16_t* hi, uint16_t* lo, size_t n) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x) {
    storeSplit(x[t], hi, lo, t);
  }
}

__global__ void k_argmax(const float* logits, int* out, int vocab) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  __shared__ float shv[32];
  __shared__ int shi[32];
  int r = blockIdx.x;
  int idx = blockArgmax(logits + (size_t)r * vocab, vocab, shv, shi);
  if (threadIdx.x == 0) out[r] = idx;
}

// pre: the cursor is read before the dependency wait. Its only writers are earlier pushes and
// the host (stream-ordered copies, which no kernel overlaps); the launch passes pre when three or
// more kernels were issued since the last push, so that push has completed by the time this
// kernel starts (the kernel before it triggers only after its own wait, and no two consecutive
// kernels trigger at entry). Then the cursor's round trip over PCIe (pinned memory, ~1 us) runs
// while the sampling still finishes, not after it.
__global__ void k_ring_push(const int* src, int* ring, int* cursor, int rows, int capacity, int pre) {
  NERVA_TRACE_KERNEL();
  int cur = pre ? *(volatile int*)cursor : 0;
  PDL_ENTER();
  if (!pre) cur = *(volatile int*)cursor;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    int slot = (int)(((long long)cur + r) % capacity);
    ((volatile int*)ring)[slot] = src[r];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // the tokens are visible to a host peek before the cursor moves
    // (No fence after: nothing in this kernel depends on the cursor reaching the host; a later
    // push reads it after its wait, and the host's reads after a stream or event sync see it.)
    *(volatile int*)cursor = cur + rows;
  }
}

__global__ void k_advance_positions(int* positions, int* slots, const int* bt, const int* rowSeq, int rows, int blockSize,
                                    int mbps) {
  NERVA_TRACE_KERNEL();
  // Only the host (in stream order) and this kernel write what it reads (the step's other kernels
  // only read positions and slots): the next slot is computed before the dependency wait and
  // stored after it, when the step's attention has read the old ones. The next kernel is let in
  // only at exit (no early trigger), so an advance right after this one reads the new positions.
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  int p = 0, sl = 0;
  if (r < rows) {
    p = positions[r] + 1;
    sl = bt[(size_t)rowSeq[r] * mbps + p / blockSize] * blockSize + p % blockSize;
  }
  pdlWait();
  if (r >= rows) return;
  positions[r] = p;
  slots[r] = sl;
}

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
constexpr int GEMV_MAX_THREADS = 512;
__host__ __device__ constexpr int gemvWarps(int ks) { return ks == 1 ? 16 : ks; }
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
  // k_rmsnorm_gemv with the O == 1 block size (see gemvRows).
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
  int o = (blockIdx.x * (NW / KS) + warp / KS) * O;
  int ks = warp % KS;
  // A warp past the last output (KS == 1, last block) still joins the block's barriers; it
  // streams the last row again and writes nothing. With O > 1, outputs of the warp past the
  // last stream the last row and write nothing.
  const bool live = o < outDim;
  const int o0 = o;  // the warp's first output, unclamped (O > 1: output o0 + n is live iff < outDim)
  if (!live) o = outDim - 1;
  const uint4* wr[NO];
#pragma unroll
  for (int n = 0; n < O; n++) {
    const int on = O == 1 ? o : min(o0 + n, outDim - 1);
    wr[n] = reinterpret_cast<const uint4*>(w + (size_t)on * inDim);
    if (GLU) wr[NO - O + n] = reinterpret_cast<const uint4*>(w + (size_t)(on + outDim) * inDim);
  }
  const int n8 = inDim >> 3, n4 = inDim >> 2;
  float acc[NO][R];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int n = 0; n < NO; n++) acc[n][r] = 0.f;

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
    if (NORM && (int)threadIdx.x < n4) nw0 = loadNw4(nw, nwbf, threadIdx.x);
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
    pdlWait();
    pdlTrigger();
    if (NORM) stageNorm();
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
// runs instead of after it (session 24: qkv's release lag 2.1 -> 0.5 us, 1.02x decode). Same
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

// One row (gemvWide): k_gemv_bf16<1, KS>'s split projection with OPB outputs a block and the
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

// ---------------------------------------------------------------- batch-invariant GEMM (decode rows)

// k_gemm_bi: out[r, o] = sum_i x[r, i] * W[o, i] for up to BI_MAX_ROWS f32 rows x and bf16 weights
// W [outDim (2 * outDim with GLU), inDim], on tensor cores (mma.sync m16n8k16, bf16 in, f32
// accumulate), for batch-invariant decode (NervaExec::batchInv, every row count, 1 included;
// the default, NERVA_BI_GEMM=0 opts out, see biGemmEnabled).
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

// ---------------------------------------------------------------- attention

#include "attn_prefill.cuh"

// Split-KV paged attention, one block per (split, head, row), W warps; each warp takes every
// W-th key of the split with an online softmax, then the warps merge. Writes (m, l, acc[hd]).
// 8 warps: a 32-key split is one batch of ATT_KB keys per warp, one memory round trip (4 warps
// took two; the 0.6B shape decoded ~4 % faster with 8).
constexpr int ATT_WARPS = 8;
constexpr int ATT_MAX_EPL = 8;  // headDim <= 256
constexpr int ATT_KB = 4;       // keys each warp has in flight

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
__device__ void attnMergeWide(const float* base, size_t stride, float* out, int r, int h, int H, int nAct, float* lse,
                              uint16_t* outHi, size_t loOff) {
  constexpr int hd = 128;
  __shared__ float sW[ATT_WIDE_MAX], sRed[32], sA[hd];
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

// The block that arrives last of the nAct live splits of its (row, head) merges their partials
// into out and re-arms the counter: the combine needs no kernel (node) of its own. Splits past
// the live length do not arrive at all (every block derives the same nAct from positions[r]),
// so a short context pays no fence or atomic for the idle splits of the grid.
// outHi (a many-row GEMM's operand hand-off, see SplitHandoff): the merged values also as their
// bf16 split (storeSplit), the lo halves loOff elements on (loOff 0: none).
// (Measured without gain on the 0.6B shape, session 17: sixteen splits a load round; the fences
// of thread 0 alone around the counter. Session 18: merging in thread block clusters over
// distributed shared memory, and the last split polling for the others; see docs/results.)
__device__ void attnArrive(const float* part, float* out, int* counters, int rl, int r, int h, int H, int hd, int S,
                           int nAct, float* lse, uint16_t* outHi = nullptr, size_t loOff = 0) {
  NERVA_TRACE_MARK();  // the split's partial is written
  __shared__ int lastFlag;
  int* c = counters + (size_t)rl * H + h;
  __threadfence();  // this block's partial is visible before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    int old = atomicAdd(c, 1);
    lastFlag = old == nAct - 1;
    if (lastFlag) *c = 0;
  }
  __syncthreads();
  if (!lastFlag) return;
  __threadfence();
  // Each thread merges its output columns on its own: (m, l, acc) of eight splits are loaded
  // at once and folded in with an online rescale, so the merge is one L2 round trip per eight
  // splits with no block reductions between the loads. (Loading every (m, l) first, reducing M
  // and L across the block, then the accumulators cost two round trips and four barriers.)
  const size_t stride = (size_t)hd + 2;
  const float* base = part + ((size_t)rl * H + h) * S * stride;
  if (hd == 128 && blockDim.x >= 128 && nAct >= ATT_WIDE_MIN && nAct <= ATT_WIDE_MAX) {
    attnMergeWide(base, stride, out, r, h, H, nAct, lse, outHi, loOff);
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

#include "attn_decode_gqa.cuh"

// What attention takes over from rope_append when it is fused in (ROPE): q/k norms, the rotary
// angles and the slots the new key and value are appended at.
struct RopeFuse {
  const float* invFreq = nullptr;
  const void* qn = nullptr;
  const void* kn = nullptr;
  int ndt = 0;
  const int* slots = nullptr;
  float eps = 0.f;
};

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
#define ATT_PARTIAL_PARAMS                                                                                  \
  const float* q, const KT* kc, const KT* vc, const int* bt, const int* rowSeq, const int* positions,   \
      float* part, int H, int KVH, int hd, int bs, int mbps, int qStride, int qOff, float scale, int minChunk, int S, \
      int rowBase, float* out, int* counters, int decodeOnly, RopeFuse rf, int window, float* lse, int flashRows
#define ATT_PARTIAL_ARGS                                                                                    \
  q, kc, vc, bt, rowSeq, positions, part, H, KVH, hd, bs, mbps, qStride, qOff, scale, minChunk, S, rowBase, out, \
      counters, decodeOnly, rf, window, lse, flashRows
template <typename KT, int W, int EPL, bool ROPE, bool PAIR>
__device__ __forceinline__ void attnPartial(ATT_PARTIAL_PARAMS) {
  // decodeOnly (op decoder_layers: every row its own sequence): the keys before a row's own
  // position were written by earlier steps, so the first batch of them streams in before the
  // dependency wait, overlapping the kernel before (rope_append, which writes q and the new key).
  // ROPE (decodeOnly, headDim 128): rope_append's work is done here instead. Each block rotates
  // its own q head; the warp that owns the row's new key (the last split) normalizes and rotates
  // it from the qkv rows, uses it from registers, and the first q head of each KV head's group
  // appends key and value to the cache. The angles' cos/sin only need the position, so they are
  // taken before the wait as well.
  if (!decodeOnly) PDL_ENTER();
  // Rows of tiles that k_attn_prefill took (flashRows: the row count it saw; 0 when it did not run).
  if (flashRows && attnTileUniform(rowSeq, flashRows, (rowBase + (int)blockIdx.z) / PF_ROWS)) return;
  __shared__ float shm[W], shl[W];
  __shared__ float sha[W][EPL * 32];
  const int h = blockIdx.y, rl = blockIdx.z, r = rowBase + rl;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int epl = (hd + 31) >> 5;
  const int last = positions[r];
  // ROPE: the angles' cos/sin are taken once per block, on its first live split.
  bool cosDone = false, waited = false;
  // S splits of the keys; a block takes splits blockIdx.x, + gridDim.x, ... in turn (gridDim.x <
  // S under batch-invariant decode: the split of a row's keys, and so its numerics, is the one
  // of a single-row call, while a many-row call launches fewer blocks per row).
  for (int s = blockIdx.x; s < S; s += gridDim.x) {
  if (s != (int)blockIdx.x) __syncthreads();  // the shared arrays of the split before are free
  float* dst = part + (((size_t)rl * H + h) * S + s) * (hd + 2);
  // A sliding window (window > 0) starts the keys at last - window + 1.
  int lo = window > 0 ? max(0, last - window + 1) : 0;
  // Splits are sized from the live length (read here, so a replayed graph adapts every step):
  // a short context uses few splits of at least minChunk keys, the rest exit at once.
  int chunk = max(minChunk, (last - lo + S) / S);
  int nAct = (last - lo) / chunk + 1;
  int start = lo + s * chunk;
  if (start > last) {
    if (!counters && threadIdx.x == 0) {
      dst[0] = -INFINITY;
      dst[1] = 0.f;
    }
    continue;
  }
  int end = min(start + chunk - 1, last);
  int kvh = h / (H / KVH);
  int seq = rowSeq[r];
  const float* qr = q + (size_t)r * qStride + qOff + (size_t)h * hd;
  float qv[EPL], acc[EPL];
  float m = -INFINITY, l = 0.f;
  const size_t width = (size_t)KVH * hd;
  const int* btr = bt + (size_t)seq * mbps;
  // ATT_KB keys per warp at a time: their block-table entries, then their key and value rows,
  // are loaded together, so a split pays the memory latency once per ATT_KB keys instead of
  // twice per key; the online softmax then folds the batch in with one rescale.
  long long slot[ATT_KB];  // -1: past the end of the split
#pragma unroll
  for (int b = 0; b < ATT_KB; b++) slot[b] = -1;
  float kv[ATT_KB][EPL], vv[ATT_KB][EPL];
  float kNew[EPL], vNew[EPL];  // ROPE: the new key and value (owner warp)
  long long pOf[ATT_KB] = {-1, -1, -1, -1};  // ATT_KB entries
  // bf16 caches with PAIR: a pair stays one packed 32-bit word in kv[b][j] (j even) from its load
  // until widen() just before use. Unpacking at the load made every thread wait for its first
  // keys before its dependency wait, which then released up to ~1 us late (session 21: bf16 KV
  // decoded slower than f32).
  constexpr bool PACKED = PAIR && std::is_same<KT, uint16_t>::value;
  auto widen = [&]() {
    if constexpr (PACKED) {
#pragma unroll
      for (int b = 0; b < ATT_KB; b++)
#pragma unroll
        for (int j = 0; j < EPL; j += 2) {
          const uint32_t kw = __float_as_uint(kv[b][j]), vw = __float_as_uint(vv[b][j]);
          kv[b][j] = __uint_as_float(kw << 16);
          kv[b][j + 1] = __uint_as_float(kw & 0xffff0000u);
          vv[b][j] = __uint_as_float(vw << 16);
          vv[b][j + 1] = __uint_as_float(vw & 0xffff0000u);
        }
    }
  };
  auto loadKey = [&](int b) {
    if (ROPE && pOf[b] == last) {
      // The new key and value from registers, rounded as the cache stores them, so a row sees the
      // same key whether it reads it back or not.
      if constexpr (PACKED) {
#pragma unroll
        for (int j = 0; j < EPL; j += 2) {
          kv[b][j] = __uint_as_float((uint32_t)f2bf(kNew[j]) | ((uint32_t)f2bf(kNew[j + 1]) << 16));
          vv[b][j] = __uint_as_float((uint32_t)f2bf(vNew[j]) | ((uint32_t)f2bf(vNew[j + 1]) << 16));
        }
      } else {
#pragma unroll
        for (int j = 0; j < EPL; j++) {
          kv[b][j] = asStored(kc, kNew[j]);
          vv[b][j] = asStored(kc, vNew[j]);
        }
      }
      return;
    }
    const KT* kr = kc + (size_t)max(slot[b], 0ll) * width + (size_t)kvh * hd;
    const KT* vr = vc + (size_t)max(slot[b], 0ll) * width + (size_t)kvh * hd;
    if constexpr (PACKED) {
#pragma unroll
      for (int j = 0; j < EPL; j += 2) {
        const bool in = slot[b] >= 0 && j < epl;
        const int e = attnElem<true>(j, lane);
        uint32_t kw = 0u, vw = 0u;
        if (in) {
          kw = *(const uint32_t*)(kr + e);
          vw = *(const uint32_t*)(vr + e);
        }
        kv[b][j] = __uint_as_float(kw);
        vv[b][j] = __uint_as_float(vw);
      }
    } else if constexpr (PAIR) {
#pragma unroll
      for (int j = 0; j < EPL; j += 2) {
        bool in = slot[b] >= 0 && j < epl;
        int e = attnElem<true>(j, lane);
        ldk2(kr + e, in, kv[b][j], kv[b][j + 1]);
        ldk2(vr + e, in, vv[b][j], vv[b][j + 1]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < EPL; j++) {
        bool in = slot[b] >= 0 && j < epl && j * 32 + lane < hd;
        kv[b][j] = in ? ldk<KT>(kr, j * 32 + lane) : 0.f;
        vv[b][j] = in ? ldk<KT>(vr, j * 32 + lane) : 0.f;
      }
    }
  };
  auto loadBatch = [&](int p0, bool skipOwn) {
#pragma unroll
    for (int b = 0; b < ATT_KB; b++) {
      int p = p0 + b * W;
      pOf[b] = p;
      // A negative entry: the block lives in another cache (partial attention); skipped.
      int e = p <= end ? btr[p / bs] : -1;
      slot[b] = e >= 0 ? (long long)e * bs + p % bs : -1;
    }
#pragma unroll
    for (int b = 0; b < ATT_KB; b++)
      if (!skipOwn || p0 + b * W != last) loadKey(b);
  };
  int p0 = start + warp;
  // ROPE: the warp that owns key `last` (it lies in the last split, which always exists).
  const bool owner = ROPE && last <= end && (last - start) % W == warp;
  // ROPE: the 64 angles' cos/sin, one per thread into shared memory, before anything else is
  // live (float64 sincos needs many registers; a per-lane copy cost the kernel ~30 more).
  __shared__ double shcs[ROPE ? 64 : 1][2];
  if (ROPE && !cosDone) {
    cosDone = true;
    if (threadIdx.x < 64)
      sincos((double)__fmul_rn((float)last, rf.invFreq[threadIdx.x]), &shcs[threadIdx.x][1], &shcs[threadIdx.x][0]);
    __syncthreads();
  }
  if (decodeOnly) {
    if (p0 <= end) loadBatch(p0, true);
    if (!waited) {
      waited = true;
      pdlWait();
      // (Triggering only once the split's partial is written, so o's and gate_up's weight streams
      // overlap the merge rather than the splits' loads, was slower: session 18.)
      pdlTrigger();
    }
    if (ROPE) {
      float a[4];
#pragma unroll
      for (int j = 0; j < 4; j++) a[j] = qr[attnElem<PAIR>(j, lane)];
      float kr4[4], vr4[4];
      if (owner) {
        const float* krow = q + (size_t)r * qStride + qOff + (size_t)(H + kvh) * hd;
        const float* vrow = krow + (size_t)KVH * hd;
#pragma unroll
        for (int j = 0; j < 4; j++) {
          kr4[j] = krow[attnElem<PAIR>(j, lane)];
          vr4[j] = vrow[attnElem<PAIR>(j, lane)];
        }
      }
      ropeHeadWarp<PAIR>(a, rf.qn, rf.ndt, rf.eps, shcs, lane);
#pragma unroll
      for (int j = 0; j < EPL; j++) {
        qv[j] = j < 4 ? a[j] * scale : 0.f;
        acc[j] = 0.f;
        kNew[j] = 0.f;
        vNew[j] = 0.f;
      }
      if (owner) {
        ropeHeadWarp<PAIR>(kr4, rf.kn, rf.ndt, rf.eps, shcs, lane);
#pragma unroll
        for (int j = 0; j < 4; j++) {
          kNew[j] = kr4[j];
          vNew[j] = vr4[j];
        }
        int sl = rf.slots[r];
        if (sl >= 0 && h % (H / KVH) == 0) {
          KT* kd = const_cast<KT*>(kc) + (size_t)sl * width + (size_t)kvh * hd;
          KT* vd = const_cast<KT*>(vc) + (size_t)sl * width + (size_t)kvh * hd;
#pragma unroll
          for (int j = 0; j < 4; j++) {
            stk(kd, attnElem<PAIR>(j, lane), kNew[j]);
            stk(vd, attnElem<PAIR>(j, lane), vNew[j]);
          }
        }
      }
    }
#pragma unroll
    for (int b = 0; b < ATT_KB; b++)
      if (p0 <= end && p0 + b * W == last) loadKey(b);  // ROPE: from registers; else written by rope_append
  }
  if (!ROPE) {
#pragma unroll
    for (int j = 0; j < EPL; j++) {
      const int e = attnElem<PAIR>(j, lane);
      qv[j] = (j < epl && e < hd) ? qr[e] * scale : 0.f;
      acc[j] = 0.f;
    }
  }
  for (bool first = true; p0 <= end; p0 += W * ATT_KB, first = false) {
    if (!(first && decodeOnly)) loadBatch(p0, false);
    widen();
    float d[ATT_KB];
#pragma unroll
    for (int b = 0; b < ATT_KB; b++) {
      d[b] = 0.f;
#pragma unroll
      for (int j = 0; j < EPL; j++) d[b] += qv[j] * kv[b][j];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int b = 0; b < ATT_KB; b++) d[b] += __shfl_xor_sync(0xffffffffu, d[b], o);
    float mn = m;
#pragma unroll
    for (int b = 0; b < ATT_KB; b++)
      if (slot[b] >= 0) mn = fmaxf(mn, d[b]);
    if (mn == -INFINITY) continue;  // every key of the batch is in another cache
    float corr = expf(m - mn);
    l *= corr;
#pragma unroll
    for (int j = 0; j < EPL; j++) acc[j] *= corr;
#pragma unroll
    for (int b = 0; b < ATT_KB; b++) {
      if (slot[b] < 0) continue;
      float e = expf(d[b] - mn);
      l += e;
#pragma unroll
      for (int j = 0; j < EPL; j++) acc[j] += e * vv[b][j];
    }
    m = mn;
  }
  if (lane == 0) {
    shm[warp] = m;
    shl[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < EPL; j++)
    if (j < epl && attnElem<PAIR>(j, lane) < hd) sha[warp][attnElem<PAIR>(j, lane)] = acc[j];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < W; w++) M = fmaxf(M, shm[w]);
  for (int t = threadIdx.x; t < hd; t += blockDim.x) {
    float a = 0.f;
    for (int w = 0; w < W; w++)
      if (shl[w] > 0.f) a += sha[w][t] * expf(shm[w] - M);
    dst[2 + t] = a;
  }
  if (threadIdx.x == 0) {
    float L = 0.f;
    for (int w = 0; w < W; w++)
      if (shl[w] > 0.f) L += shl[w] * expf(shm[w] - M);
    dst[0] = M;
    dst[1] = L;
  }
  if (counters) {
    attnArrive(part, out, counters, rl, r, h, H, hd, S, nAct, lse);
  }
  }
}

template <typename KT, int W, int EPL, bool ROPE, bool PAIR>
__global__ void __launch_bounds__(32 * W) k_attn_partial(ATT_PARTIAL_PARAMS) {
  NERVA_TRACE_KERNEL();
  attnPartial<KT, W, EPL, ROPE, PAIR>(ATT_PARTIAL_ARGS);
}

// The decode kernel (rope fused, headDim 128) held to 112 registers a thread: at two blocks an SM
// that leaves room for a block of the o projection, which the attention launches early and which
// streams its weights meanwhile (at 121, the register count with attnMergeWide inlined, it did not
// fit and the 0.6B decoded about 0.7 % slower).
template <typename KT, int W, bool PAIR>
__global__ void __maxnreg__(112) k_attn_partial_rope(ATT_PARTIAL_PARAMS) {
  NERVA_TRACE_KERNEL();
  attnPartial<KT, W, 4, true, PAIR>(ATT_PARTIAL_ARGS);
}
#undef ATT_PARTIAL_PARAMS
#undef ATT_PARTIAL_ARGS

#include "attn_decode_short.cuh"

// Exact merge of the split partials (online-softmax combine), one block per (head, row).
__global__ void k_attn_combine(const float* part, float* out, int H, int hd, int S, int rowBase, float* lse, const int* rowSeq,
                               int flashRows) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  int h = blockIdx.x, rl = blockIdx.y, r = rowBase + rl;
  if (flashRows && attnTileUniform(rowSeq, flashRows, r / PF_ROWS)) return;
  const float* base = part + ((size_t)rl * H + h) * S * (hd + 2);
  float M = -INFINITY;
  for (int s = 0; s < S; s++) M = fmaxf(M, base[(size_t)s * (hd + 2)]);
  float L = 0.f;
  for (int s = 0; s < S; s++) {
    const float* ps = base + (size_t)s * (hd + 2);
    if (ps[1] > 0.f) L += ps[1] * expf(ps[0] - M);
  }
  for (int t = threadIdx.x; t < hd; t += blockDim.x) {
    float a = 0.f;
    for (int s = 0; s < S; s++) {
      const float* ps = base + (size_t)s * (hd + 2);
      if (ps[1] > 0.f) a += ps[2 + t] * expf(ps[0] - M);
    }
    out[(size_t)r * H * hd + (size_t)h * hd + t] = L > 0.f ? a / L : 0.f;
  }
  if (lse && threadIdx.x == 0) lse[(size_t)r * H + h] = L > 0.f ? M + logf(L) : -INFINITY;
}

// Partial attentions over disjoint key sets combined in place (op attention_merge): the
// online-softmax rule on (out, lse) and (other, otherLse). One block per (head, row).
__global__ void k_attn_merge(float* out, float* lse, const float* other, const float* otherLse, int H, int hd) {
  PDL_ENTER();
  int h = blockIdx.x, r = blockIdx.y;
  size_t li = (size_t)r * H + h;
  float la = lse[li], lb = otherLse[li];
  float M = fmaxf(la, lb);
  float wa = M == -INFINITY ? 0.f : expf(la - M), wb = M == -INFINITY ? 0.f : expf(lb - M);
  float den = wa + wb;
  float* o = out + li * hd;
  const float* b = other + li * hd;
  for (int t = threadIdx.x; t < hd; t += blockDim.x) o[t] = den > 0.f ? (o[t] * wa + b[t] * wb) / den : 0.f;
  __syncthreads();  // every thread has read lse[li] before it changes
  if (threadIdx.x == 0) lse[li] = den > 0.f ? M + logf(den) : -INFINITY;
}

// bf16 numerics: attention as transformers' eager path computes it on bf16 tensors. The score
// matmul and the scaled score are rounded, the softmax is float32, the probabilities are
// rounded before they weight the values, and the output is rounded. A probability needs the
// row's final max and sum, so one block per (head, row) makes two passes over the keys: the max
// and sum of exponentials (online within each warp), then each score again to weight the values.
// Each warp has EAGER_KB keys (and values) in flight, so a pass pays one memory round trip per
// EAGER_WARPS * EAGER_KB keys.
constexpr int EAGER_WARPS = 16;
constexpr int EAGER_KB = 4;
template <typename KT>
__global__ void __launch_bounds__(32 * EAGER_WARPS) k_attn_eager(const float* q, const KT* kc, const KT* vc, const int* bt,
                                                                 const int* rowSeq, const int* positions, float* out,
                                                                 int H, int KVH, int hd, int bs, int mbps, int qStride,
                                                                 int qOff, float scale, int rowBase, int window) {
  PDL_ENTER();
  __shared__ float wm[EAGER_WARPS], wl[EAGER_WARPS];
  __shared__ float part[EAGER_WARPS][32 * ATT_MAX_EPL];
  int h = blockIdx.x, r = rowBase + blockIdx.y;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = positions[r] + 1;
  int lo = window > 0 ? max(0, n - window) : 0;  // a sliding window's first key
  const int* tb = bt + (size_t)rowSeq[r] * mbps;
  size_t width = (size_t)KVH * hd, head = (size_t)(h / (H / KVH)) * hd;
  const float* qr = q + (size_t)r * qStride + qOff + (size_t)h * hd;
  float qv[ATT_MAX_EPL];
#pragma unroll
  for (int e = 0; e < ATT_MAX_EPL; e++) qv[e] = lane + 32 * e < hd ? qr[lane + 32 * e] : 0.f;
  constexpr int STEP = EAGER_WARPS * EAGER_KB;
  // Keys p0 + b * EAGER_WARPS (b < EAGER_KB): their rows, and the rounded scaled scores.
  auto scores = [&](int p0, size_t* base, bool* ok, float* sc, float (*vv)[ATT_MAX_EPL]) {
    float kv[EAGER_KB][ATT_MAX_EPL];
#pragma unroll
    for (int b = 0; b < EAGER_KB; b++) {
      int p = p0 + b * EAGER_WARPS;
      ok[b] = p < n;
      base[b] = ok[b] ? ((size_t)tb[p / bs] * bs + p % bs) * width + head : 0;
#pragma unroll
      for (int e = 0; e < ATT_MAX_EPL; e++) {
        bool in = ok[b] && lane + 32 * e < hd;
        kv[b][e] = in ? ldk<KT>(kc, base[b] + lane + 32 * e) : 0.f;
        if (vv) vv[b][e] = in ? ldk<KT>(vc, base[b] + lane + 32 * e) : 0.f;
      }
    }
#pragma unroll
    for (int b = 0; b < EAGER_KB; b++) {
      float d = 0.f;
#pragma unroll
      for (int e = 0; e < ATT_MAX_EPL; e++) d += qv[e] * kv[b][e];
      sc[b] = d;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int b = 0; b < EAGER_KB; b++) sc[b] += __shfl_xor_sync(0xffffffffu, sc[b], o);
#pragma unroll
    for (int b = 0; b < EAGER_KB; b++) sc[b] = rbf(rbf(sc[b]) * scale);
  };
  float m = -INFINITY, l = 0.f;
  for (int p0 = lo + warp; p0 < n; p0 += STEP) {
    size_t base[EAGER_KB];
    bool ok[EAGER_KB];
    float sc[EAGER_KB];
    scores(p0, base, ok, sc, nullptr);
#pragma unroll
    for (int b = 0; b < EAGER_KB; b++) {
      if (!ok[b]) continue;
      if (sc[b] > m) {
        l = l * expf(m - sc[b]) + 1.f;
        m = sc[b];
      } else {
        l += expf(sc[b] - m);
      }
    }
  }
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
  __syncthreads();
  float M = -INFINITY, L = 0.f;
  for (int w = 0; w < EAGER_WARPS; w++) M = fmaxf(M, wm[w]);
  for (int w = 0; w < EAGER_WARPS; w++)
    if (wl[w] > 0.f) L += wl[w] * expf(wm[w] - M);
  float a[ATT_MAX_EPL];
#pragma unroll
  for (int e = 0; e < ATT_MAX_EPL; e++) a[e] = 0.f;
  for (int p0 = lo + warp; p0 < n; p0 += STEP) {
    size_t base[EAGER_KB];
    bool ok[EAGER_KB];
    float sc[EAGER_KB], vv[EAGER_KB][ATT_MAX_EPL];
    scores(p0, base, ok, sc, vv);
#pragma unroll
    for (int b = 0; b < EAGER_KB; b++) {
      float pr = ok[b] ? rbf(expf(sc[b] - M) / L) : 0.f;
#pragma unroll
      for (int e = 0; e < ATT_MAX_EPL; e++) a[e] += pr * vv[b][e];
    }
  }
#pragma unroll
  for (int e = 0; e < ATT_MAX_EPL; e++)
    if (lane + 32 * e < hd) part[warp][lane + 32 * e] = a[e];
  __syncthreads();
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float t = 0.f;
    for (int w = 0; w < EAGER_WARPS; w++) t += part[w][i];
    out[(size_t)r * H * hd + (size_t)h * hd + i] = rbf(t);
  }
}

// ---------------------------------------------------------------- MoE

// One warp per row: float32 softmax over experts, top-k by repeated argmax (ties: lower index).
__global__ void k_moe_route(const float* logits, int* topIds, float* topW, int rows, int E, int K, int normalize, int bfa) {
  PDL_ENTER();
  extern __shared__ float smem[];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int r = blockIdx.x * (blockDim.x >> 5) + warp;
  if (r >= rows) return;
  float* p = smem + (size_t)warp * E;
  const float* L = logits + (size_t)r * E;
  float mx = -INFINITY;
  for (int i = lane; i < E; i += 32) mx = fmaxf(mx, L[i]);
  mx = warpMax(mx);
  float sum = 0.f;
  for (int i = lane; i < E; i += 32) {
    float e = expf(L[i] - mx);
    p[i] = e;
    sum += e;
  }
  sum = warpSum(sum);
  for (int i = lane; i < E; i += 32) p[i] /= sum;
  __syncwarp();
  float tot = 0.f;
  for (int k = 0; k < K; k++) {
    float bv = -INFINITY;
    int bi = -1;
    for (int i = lane; i < E; i += 32)
      if (p[i] >= 0.f && (bi < 0 || p[i] > bv)) {
        bv = p[i];
        bi = i;
      }
    warpArgmax(bv, bi);
    if (lane == 0) {
      topIds[(size_t)r * K + k] = bi;
      topW[(size_t)r * K + k] = bv;
      p[bi] = -1.f;  // taken
    }
    tot += bv;
    __syncwarp();
  }
  __syncwarp();
  if (lane < K) {
    float w = topW[(size_t)r * K + lane];
    topW[(size_t)r * K + lane] = bfr(normalize ? w / tot : w, bfa);
  }
}

// h[(r,k), j] = silu(gate_e[j] . x[r]) * (up_e[j] . x[r]); one warp per j.
__global__ void k_moe_gate_up(const float* x, const int* topIds, const void* gateUp, int wdt, float* h, int hidden,
                              int inter, int K, int rowBase, int bfa) {
  PDL_ENTER();
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int j = blockIdx.x * 4 + warp;
  int rk = blockIdx.y;  // local (row, k)
  if (j >= inter) return;
  int r = rowBase + rk / K, k = rk % K;
  size_t e = (size_t)topIds[(size_t)r * K + k];
  const float* xr = x + (size_t)r * hidden;
  size_t g0 = (e * 2 * inter + j) * hidden, u0 = (e * 2 * inter + inter + j) * hidden;
  float g = 0.f, u = 0.f;
  for (int i = lane; i < hidden; i += 32) {
    float xv = xr[i];
    g += xv * ldf(gateUp, wdt, g0 + i);
    u += xv * ldf(gateUp, wdt, u0 + i);
  }
  g = warpSum(g);
  u = warpSum(u);
  if (lane == 0) {
    g = bfr(g, bfa);
    h[(size_t)rk * inter + j] = bfr(bfr(g / (1.f + expf(-g)), bfa) * bfr(u, bfa), bfa);
  }
}

// out[r, o] = sum_k w[r,k] * down_e[o] . h[(r,k)]; one warp per o.
__global__ void k_moe_down(const float* h, const int* topIds, const float* topW, const void* down, int wdt, float* out,
                           int hidden, int inter, int K, int rowBase, int bfa) {
  PDL_ENTER();
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int o = blockIdx.x * 4 + warp;
  int rl = blockIdx.y, r = rowBase + rl;
  if (o >= hidden) return;
  const int* ids = topIds + (size_t)r * K;
  auto expertDot = [&](int k) {
    size_t e = (size_t)ids[k];
    const float* hr = h + ((size_t)rl * K + k) * inter;
    size_t d0 = (e * hidden + o) * inter;
    float a = 0.f;
    for (int i = lane; i < inter; i += 32) a += hr[i] * ldf(down, wdt, d0 + i);
    return warpSum(a);
  };
  float tot = 0.f;
  if (!bfa) {
    for (int k = 0; k < K; k++) tot += topW[(size_t)r * K + k] * expertDot(k);
  } else {
    // transformers adds each expert's weighted output into a bf16 sum, in ascending expert id.
    int last = -1;
    for (int t = 0; t < K; t++) {
      int kb = -1;
      for (int k = 0; k < K; k++)
        if (ids[k] > last && (kb < 0 || ids[k] < ids[kb])) kb = k;
      if (kb < 0) break;
      last = ids[kb];
      tot = rbf(tot + rbf(rbf(expertDot(kb)) * topW[(size_t)r * K + kb]));
    }
  }
  if (lane == 0) out[(size_t)r * hidden + o] = tot;
}

// ---------------------------------------------------------------- sampling

__device__ __forceinline__ uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// uniformFromSeed of @nerva/core/sampling.ts, bit for bit.
__device__ __forceinline__ double uniformFromSeed(uint32_t seed, uint32_t counter) {
  uint32_t h = mix32(seed ^ mix32(counter + 0x9e3779b9u));
  return (double)(h >> 8) / 16777216.0;
}

// The sampler's candidate order is (prob descending, index ascending). With prob >= 0 the
// float64 bit pattern orders like the value, so the composite key (probBits, ~index) orders
// candidates exactly; selections walk it one byte at a time (a radix select with masses).
struct SelResult {
  int index;           // the element found (-1: none)
  int countBefore;     // candidates before it in the order
  double massBefore;   // their probability mass
  double p;            // its own probability
};

constexpr int SAMPLE_MAX_CLUSTER = 16;

struct SampleShared {
  int cnt[256];
  double mass[256];
  int any[256];
  uint64_t hiMask, hiVal;
  uint32_t loMask, loVal;
  int countBefore;
  double massBefore;
  int done, found, chosenIdx;
  double red[32];
  int redi[32];
  float redf[32];
};

// mode 0: the element at rank `rank`; mode 1: first element with massBefore + p >= thr;
// mode 2: first element with massBefore + p > thr.
__device__ SelResult selectKey(const double* prob, int vocab, int mode, int rank, double thr, SampleShared& S) {
  if (threadIdx.x == 0) {
    S.hiMask = 0;
    S.hiVal = 0;
    S.loMask = 0;
    S.loVal = 0;
    S.countBefore = 0;
    S.massBefore = 0;
    S.done = 0;
    S.found = 1;
    S.chosenIdx = -1;
  }
  __syncthreads();
  for (int digit = 11; digit >= 0; digit--) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      S.cnt[b] = 0;
      S.mass[b] = 0;
      S.any[b] = -1;
    }
    __syncthreads();
    uint64_t hm = S.hiMask, hv = S.hiVal;
    uint32_t lm = S.loMask, lv = S.loVal;
    // Runs of equal buckets are accumulated in registers before one shared atomic: early digits
    // (sign/exponent bytes) put nearly every candidate in the same bucket.
    int runB = -1, runC = 0, runI = -1;
    double runM = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      double p = prob[i];
      uint64_t hi = (uint64_t)__double_as_longlong(p);
      uint32_t lo = ~(uint32_t)i;
      if ((hi & hm) != hv || (lo & lm) != lv) continue;
      int b = digit >= 4 ? (int)((hi >> ((digit - 4) * 8)) & 0xff) : (int)((lo >> (digit * 8)) & 0xff);
      if (b != runB) {
        if (runB >= 0) {
          atomicAdd(&S.cnt[runB], runC);
          atomicAdd(&S.mass[runB], runM);
          S.any[runB] = runI;
        }
        runB = b;
        runC = 0;
        runM = 0;
      }
      runC++;
      runM += p;
      runI = i;
    }
    if (runB >= 0) {
      atomicAdd(&S.cnt[runB], runC);
      atomicAdd(&S.mass[runB], runM);
      S.any[runB] = runI;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = -1;
      for (int b = 255; b >= 0; b--) {
        if (S.cnt[b] == 0) continue;
        bool hit = mode == 0   ? S.countBefore + S.cnt[b] > rank
                   : mode == 1 ? S.massBefore + S.mass[b] >= thr
                               : S.massBefore + S.mass[b] > thr;
        if (hit) {
          chosen = b;
          break;
        }
        S.countBefore += S.cnt[b];
        S.massBefore += S.mass[b];
      }
      if (chosen < 0) {
        S.found = 0;
        S.done = 1;
      } else {
        if (digit >= 4) {
          int sh = (digit - 4) * 8;
          S.hiMask |= (uint64_t)0xff << sh;
          S.hiVal |= (uint64_t)chosen << sh;
        } else {
          int sh = digit * 8;
          S.loMask |= 0xffu << sh;
          S.loVal |= (uint32_t)chosen << sh;
        }
        if (S.cnt[chosen] == 1 || digit == 0) {
          S.chosenIdx = S.any[chosen];
          S.done = 1;
        }
      }
    }
    __syncthreads();
    if (S.done) break;
  }
  SelResult res;
  res.index = S.found ? S.chosenIdx : -1;
  res.countBefore = S.countBefore;
  res.massBefore = S.massBefore;
  res.p = res.index >= 0 ? prob[res.index] : 0.0;
  __syncthreads();
  return res;
}

// A sampled row (temperature > 0) by one block: softmax in float64 into `prob`, then top-k,
// top-p and min-p by radix selection, and the draw from the counter-based uniform.
__device__ __forceinline__ int sampleRow(const float* L, double* prob, int vocab, float temp, float topK, float topP, float minP,
                         uint32_t seed, uint32_t counter, SampleShared& S) {
  double u = uniformFromSeed(seed, counter);
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, L[i]);
  mx = blockMax(mx, S.redf);
  double t = (double)temp, sum = 0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    double e = exp(((double)L[i] - (double)mx) / t);
    prob[i] = e;
    sum += e;
  }
  sum = blockSum(sum, S.red);
  double pmax = 0, total = 0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    double p = prob[i] / sum;
    prob[i] = p;
    pmax = fmax(pmax, p);
    total += p;
  }
  total = blockSum(total, S.red);
  // block max of a double via the sum buffer
  {
    double v = pmax;
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) S.red[threadIdx.x >> 5] = v;
    __syncthreads();
    pmax = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) pmax = fmax(pmax, S.red[w]);
    __syncthreads();
  }
  long long n = vocab;
  if (topK > 0.f && (double)topK < (double)n) n = (long long)ceil((double)topK);
  if (topP < 1.f) {
    SelResult sp = selectKey(prob, vocab, 1, 0, (double)topP, S);
    long long k = sp.index >= 0 ? (long long)sp.countBefore + 1 : (long long)vocab;
    if (k > n) k = n;
    n = k < 1 ? 1 : k;
  }
  if (minP > 0.f) {
    double floorP = (double)minP * pmax;
    int c = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) c += prob[i] >= floorP ? 1 : 0;
    c = blockSum(c, S.redi);
    long long k = c < 1 ? 1 : c;
    if (k < n) n = k;
  }
  SelResult lastKept = selectKey(prob, vocab, 0, (int)(n - 1), 0, S);
  double kept = n == vocab ? total : lastKept.massBefore + lastKept.p;
  SelResult pick = selectKey(prob, vocab, 2, 0, u * kept, S);
  return (pick.index >= 0 && pick.countBefore < n) ? pick.index : lastKept.index;
}

// Greedy rows: the G blocks of the row each reduce one slice of the vocabulary to (max, index),
// store it in the row's scratch and count in; the last to arrive merges the G pairs (lowest index
// on ties, as blockArgmax) and re-arms the counter, so a large vocabulary is read by many SMs in
// one kernel. Returns -2 in every block but the last, else the token.
__device__ int greedyArrive(const float* L, int vocab, int G, double* prob, int* counter, SampleShared& S) {
  __shared__ int lastFlag;
  int chunk = (vocab + G - 1) / G, begin = blockIdx.x * chunk, end = min(vocab, begin + chunk);
  float v;
  int idx;
  blockArgmaxRange(L, begin, end, S.redf, S.redi, v, idx);
  float* pv = reinterpret_cast<float*>(prob);  // pairs (value, index) in the row's float64 slots
  if (threadIdx.x == 0) {
    pv[2 * blockIdx.x] = v;
    reinterpret_cast<int*>(pv)[2 * blockIdx.x + 1] = idx;
    __threadfence();  // the pair is visible before this block is counted
    int old = atomicAdd(counter, 1);
    lastFlag = old == G - 1;
    if (lastFlag) *counter = 0;
  }
  __syncthreads();
  if (!lastFlag) return -2;
  __threadfence();
  if (threadIdx.x < 32) {
    float bv = -INFINITY;
    int bi = -1;
    for (int j = threadIdx.x; j < G; j += 32)
      argmaxMerge(bv, bi, __ldcg(pv + 2 * j), __ldcg(reinterpret_cast<const int*>(pv) + 2 * j + 1));
    warpArgmax(bv, bi);
    if (threadIdx.x == 0) S.redi[0] = bi;
  }
  __syncthreads();
  int r = S.redi[0];
  return r < 0 ? 0 : r;
}

// Grid (G, rows): one float64 scratch row per row. A greedy row (temperature <= 0) is split over
// the G blocks (greedyArrive); a sampled row runs in its block 0 alone, the others exit.
// `counters` (one per row, zero, left zero) may be null only when G == 1.
__global__ void __launch_bounds__(1024) k_sample(const float* logits, const float* params, int* rng, int* out, int vocab,
                                                 double* probScratch, size_t probStride, int rowBase, int* counters) {
  NERVA_TRACE_KERNEL();
  __shared__ SampleShared S;
  int r = rowBase + blockIdx.y, G = gridDim.x;
  const float* L = logits + (size_t)r * vocab;
  double* prob = probScratch + (size_t)blockIdx.y * probStride;
  // The parameters are read before the dependency wait (only the host writes them, in stream
  // order). The seeds after it: the sample launch just before this one may still be moving the
  // counter (back-to-back draws).
  float temp = params[(size_t)r * 4], topK = params[(size_t)r * 4 + 1], topP = params[(size_t)r * 4 + 2],
        minP = params[(size_t)r * 4 + 3];
  PDL_ENTER();
  uint32_t seed = (uint32_t)rng[(size_t)r * 2], counter = (uint32_t)rng[(size_t)r * 2 + 1];
  int result;
  if (!(temp > 0.f)) {
    if (G == 1) {
      result = blockArgmax(L, vocab, S.redf, S.redi);
    } else {
      result = greedyArrive(L, vocab, G, prob, counters + blockIdx.y, S);
      if (result == -2) return;
    }
  } else {
    if (blockIdx.x != 0) return;
    result = sampleRow(L, prob, vocab, temp, topK, topP, minP, seed, counter, S);
  }
  if (threadIdx.x == 0) {
    out[r] = result;
    rng[(size_t)r * 2 + 1] = (int)(counter + 1u);
  }
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // (k_sample_cluster's alone, sm_90+)
// blockArgmaxRange over float4s: L + begin 16-byte aligned, begin % 4 == 0. U float4s a thread in
// flight at once (a cluster block's ~19 K logits in one round trip), taken in index order, so the
// result is blockArgmaxRange's (strictly greater wins; lowest index among equal maxima).
__device__ __forceinline__ void blockArgmaxRange4(const float* L, int begin, int end, float* shv, int* shi, float& outV, int& outI) {
  constexpr int U = 8;
  float bv = -INFINITY;
  int bi = -1;
  const int n4 = (end - begin + 3) >> 2;
  const float4* L4 = reinterpret_cast<const float4*>(L + begin);
  for (int j0 = threadIdx.x; j0 < n4; j0 += U * blockDim.x) {
    float4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int j = j0 + u * blockDim.x;
      v[u] = j < n4 ? L4[j] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int i = begin + 4 * (j0 + u * blockDim.x);
      const float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int c = 0; c < 4; c++)
        if (i + c < end && e[c] > bv) {
          bv = e[c];
          bi = i + c;
        }
    }
  }
  blockArgmaxStage(bv, bi, shv, shi);
  const int lane = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  // The block's warps merged by one warp (lane k holds warp k's pair), not a thread's loop.
  float v = -INFINITY;
  int idx = -1;
  if (lane < nw) {
    v = shv[lane];
    idx = shi[lane];
  }
  warpArgmax(v, idx);
  outV = v;
  outI = idx;
}
#endif

// A decode step's tail (op sample's push and advance) for a grid of one row, in block 0 after
// the merge: ring[cursor % capacity] = the token, cursor + 1, then the row's next position and
// KV slot. `pre`: the cursor and the row's position, block table entry and next slot are read
// before the dependency wait (the caller saw three or more kernels since the last that wrote
// them: see NervaExec::sinceRingPush), as k_ring_push and k_advance_positions do.
struct SampleTail {
  int* ring = nullptr;  // null: no push
  int* cursor = nullptr;
  int capacity = 1;
  int* positions = nullptr;  // null: no advance
  int* slots = nullptr;
  const int* bt = nullptr;
  const int* rowSeq = nullptr;
  int blockSize = 1;
  int mbps = 1;
  int pre = 0;
};

struct SampleTailState {
  int cur = 0, pos = 0, slot = 0;
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // k_sample_cluster's only (clusters: sm_90)
__device__ __forceinline__ void sampleTailRead(const SampleTail& T, SampleTailState& s) {
  if (T.ring) s.cur = *(volatile int*)T.cursor;
  if (T.positions) {
    s.pos = T.positions[0] + 1;
    s.slot = T.bt[(size_t)T.rowSeq[0] * T.mbps + s.pos / T.blockSize] * T.blockSize + s.pos % T.blockSize;
  }
}

__device__ __forceinline__ void sampleTailWrite(const SampleTail& T, const SampleTailState& s, int token) {
  if (T.ring) {
    ((volatile int*)T.ring)[(int)((long long)s.cur % T.capacity)] = token;
    __threadfence_system();  // the token is visible to a host peek before the cursor moves
    *(volatile int*)T.cursor = s.cur + 1;
  }
  if (T.positions) {
    T.positions[0] = s.pos;
    T.slots[0] = s.slot;
  }
}
#endif

// k_sample with the G blocks of a row as one thread block cluster (grid (G, rows), cluster
// (G, 1)): a greedy row's blocks push their (max, index) into block 0's shared memory (st.async,
// counted by block 0's transaction barrier), instead of a fence, an atomic count and the last
// block's reads back from L2 (the step's end is a chain of such round trips after the LM head).
// A sampled row runs in block 0 alone, as in k_sample (the other blocks exit; no barrier on that
// path). The caller checked: vocab % 4 == 0 and the logits 16-byte aligned.
__global__ void __launch_bounds__(1024) k_sample_cluster(const float* logits, const float* params, int* rng, int* out,
                                                         int vocab, double* probScratch, size_t probStride, int rowBase,
                                                         SampleTail tail) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters need sm_90: never launched there (sampleClusterSize)
#else
  namespace cg = cooperative_groups;
  NERVA_TRACE_KERNEL();
  __shared__ SampleShared S;
  __shared__ float pairV[SAMPLE_MAX_CLUSTER];
  __shared__ int pairI[SAMPLE_MAX_CLUSTER];
  cg::cluster_group cl = cg::this_cluster();
  const int C = (int)cl.num_blocks(), rank = (int)cl.block_rank();
  const int r = rowBase + blockIdx.y;
  const float* L = logits + (size_t)r * vocab;
  double* prob = probScratch + (size_t)blockIdx.y * probStride;
  const float temp = params[(size_t)r * 4], topK = params[(size_t)r * 4 + 1], topP = params[(size_t)r * 4 + 2],
              minP = params[(size_t)r * 4 + 3];
  SampleTailState ts;
  if (tail.pre && rank == 0 && threadIdx.x == 0) sampleTailRead(tail, ts);
  PDL_ENTER();
  if (!tail.pre && rank == 0 && threadIdx.x == 0) sampleTailRead(tail, ts);
  const uint32_t seed = (uint32_t)rng[(size_t)r * 2], counter = (uint32_t)rng[(size_t)r * 2 + 1];
  int result;
  if (!(temp > 0.f)) {
    const int chunk = (((vocab + C - 1) / C) + 3) & ~3;
    const int begin = min(vocab, rank * chunk), end = min(vocab, begin + chunk);
    // The pairs travel by st.async into block 0, counted by its transaction barrier (as the
    // cluster attention's partials, attn_decode_short.cuh): no cluster barrier, whose release
    // is a GPU-scope fence, and the other blocks exit once their pair is sent.
    __shared__ __align__(8) unsigned long long txBar;
    const unsigned bar = saShared(&txBar);
    if (rank == 0 && threadIdx.x == 0) saTxInit(bar, (unsigned)(C * 2 * sizeof(float)));
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    float v;
    int idx;
    blockArgmaxRange4(L, begin, end, S.redf, S.redi, v, idx);
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // block 0's barrier is initialized
    if (threadIdx.x == 0) {
      const unsigned rb = saMapa(bar, 0);
      saStAsync(saMapa(saShared(&pairV[rank]), 0), v, rb);
      saStAsync(saMapa(saShared(&pairI[rank]), 0), __int_as_float(idx), rb);
    }
    if (rank != 0 || threadIdx.x >= 32) return;
    saTxWait(bar);
    float bv = -INFINITY;
    int bi = -1;
    if ((int)threadIdx.x < C) {
      bv = pairV[threadIdx.x];
      bi = pairI[threadIdx.x];
    }
    warpArgmax(bv, bi);
    result = bi < 0 ? 0 : bi;
  } else {
    if (rank != 0) return;
    result = sampleRow(L, prob, vocab, temp, topK, topP, minP, seed, counter, S);
  }
  if (threadIdx.x == 0) {
    out[r] = result;
    rng[(size_t)r * 2 + 1] = (int)(counter + 1u);
    sampleTailWrite(tail, ts, result);
  }
#endif
}

// ---------------------------------------------------------------- launch helpers

struct Args {
  const double* a;
  int n;
  int i = 0;
  bool ok = true;
  double next() {
    if (i >= n) {
      ok = false;
      return 0;
    }
    return a[i++];
  }
  void* ptr() { return (void*)(uintptr_t)next(); }
  int num() { return (int)next(); }
};

struct Buf {
  void* p;
  int dt;
};

Buf buf(Args& A) {
  Buf b;
  b.p = A.ptr();
  b.dt = A.num();
  return b;
}

int bad(NervaExec* ex, const char* why) {
  snprintf(ex->errCall, sizeof ex->errCall, "%s", why);
  return NERVA_BAD_ARGS;
}

int check(NervaExec* ex, const char* name, cudaError_t launched = cudaSuccess) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = launched;
  if (!ex->capturing) ex->launches++;
  if (e != cudaSuccess) {
    snprintf(ex->errCall, sizeof ex->errCall, "launch %s", name);
    return (int)e;
  }
  return NERVA_OK;
}

// Every kernel goes through cudaLaunchKernelEx so that, with ex->pdl, it carries the
// programmatic-stream-serialization attribute (inside stream capture the graph edge becomes
// programmatic): it may launch before its predecessor finishes and syncs itself with pdlWait().
template <typename... KArgs, typename... Actual>
cudaError_t launchKernel(NervaExec* ex, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, Actual&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ex->stream;
  cudaLaunchAttribute attr[1];
  if (ex->pdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  if (ex->sinceRingPush < (1u << 20)) ex->sinceRingPush++;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Actual>(args)...);
}

// NERVA_SAMPLE_TAIL=0 (an A/B switch): op sample's push and advance run as their own ops'
// kernels even for one row on the cluster path.
bool sampleTailFold() {
  static const bool v = [] {
    const char* e = getenv("NERVA_SAMPLE_TAIL");
    return !(e && strcmp(e, "0") == 0);
  }();
  return v;
}

// NERVA_RING_EARLY=0 (an A/B switch): every ring_push reads the cursor after its wait.
bool ringPushEarly() {
  static const bool v = [] {
    const char* e = getenv("NERVA_RING_EARLY");
    return !(e && strcmp(e, "0") == 0);
  }();
  return v;
}

#define LAUNCH(name, grid, block, smem, ...)                                    \
  do {                                                                          \
    cudaError_t _le = launchKernel(ex, name, dim3(grid), dim3(block), (smem), __VA_ARGS__); \
    int _rc = check(ex, #name, _le);                                            \
    if (_rc) return _rc;                                                        \
  } while (0)

unsigned gridFor(size_t n, int block, int smCount) {
  size_t g = (n + block - 1) / block;
  size_t cap = (size_t)smCount * 16;
  return (unsigned)std::max<size_t>(1, std::min(g, cap));
}

size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

// NERVA_SPLIT_FUSION=0: gemmRowsBlas normalizes and splits in two kernels and no operand is handed
// off (the A/B switch for the fusions below; the bits are the same either way).
bool splitFusion() {
  static const bool v = [] {
    const char* e = getenv("NERVA_SPLIT_FUSION");
    return !(e && strcmp(e, "0") == 0);
  }();
  return v;
}

// Where a GEMM epilogue left the bf16 split (hi rows, then lo rows with `lo`) of its output.
struct SplitHandoff {
  const uint16_t* hi = nullptr;
  int rows = 0, dim = 0;
  bool lo = false;
};

// What fused_matmul adds to a matmul (all off for op matmul).
struct Fuse {
  Buf nw{nullptr, 0};
  float eps = 0.f;
  bool glu = false;
  bool accumulate = false;
  // accumulate's current values may be read before the dependency wait: the caller guarantees
  // `out` was last written two or more kernels earlier in the stream (see k_gemv_bf16).
  bool accPre = false;
  // Trigger the next kernel at entry instead of after the wait, so it launches (and streams its
  // weights) while this one still waits; with split blocks, also the leaner block shape (see
  // ksLean). The next kernel must then read nothing before its own wait that relies on this
  // kernel's predecessors being complete (no accPre right after).
  bool early = false;
  // Operand hand-off between two many-row GEMMs (gemmRowsBlas): `emit` asks this call's epilogue
  // to also write the bf16 split of its output and says where (hi null: it did not); `take` gives
  // this call its x already split there, so it launches no split of its own.
  SplitHandoff* emit = nullptr;
  const SplitHandoff* take = nullptr;
  // embed (op decoder_layers' first qkv): x := table[ids] first, the rows gathered by the GEMV
  // itself where it takes one row on k_gemv_bf16_lean (gemvLeanNormOneRow), else by k_embedding
  // launched first. table: embTable (dtype embDt), x is written either way.
  const void* embTable = nullptr;
  int embDt = 0;
  const int* embIds = nullptr;
};

int gemvRows(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias,
             const Fuse& f = Fuse());

bool gemvLean();

// Whether gemvRows runs this call as k_gemv_bf16_lean<1, 1, true, false, 1> (one row, staged
// norm, unsplit, at most two blocks an SM, one float4 of the row a thread): the one kernel that
// gathers an embedded row itself. Mirrors gemvRows' choice for that shape.
bool gemvLeanNormOneRow(NervaExec* ex, const float* x, Buf w, int rows, int inDim, int outDim, const Fuse& f) {
  if (rows != 1 || ex->batchInv || !f.nw.p || f.glu || !gemvLean()) return false;
  const bool nwOk = (f.nw.dt == NV_BF16 || f.nw.dt == NV_F32) && ((uintptr_t)f.nw.p & 15) == 0;
  if (!(w.dt == NV_BF16 && inDim % 8 == 0 && ((uintptr_t)w.p & 15) == 0 && ((uintptr_t)x & 15) == 0 && nwOk)) return false;
  if ((size_t)outDim < (size_t)ex->smCount * 16 && inDim >= 1024) return false;  // split
  if ((size_t)inDim * sizeof(float) > 48 * 1024 || (size_t)inDim * sizeof(float) > ex->wsBytes) return false;
  const int threads = 32 * gemvWarps(1);
  const unsigned grid = (unsigned)((outDim + gemvWarps(1) - 1) / gemvWarps(1));
  return grid <= 2u * (unsigned)ex->smCount && inDim / 4 <= threads;
}

int gemmRowsBlas(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias,
                 const Fuse& f, bool pinned);

// Rows of one k_gemv_bf16 launch (NERVA_GEMV_MAX_ROWS: 8 or 16, default 16). Numerics do not
// depend on it (a row's reduction order is the same for every R); speed does.
int gemvMaxRows() {
  static const int v = [] {
    const char* e = getenv("NERVA_GEMV_MAX_ROWS");
    return e && atoi(e) == 8 ? 8 : 16;
  }();
  return v;
}

// Outputs a warp of k_gemv_bf16 computes (O), by the launch's rows R (1, 2, 4, 8, 16) and GLU.
// At R rows a warp's activation loads per weight byte scale as R / NO (NO = O, or 2 * O weight
// rows with GLU): at R = 16 and O = 1 the x traffic through L1/L2, not the weight stream, bound
// the kernel (an 8B step of 32 rows took 100 ms against 7 for one row). R = 1 keeps O = 1 (~95 %
// of copy bandwidth already); otherwise NO * R <= 64 accumulators a lane. Numerics do not
// depend on O (each (row, output) pair is computed as at R = 1, O = 1).
__host__ __device__ constexpr int gemvOuts(int R, bool glu) { return R == 1 ? 1 : R <= 4 ? 2 : glu ? 2 : 4; }
// NERVA_GEMV_OUTPUTS=1: O = 1 at every R (A/B switch).
bool gemvMultiOut() {
  static const bool v = [] {
    const char* e = getenv("NERVA_GEMV_OUTPUTS");
    return !(e && atoi(e) == 1);
  }();
  return v;
}

// One-row split projections (o and down at batch 1) run k_gemv_wide with this many outputs a
// block: NERVA_GEMV_WIDE (8, the default; 4; 0: k_gemv_bf16, a block an output). H100, 0.6B,
// batch 1 (session 19, call 10, alternating): 1388-1396 tok/s a block an output, 1420-1428 with
// 4 outputs a block, 1430-1437 with 8; the same tokens.
int gemvWide() {
  static const int v = [] {
    const char* e = getenv("NERVA_GEMV_WIDE");
    return e && *e ? (atoi(e) >= 8 ? 8 : atoi(e) >= 4 ? 4 : 0) : 8;
  }();
  return v;
}

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

// One-row normed projections of at most two blocks an SM run k_gemv_bf16_lean (qkv at batch 1;
// not the LM head, many waves, which the register bound slowed by 4 %); NERVA_GEMV_LEAN=0 keeps
// k_gemv_bf16.
bool gemvLean() {
  static const bool v = [] {
    const char* e = getenv("NERVA_GEMV_LEAN");
    return !(e && strcmp(e, "0") == 0);
  }();
  return v;
}

template <int R, int KS, bool N, bool G, int O>
int gemvLaunch(NervaExec* ex, const GemvLaunch& a) {
  constexpr int perBlock = gemvWarpsO(KS, O) / KS * O;  // outputs a block
  const unsigned grid = (unsigned)((a.outDim + perBlock - 1) / perBlock);
  if constexpr (R == 1 && KS == 1 && N && !G && O == 1) {
    if (gemvLean() && grid <= 2u * (unsigned)ex->smCount) {
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

// The launch of R (padded) rows: ks as gemvRows chose it (1, 2 or 3 lean, 4); norm: staged in
// the kernel (O == 1 only); multi: O = gemvOuts(R, glu) rather than 1.
template <int R>
int gemvPick(NervaExec* ex, const GemvLaunch& a, int ks, bool norm, bool glu, bool multi) {
  constexpr int OP = gemvOuts(R, false), OG = gemvOuts(R, true);
  if constexpr (OP > 1 && OG > 1) {
    if (multi && !norm) {
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

// Batch-invariant decode runs its matmuls on cuBLASLt with pinned algorithms where it loads
// (gemmRowsBlas), else on k_gemm_bi (NERVA_BI_GEMM=kernel forces it; NERVA_BI_GEMM=0: the GEMV,
// k_gemv_bf16); each gives different bits, each row-independent. On the H100 (session 14)
// k_gemm_bi passed the invariance check at 2..64 rows and took 32 sampled 8B forks from 3.1x to
// 16x over sequential, but at 64-128 rows it reached 24-43 TFMA/s, latency-bound.
bool biGemmEnabled() {
  static const bool v = [] {
    const char* e = getenv("NERVA_BI_GEMM");
    return !(e && strcmp(e, "0") == 0);
  }();
  return v;
}

// Warps' worth of weight tiles biSplitK aims for: NERVA_BI_GEMM_WARPS (default 2048, about 16
// warps an SM of an H100; 0: no split-K). A tuning knob: it changes the bits of batch-invariant
// matmuls (the same for every row count of the process).
long long biTargetWarps() {
  static const long long v = [] {
    const char* e = getenv("NERVA_BI_GEMM_WARPS");
    return e && *e ? std::max(0LL, atoll(e)) : 2048LL;
  }();
  return v;
}

// k_gemm_bi's split-K warps (KS), from the shape alone (never the rows, the GPU or the call):
// doubled from 1 while the weight tiles of 16 rows times KS stay under biTargetWarps() (2048),
// each stripe keeps at least 2 chunks of 64 k, and KS < BI_MAX_KS. Qwen3-8B: qkv, o, down 8,
// gate_up 2, LM head 1; Qwen3-0.6B: 8 but the LM head.
int biSplitK(int inDim, int outDim, bool glu) {
  const long long mtiles = (long long)((outDim + 15) / 16) * (glu ? 2 : 1);
  const int chunks = (inDim + BI_CHUNK - 1) / BI_CHUNK;
  int ks = 1;
  while (ks < BI_MAX_KS && mtiles * ks < biTargetWarps() && 4 * ks <= chunks) ks *= 2;
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
  if (smem > 48 * 1024) {
    // Above 48 KiB a block must opt in (per function, per device: set on every such launch).
    cudaError_t e = cudaFuncSetAttribute(k_gemm_bi<NT, GLU, TERMS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return check(ex, "k_gemm_bi (shared memory opt-in)", e);
  }
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

// Batch-invariant decode's matmul (gemvRows with ex->batchInv, see k_gemm_bi): up to 64 rows a
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
    // gemvRows' one-row block: split (4 warps) for few outputs, else 16 warps.
    const bool split = (size_t)outDim * (f.glu ? 2 : 1) < (size_t)ex->smCount * 16 && inDim >= 1024;
    normThreads = 32 * gemvWarps(split ? 4 : 1);
  }
  const int nwbf = f.nw.dt == NV_BF16 ? 1 : 0;
  const uint16_t* wp = (const uint16_t*)w.p;
  for (int r0 = 0; r0 < rows; r0 += maxR) {
    const int nr = std::min(maxR, rows - r0);
    const float* xr = x + (size_t)r0 * inDim;
    if (f.nw.p) {
      LAUNCH(k_rmsnorm_gemv, nr, normThreads, 0, xr, f.nw.p, nwbf, (float*)ex->ws, inDim, f.eps, bfa);
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

// Rows past 8 go to cuBLAS unless the context is batch-invariant (see below); up to 16 rows a
// k_gemv_bf16 launch (gemvMaxRows), each warp O outputs (gemvOuts; NERVA_GEMV_OUTPUTS=1 forces
// O = 1). What fixes a row's bits, and so must not depend on the rows or O of a launch: KS (split
// and ksLean, chosen once per call from the shapes, as for one row) and the norm's block size
// (staged in the kernel by 32 * gemvWarps(KS) threads, or k_rmsnorm_gemv with that block size
// first, which launches with O > 1 always take since their blocks differ).
int gemvRows(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias,
             const Fuse& fIn) {
  // embed: gathered by the lean kernel, or by k_embedding into x before whatever runs the call.
  Fuse f = fIn;
  bool gather = false;
  if (f.embTable) {
    gather = f.embDt == NV_BF16 && ((uintptr_t)f.embTable & 7) == 0 && gemvLeanNormOneRow(ex, x, w, rows, inDim, outDim, f);
    if (!gather)
      LAUNCH(k_embedding, rows, 256, 0, f.embTable, f.embDt, f.embIds, (float*)x, inDim, ex->bf16act ? 1 : 0);
    f.embTable = nullptr;
  }
  // Past 8 rows the GEMV reads the weights once per 8 rows; a tensor-core GEMM reads them once.
  // Batch-invariant decode takes k_gemm_bi at every row count (below; NERVA_BI_GEMM=0 opts out), else
  // (or for shapes it does not take) keeps every row count on the GEMV: its per-row reduction order
  // (the lanes' k chunks, the warp sum, the KS split) is the same for any R, so each row's result
  // is the one it gets alone.
  // Batch-invariant decode with cuBLASLt loaded: every row count (1 included) on the shape's
  // pinned GEMM (a shape with none pinned takes k_gemm_bi below, at every row count).
  bool pinned = false;
  if (ex->batchInv && ex->lt && ex->cublas && ex->gemmMode != GEMM_GEMV && w.dt == NV_BF16) {
    const int pin = nerva_lt_pinned(ex, outDim * (f.glu ? 2 : 1), inDim);
    if (pin < 0) return NERVA_CUBLAS_FAILED;
    pinned = pin == 1;
  }
  if ((ex->batchInv ? pinned : rows > 8) && ex->cublas && ex->gemmMode != GEMM_GEMV && w.dt == NV_BF16) {
    int rc = gemmRowsBlas(ex, x, w, out, rows, inDim, outDim, bias, f, pinned);
    // BAD_ARGS here: one row does not fit the workspace (whatever the row count, so a
    // batch-invariant row still takes one path), the kernels below take it.
    if (rc != NERVA_BAD_ARGS) return rc;
  }
  bool nwOk = !f.nw.p || ((f.nw.dt == NV_BF16 || f.nw.dt == NV_F32) && ((uintptr_t)f.nw.p & 15) == 0);
  bool fast = w.dt == NV_BF16 && inDim % 8 == 0 && ((uintptr_t)w.p & 15) == 0 && ((uintptr_t)x & 15) == 0 && nwOk;
  // Batch-invariant decode: every row count (1 included) on tensor cores, k_gemm_bi (its choice
  // depends on the shapes and alignment alone, so a row takes the same kernel at any row count).
  if (ex->batchInv && biGemmEnabled() && fast && inDim % 16 == 0 &&
      (!f.nw.p || (size_t)inDim * sizeof(float) <= ex->wsBytes))
    return gemmBiRows(ex, x, w, out, rows, inDim, outDim, bias, f);
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
        LAUNCH(k_rmsnorm, nr, 256, 0, xr, nw.p, nw.dt, (float*)ex->ws, (float*)nullptr, inDim, f.eps, bfa, (uint16_t*)nullptr, (uint16_t*)nullptr);
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
  const bool multi = gemvMultiOut();
  // Rows per launch: 16 (R = 16 reads the weights once per 16 rows) unless NERVA_GEMV_MAX_ROWS=8.
  const int maxR = gemvMaxRows();
  if (rows == 1 && split && !f.nw.p && !f.glu && (ks == 2 || ks == 3 || ks == 4) && gemvWide() > 0 &&
      (size_t)inDim * sizeof(float) <= 48 * 1024) {
    const int opb = gemvWide();
    const size_t sm = (size_t)inDim * sizeof(float);
    const unsigned g4 = (unsigned)((outDim + 3) / 4), g8 = (unsigned)((outDim + 7) / 8);
    const uint16_t* wp = (const uint16_t*)w.p;
    const int ap = f.accPre ? 1 : 0, tg = f.early ? 1 : 0;
#define GW(KS_, OPB_, G_)                                                                                              \
  LAUNCH((k_gemv_wide<KS_, OPB_>), G_, 32 * KS_ * OPB_, sm, x, wp, out, inDim, outDim, bias.p, bias.dt, acc, bfa, ap, tg)
    if (opb == 4) {
      if (ks == 2) GW(2, 4, g4);
      else if (ks == 3) GW(3, 4, g4);
      else GW(4, 4, g4);
    } else {
      if (ks == 2) GW(2, 8, g8);
      else if (ks == 3) GW(3, 8, g8);
      else GW(4, 8, g8);
    }
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
    const bool multiO = multi && gemvOuts(rPad, f.glu) > 1;
    size_t smem = f.nw.p ? (size_t)rPad * inDim * sizeof(float) : 0;
    bool norm = f.nw.p != nullptr;
    if (norm && (multiO || smem > 48 * 1024 || (size_t)nr * inDim * sizeof(float) > ex->wsBytes)) {
      if ((size_t)nr * inDim * sizeof(float) > ex->wsBytes) return bad(ex, "fused_matmul: workspace too small");
      if (inDim % 4 == 0 && ((uintptr_t)f.nw.p & 15) == 0) {
        // The block size of the GEMV that would have staged it (split: KS = 4; else 1).
        LAUNCH(k_rmsnorm_gemv, nr, 32 * gemvWarps(split ? 4 : 1), 0, xr, f.nw.p, nwbf, (float*)ex->ws, inDim, f.eps, bfa);
      } else {
        LAUNCH(k_rmsnorm, nr, 256, 0, xr, f.nw.p, f.nw.dt, (float*)ex->ws, (float*)nullptr, inDim, f.eps, bfa, (uint16_t*)nullptr, (uint16_t*)nullptr);
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
      case 1: rc = gemvPick<1>(ex, a, ks, norm, f.glu, multi); break;
      case 2: rc = gemvPick<2>(ex, a, ks, norm, f.glu, multi); break;
      case 4: rc = gemvPick<4>(ex, a, ks, norm, f.glu, multi); break;
      case 8: rc = gemvPick<8>(ex, a, ks, norm, f.glu, multi); break;
      default: rc = gemvPick<16>(ex, a, ks, norm, f.glu, multi); break;
    }
    if (rc) return rc;
  }
  return NERVA_OK;
}

int gemmCublas(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias) {
  const CublasApi* api = ex->api;
  // Under bf16 numerics the activations are bf16 values already: the low half would be zero.
  bool split = ex->gemmMode == GEMM_SPLIT_BF16 && !ex->bf16act;
  size_t perRow = (size_t)inDim * 2 * (split ? 2 : 1);
  size_t maxRows = ex->wsBytes / (perRow + 512);
  if (maxRows < 1) return bad(ex, "matmul: workspace too small for one row (raise workspaceBytes)");
  if (api->setStream(ex->cublas, ex->stream) != 0) {
    snprintf(ex->errCall, sizeof ex->errCall, "cublasSetStream");
    return NERVA_CUBLAS_FAILED;
  }
  float one = 1.f, zero = 0.f;
  for (int r0 = 0; r0 < rows; r0 += (int)maxRows) {
    int nr = (int)std::min<size_t>(maxRows, (size_t)(rows - r0));
    size_t n = (size_t)nr * inDim;
    uint16_t* hi = (uint16_t*)ex->ws;
    uint16_t* lo = split ? (uint16_t*)(ex->ws + align256(n * 2)) : nullptr;
    LAUNCH(k_split_bf16, gridFor(n, 256, ex->smCount), 256, 0, x + (size_t)r0 * inDim, hi, lo, n);
    float* o = out + (size_t)r0 * outDim;
    // Row-major out[nr, outDim] = x[nr, K] . W[outDim, K]^T  <=>  column-major out^T = W^T(op T) . x^T
    int st = api->gemmEx(ex->cublas, CUBLAS_OP_T, CUBLAS_OP_N, outDim, nr, inDim, &one, w.p, CUDA_R_16BF_, inDim, hi,
                         CUDA_R_16BF_, inDim, &zero, o, CUDA_R_32F_, outDim, CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_);
    if (!ex->capturing) ex->launches++;
    if (st == 0 && split) {
      st = api->gemmEx(ex->cublas, CUBLAS_OP_T, CUBLAS_OP_N, outDim, nr, inDim, &one, w.p, CUDA_R_16BF_, inDim, lo,
                       CUDA_R_16BF_, inDim, &one, o, CUDA_R_32F_, outDim, CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_);
      if (!ex->capturing) ex->launches++;
    }
    if (st != 0) {
      snprintf(ex->errCall, sizeof ex->errCall, "cublasGemmEx (status %d)", st);
      return NERVA_CUBLAS_FAILED;
    }
    if (bias.p || ex->bf16act)
      LAUNCH(k_bias_add, gridFor((size_t)nr * outDim, 256, ex->smCount), 256, 0, o, bias.p, bias.dt, nr, outDim, ex->bf16act ? 1 : 0);
  }
  return NERVA_OK;
}

// fused_matmul over many rows (batched decode): the norm (if any) into the workspace, the
// activations split hi/lo (exact) or rounded (bf16), ONE GEMM over the stacked hi and lo rows (so
// the weights are read once), then k_gemm_epilogue (lo + hi, bias, glu, accumulate). With one term
// and nothing but an accumulate to apply, the GEMM writes (or adds into) out itself: the same
// single f32 add. Rows go in chunks the workspace holds. The GEMM is cuBLAS's (its heuristic picks
// the kernel per row count) or, in a batch-invariant context, cuBLASLt's with a pinned algorithm
// (nerva_lt_gemm): every step here is then row-independent, so a row's bits are the same at any
// row count (`pinned`: the caller found the shape pinned). Returns NERVA_BAD_ARGS, having enqueued
// nothing, when one row does not fit.
int gemmRowsBlas(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias,
                 const Fuse& f, bool pinned) {
  const CublasApi* api = ex->api;
  const int bfa = ex->bf16act ? 1 : 0;
  const bool split = ex->gemmMode == GEMM_SPLIT_BF16 && !ex->bf16act;
  const int halves = split ? 2 : 1;
  const int wOut = outDim * (f.glu ? 2 : 1);
  const bool direct = !split && !f.glu && !bias.p && !bfa;
  const bool fuse = splitFusion();
  // Per row: the GEMM's out (unless direct), the bf16 operand rows (normalized first with a norm),
  // and without the fusion the normalized row (f32) between.
  const size_t perRow = (direct ? 0 : (size_t)halves * wOut * sizeof(float)) + (size_t)halves * inDim * sizeof(uint16_t) +
                        (f.nw.p && !fuse ? (size_t)inDim * sizeof(float) : 0);
  const size_t slack = 3 * 256;  // alignment of the regions
  if (ex->wsBytes < perRow + slack) return NERVA_BAD_ARGS;
  const int chunk = (int)std::min<size_t>((size_t)rows, (ex->wsBytes - slack) / perRow);
  // The hand-offs need every row in one chunk: the handed-off region then holds all of them.
  const size_t tAll = direct ? 0 : align256((size_t)halves * rows * wOut * sizeof(float));
  const size_t xAll = align256((size_t)halves * rows * inDim * sizeof(uint16_t));
  const size_t nextAll = (size_t)halves * rows * outDim * sizeof(uint16_t);
  const SplitHandoff* tk = fuse ? f.take : nullptr;
  const bool take = tk && tk->hi && !f.nw.p && chunk == rows && tk->rows == rows && tk->dim == inDim && tk->lo == split &&
                    ((const char*)tk->hi >= ex->ws + tAll || (const char*)tk->hi + xAll <= ex->ws);
  const bool emit = fuse && f.emit && !direct && chunk == rows && tAll + xAll + nextAll <= ex->wsBytes;
  if (f.emit) *f.emit = SplitHandoff();
  if (!pinned && api->setStream(ex->cublas, ex->stream) != 0) {
    snprintf(ex->errCall, sizeof ex->errCall, "cublasSetStream");
    return NERVA_CUBLAS_FAILED;
  }
  for (int r0 = 0; r0 < rows; r0 += chunk) {
    const int nr = std::min(chunk, rows - r0);
    const size_t n = (size_t)nr * inDim;
    const size_t tBytes = direct ? 0 : align256((size_t)halves * nr * wOut * sizeof(float));
    char* ws = ex->ws;
    const float* xin = x + (size_t)r0 * inDim;
    float* o = out + (size_t)r0 * outDim;
    float* t = direct ? o : (float*)ws;
    uint16_t* xh = (uint16_t*)(ws + tBytes);
    // lo rows right after the hi rows: the GEMM sees one [halves * nr, inDim] operand. With a norm,
    // k_rmsnorm writes the split itself (the bits of k_rmsnorm then k_split_bf16, one launch fewer);
    // a handed-off operand (the GEMM before split its output, which is our x) needs neither.
    if (take) {
      xh = const_cast<uint16_t*>(tk->hi);
    } else if (f.nw.p && !fuse) {
      float* nrm = (float*)(ws + tBytes + align256((size_t)halves * n * sizeof(uint16_t)));
      LAUNCH(k_rmsnorm, nr, 256, 0, xin, f.nw.p, f.nw.dt, nrm, (float*)nullptr, inDim, f.eps, bfa, (uint16_t*)nullptr, (uint16_t*)nullptr);
      LAUNCH(k_split_bf16, gridFor(n, 256, ex->smCount), 256, 0, nrm, xh, split ? xh + n : (uint16_t*)nullptr, n);
    } else if (f.nw.p) {
      LAUNCH(k_rmsnorm, nr, 256, 0, xin, f.nw.p, f.nw.dt, (float*)nullptr, (float*)nullptr, inDim, f.eps, bfa, xh,
             split ? xh + n : (uint16_t*)nullptr);
    } else {
      LAUNCH(k_split_bf16, gridFor(n, 256, ex->smCount), 256, 0, xin, xh, split ? xh + n : (uint16_t*)nullptr, n);
    }
    const bool acc = direct && f.accumulate;
    if (pinned) {
      int rc = nerva_lt_gemm(ex, wOut, halves * nr, inDim, w.p, xh, t, acc);
      if (rc) return rc;
    } else {
      float one = 1.f, zero = 0.f;
      int st = api->gemmEx(ex->cublas, CUBLAS_OP_T, CUBLAS_OP_N, wOut, halves * nr, inDim, &one, w.p, CUDA_R_16BF_, inDim, xh,
                           CUDA_R_16BF_, inDim, acc ? &one : &zero, t, CUDA_R_32F_, wOut, CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_);
      if (!ex->capturing) ex->launches++;
      if (st != 0) {
        snprintf(ex->errCall, sizeof ex->errCall, "cublasGemmEx (status %d)", st);
        return NERVA_CUBLAS_FAILED;
      }
    }
    uint16_t* nextHi = emit ? (uint16_t*)(ws + tAll + xAll) : nullptr;
    if (!direct)
      LAUNCH(k_gemm_epilogue, gridFor((size_t)nr * outDim, 256, ex->smCount), 256, 0, t, split ? 1 : 0, o, bias.p, bias.dt, nr,
             outDim, f.glu ? 1 : 0, f.accumulate ? 1 : 0, bfa, nextHi, split && emit ? nextHi + (size_t)nr * outDim : nullptr);
    if (emit) *f.emit = SplitHandoff{nextHi, rows, outDim, split};
  }
  return NERVA_OK;
}

int gemmCublasBf16x(NervaExec* ex, const uint16_t* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias);  // prefill_silu.cuh

int opMatmul(NervaExec* ex, Args& A) {
  Buf x = buf(A), w = buf(A), out = buf(A), bias = buf(A);
  int rows = A.num(), inDim = A.num(), outDim = A.num();
  double wOff = A.next();
  if (!A.ok) return bad(ex, "matmul: argument count");
  int wb = w.dt == NV_F32 ? 4 : 2;
  w.p = (char*)w.p + (size_t)wOff * wb;
  if (rows <= 0 || outDim <= 0) return NERVA_OK;
  bool useBlas = rows > 8 && ex->gemmMode != GEMM_GEMV && ex->cublas && w.dt == NV_BF16;
  if (x.dt == NV_BF16) {
    if (!useBlas) return bad(ex, "matmul: a bf16 x needs the GEMM path (more than 8 rows, cuBLAS, bf16 weights)");
    return gemmCublasBf16x(ex, (const uint16_t*)x.p, w, (float*)out.p, rows, inDim, outDim, bias);
  }
  if (useBlas) return gemmCublas(ex, (const float*)x.p, w, (float*)out.p, rows, inDim, outDim, bias);
  return gemvRows(ex, (const float*)x.p, w, (float*)out.p, rows, inDim, outDim, bias);
}

// fused_matmul: the GEMV kernels up to 8 rows, a cuBLAS GEMM with a fused epilogue beyond (batched decode).
int opFusedMatmul(NervaExec* ex, Args& A) {
  Buf x = buf(A), w = buf(A), out = buf(A), bias = buf(A);
  Fuse f;
  f.nw = buf(A);
  int rows = A.num(), inDim = A.num(), outDim = A.num();
  f.eps = (float)A.next();
  f.glu = A.num() != 0;
  f.accumulate = A.num() != 0;
  if (!A.ok) return bad(ex, "fused_matmul: argument count");
  if (f.glu && bias.p) return bad(ex, "fused_matmul: bias is not allowed with glu");
  if (rows <= 0 || outDim <= 0) return NERVA_OK;
  return gemvRows(ex, (const float*)x.p, w, (float*)out.p, rows, inDim, outDim, bias, f);
}

// Split-KV sizing (A/B measurements on the GPU machine): NERVA_ATTN_WAVES (default 1) waves of
// the split kernel's resident blocks the splits aim to fill, NERVA_ATTN_MIN_CHUNK (default 32)
// fewest keys a split.
struct AttnTune {
  int waves = 1;
  int minChunk = 32;
};
const AttnTune& attnTune() {
  static const AttnTune t = [] {
    AttnTune a;
    // (Empty: unset, as everywhere; createCudaBackend has rejected what atoi would misread.)
    const char* v = getenv("NERVA_ATTN_WAVES");
    if (v && *v) a.waves = std::max(1, atoi(v));
    v = getenv("NERVA_ATTN_MIN_CHUNK");
    if (v && *v) a.minChunk = std::max(8, atoi(v));
    return a;
  }();
  return t;
}

// Decode batches of at least NERVA_ATTN_GQA_MIN_ROWS rows (default 16; 0: never) run
// k_attn_decode_gqa, which reads each key once for the G q heads of its KV head.
int gqaMinRows() {
  static const int v = [] {
    const char* e = getenv("NERVA_ATTN_GQA_MIN_ROWS");
    return e && *e ? std::max(0, atoi(e)) : 16;
  }();
  return v;
}

// Batch-invariant decode runs k_attn_decode_gqa at every row count, 1 included, with its splits
// sized as for one row (attnDecodeGqaRun); NERVA_BI_ATTN_GQA=0: the split-KV kernel instead. It
// reads each key once for the G q heads of its KV head (what makes many-row decode fast, see
// gqaMinRows); checked invariant at 2..64 rows on the H100 with k_gemm_bi (session 14).
bool biAttnGqa() {
  static const bool v = [] {
    const char* e = getenv("NERVA_BI_ATTN_GQA");
    return !(e && strcmp(e, "0") == 0);
  }();
  return v;
}

bool attnDecodeGqaFits(const NervaExec* ex, int rows, int H, int KVH, int hd, int kdt, int vdt) {
  const int G = KVH > 0 && H % KVH == 0 ? H / KVH : 0;
  const bool shapes = hd == DG_HD && !ex->bf16act && kdt == vdt && (kdt == NV_F32 || kdt == NV_BF16) &&
                      (G == 1 || G == 2 || G == 4 || G == 8);
  // Batch-invariant decode: one kernel for every row count, chosen from the shapes alone (this
  // one, or with NERVA_BI_ATTN_GQA=0 the split-KV kernel below).
  if (ex->batchInv) return biAttnGqa() && shapes;
  return gqaMinRows() > 0 && rows >= gqaMinRows() && shapes;
}

int gqaMaxKeys() {
  static const int v = [] {
    const char* e = getenv("NERVA_ATTN_GQA_MAX_KEYS");
    return e && *e ? std::max(0, atoi(e)) : 512;
  }();
  return v;
}

// Fewest keys a split of batch-invariant GQA decode attention takes: NERVA_BI_ATTN_CHUNK (default
// 256). A tuning knob: it changes the bits of batch-invariant attention (the same for every row
// count of the process): larger chunks mean fewer partials to write and merge for a many-row
// batch, less parallelism for one row. On the H100 (session 15) 256 against 64 took the 0.6B
// throughput workload with --batch-invariant from 13176 to 14189 output tok/s (same call).
int biAttnChunk() {
  static const int v = [] {
    const char* e = getenv("NERVA_BI_ATTN_CHUNK");
    const int c = e && *e ? atoi(e) : 256;
    return c >= 16 ? c : 256;
  }();
  return v;
}

// Batch-invariant decode attention: rows a launch when S (a single row's splits) is fixed, so
// that every chunk's partials fit the workspace and merge through the counters (attnArrive),
// whatever the rows of the call: a row's merge path never depends on its neighbours.
int invRowChunk(const NervaExec* ex, int rows, int H, long long S, size_t perSplit) {
  size_t fit = ex->wsBytes / ((size_t)H * S * perSplit);
  if (ex->counters && (size_t)H <= ex->counterCount) fit = std::min(fit, ex->counterCount / (size_t)H);
  return (int)std::max<size_t>(1, std::min<size_t>((size_t)rows, fit));
}

template <typename KT, int G>
int attnDecodeGqaRun(NervaExec* ex, const float* q, Buf kc, Buf vc, float* out, Buf bt, Buf rowSeq, Buf pos, int rows,
                     int H, int KVH, int bs, int mbps, int qStride, int qOff, float scale, SplitHandoff* emit) {
  const long long maxLen = (long long)mbps * bs;
  const int minChunk = ex->batchInv ? biAttnChunk() : 64;
  // Splits: about three blocks per SM in all, each at least minChunk keys. Batch-invariant
  // decode: as for one row whatever the rows (a row's key chunks and merge order fix its bits),
  // the rows in chunks the workspace and the combine counters cover, so every chunk merges the
  // same way (attnArrive) and S is never cut for the rows' sake.
  const bool inv = ex->batchInv;
  const long long sRows = inv ? 1 : rows;
  long long S = std::max<long long>(1, ((long long)ex->smCount * 3 + sRows * KVH - 1) / (sRows * KVH));
  // Many rows: every row's keys also go in splits of at most NERVA_ATTN_GQA_MAX_KEYS (default
  // 512; 0: no bound) of the longest context, else a wide batch of long contexts runs one block
  // per row and head over all its keys. On the H100 (session 15) the 0.6B throughput workload
  // went from 13136 to 13984 output tok/s with 512 (13733 with 256; same call).
  if (!inv && gqaMaxKeys() > 0) S = std::max<long long>(S, (maxLen + gqaMaxKeys() - 1) / gqaMaxKeys());
  S = std::min<long long>(S, std::max<long long>(1, (maxLen + minChunk - 1) / minChunk));
  const size_t perSplit = (size_t)(DG_HD + 2) * sizeof(float);
  int rowChunk = rows;
  if (inv) rowChunk = invRowChunk(ex, rows, H, S, perSplit);
  while (rowChunk > 1 && (size_t)rowChunk * H * S * perSplit > ex->wsBytes) {
    if (S > 1) S = std::max<long long>(1, S / 2);
    else rowChunk = (rowChunk + 1) / 2;
  }
  if ((size_t)rowChunk * H * S * perSplit > ex->wsBytes) return bad(ex, "attention: workspace too small");
  constexpr size_t smem = dgSmemBytes<KT>();
  cudaError_t e = cudaFuncSetAttribute(k_attn_decode_gqa<KT, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return check(ex, "k_attn_decode_gqa (shared memory opt-in)", e);
  float* part = (float*)ex->ws;
  // The output's bf16 split for the o projection's GEMM (emit), at the workspace's end: only where
  // the partials, as sized above, stay clear of it and every chunk merges through the counters.
  uint16_t* outHi = nullptr;
  size_t loOff = 0;
  if (emit) *emit = SplitHandoff();
  if (emit && splitFusion()) {
    const bool lo = ex->gemmMode == GEMM_SPLIT_BF16 && !ex->bf16act;
    const size_t n = (size_t)rows * H * DG_HD, bytes = (lo ? 2 : 1) * n * sizeof(uint16_t);
    const size_t at = bytes < ex->wsBytes ? (ex->wsBytes - bytes) & ~(size_t)255 : 0;
    const bool counted = ex->counters && (size_t)rowChunk * H <= ex->counterCount;
    if (counted && at > 0 && (size_t)rowChunk * H * S * perSplit <= at) {
      outHi = (uint16_t*)(ex->ws + at);
      loOff = lo ? n : 0;
      *emit = SplitHandoff{outHi, rows, H * DG_HD, lo};
    }
  }
  for (int r0 = 0; r0 < rows; r0 += rowChunk) {
    const int nr = std::min(rowChunk, rows - r0);
    int* cnt = ex->counters && (size_t)nr * H <= ex->counterCount ? ex->counters : nullptr;
    LAUNCH((k_attn_decode_gqa<KT, G>), dim3((unsigned)S, (unsigned)KVH, (unsigned)nr), 128, smem, q, (const KT*)kc.p,
           (const KT*)vc.p, (const int*)bt.p, (const int*)rowSeq.p, (const int*)pos.p, part, H, KVH, bs, mbps, qStride, qOff,
           scale, (int)S, r0, out, cnt, minChunk, outHi, loOff);
    if (!cnt)
      LAUNCH(k_attn_combine, dim3(H, nr), DG_HD, 0, part, out, H, DG_HD, (int)S, r0, (float*)nullptr, (const int*)rowSeq.p, 0);
  }
  return NERVA_OK;
}

int attnDecodeGqa(NervaExec* ex, const float* q, Buf kc, Buf vc, float* out, Buf bt, Buf rowSeq, Buf pos, int rows, int H,
                  int KVH, int bs, int mbps, int qStride, int qOff, float scale, SplitHandoff* emit = nullptr) {
#define DG_RUN(KT, G) \
  return attnDecodeGqaRun<KT, G>(ex, q, kc, vc, out, bt, rowSeq, pos, rows, H, KVH, bs, mbps, qStride, qOff, scale, emit)
#define DG_G(KT)              \
  switch (H / KVH) {          \
    case 1: DG_RUN(KT, 1);    \
    case 2: DG_RUN(KT, 2);    \
    case 4: DG_RUN(KT, 4);    \
    default: DG_RUN(KT, 8);   \
  }
  if (kc.dt == NV_F32) {
    DG_G(float)
  }
  DG_G(uint16_t)
#undef DG_G
#undef DG_RUN
}

#include "prefill_rope.cuh"
#include "prefill_silu.cuh"

// NERVA_FLASH_PREFILL=0 keeps prefill tiles on the split-KV kernel (A/B measurements).
bool flashPrefillEnabled() {
  static const bool on = [] {
    const char* v = getenv("NERVA_FLASH_PREFILL");
    return !(v && v[0] == '0');
  }();
  return on;
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
int attnPrefillLaunch(NervaExec* ex, int hd, const float* q, Buf kc, Buf vc, Buf bt, Buf rowSeq, Buf pos, float* out,
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

#include "prefill_attn.cuh"

// Blocks of the split-KV kernel attentionRun launches (rope fused or not, headDim, lane layout)
// that fit an SM at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor, taken once per kernel).
template <typename KT>
int attnResident(bool rope, int hd, bool pair) {
  if (rope && !pair) return 1;  // never launched: the fused rope needs headDim 128 (attentionRun rejects it)
  static int cache[6] = {-1, -1, -1, -1, -1, -1};
  const int v = rope ? 0 : (hd <= 128 ? 2 : 4) + (pair ? 0 : 1);
  if (cache[v] >= 0) return cache[v];
  int n = 0;
  cudaError_t e = cudaSuccess;
  const int threads = 32 * ATT_WARPS;
  switch (v) {
    case 0: e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_attn_partial_rope<KT, ATT_WARPS, true>, threads, 0); break;
    case 2: e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_attn_partial<KT, ATT_WARPS, 4, false, true>, threads, 0); break;
    case 3: e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_attn_partial<KT, ATT_WARPS, 4, false, false>, threads, 0); break;
    case 4: e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_attn_partial<KT, ATT_WARPS, ATT_MAX_EPL, false, true>, threads, 0); break;
    default: e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_attn_partial<KT, ATT_WARPS, ATT_MAX_EPL, false, false>, threads, 0); break;
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    n = 2;  // the fused decode kernel's figure on the H100
  }
  cache[v] = std::max(1, n);
  return cache[v];
}

// decodeOnly: every row is its own sequence (op decoder_layers), see k_attn_partial.
int attentionRun(NervaExec* ex, const float* qPtr, Buf kc, Buf vc, float* outPtr, Buf bt, Buf rowSeq, Buf pos, int rows,
                 int H, int KVH, int hd, int bs, int mbps, int qStride, int qOff, float scale, int decodeOnly = 0,
                 const RopeFuse* rope = nullptr, int window = 0, float* lse = nullptr, int oneSeq = 0, int maxKeys = 0) {
  if (hd <= 0 || hd > 32 * ATT_MAX_EPL) return bad(ex, "attention: headDim must be in 1..256");
  if (KVH <= 0 || H % KVH != 0) return bad(ex, "attention: numHeads must be a multiple of numKvHeads");
  if (kc.dt != vc.dt) return bad(ex, "attention: kCache and vCache dtypes differ");
  if (window < 0) return bad(ex, "attention: window must be >= 0");
  if ((window > 0 || lse) && (decodeOnly || rope)) return bad(ex, "attention: window and lse are not for the decoder stack");
  if (rows <= 0) return NERVA_OK;
  if (ex->bf16act) {
    // Eager bf16 attention rounds the probabilities of the whole row: no partial form.
    if (lse) return bad(ex, "attention: partial attention (lse) is defined for exact numerics only");
    for (int r0 = 0; r0 < rows; r0 += 65535) {
      dim3 grid((unsigned)H, (unsigned)std::min(65535, rows - r0));
      const int *btp = (const int*)bt.p, *rsp = (const int*)rowSeq.p, *pp = (const int*)pos.p;
      switch (kc.dt) {
        case NV_F32:
          LAUNCH(k_attn_eager<float>, grid, 32 * EAGER_WARPS, 0, qPtr, (const float*)kc.p, (const float*)vc.p, btp, rsp, pp,
                 outPtr, H, KVH, hd, bs, mbps, qStride, qOff, scale, r0, window);
          break;
        case NV_BF16:
          LAUNCH(k_attn_eager<uint16_t>, grid, 32 * EAGER_WARPS, 0, qPtr, (const uint16_t*)kc.p, (const uint16_t*)vc.p, btp,
                 rsp, pp, outPtr, H, KVH, hd, bs, mbps, qStride, qOff, scale, r0, window);
          break;
        case NV_F16:
          LAUNCH(k_attn_eager<__half>, grid, 32 * EAGER_WARPS, 0, qPtr, (const __half*)kc.p, (const __half*)vc.p, btp, rsp, pp,
                 outPtr, H, KVH, hd, bs, mbps, qStride, qOff, scale, r0, window);
          break;
        default: return bad(ex, "attention: unsupported cache dtype");
      }
    }
    return NERVA_OK;
  }
  // Decode rows with the fused rope whose keys the caller bounds (maxKeys, op decoder_layers):
  // k_attn_decode_short, a cluster a KV head holding every key in shared memory, no global merge
  // (0.6B at batch 1, f32 KV, session 23: 1.05x at 384 keys, 1.06-1.08x at 512-1024 against the
  // split kernel; the 8B's four q heads a KV head measured 0.99x, so it takes G <= 2 only; one
  // row only, the case measured).
  const int saC = attnShortSetting();
  if (rope && decodeOnly && !ex->batchInv && hd == 128 && saC > 0 && maxKeys > 0 && maxKeys <= SA_MAX_KEYS &&
      rows == 1 && (H / KVH == 1 || H / KVH == 2) && (kc.dt == NV_F32 || kc.dt == NV_BF16) &&
      (kc.dt == NV_F32 ? (H == KVH ? attnShortFits<float, 1>(ex, saC) : attnShortFits<float, 2>(ex, saC))
                       : (H == KVH ? attnShortFits<uint16_t, 1>(ex, saC) : attnShortFits<uint16_t, 2>(ex, saC)))) {
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
  // Tiles of 64 rows of one sequence (prefill chunks) run on tensor cores; the split-KV kernel
  // below skips their rows. It then needs no splits for long contexts: the rows left are few.
  int flashRows = 0;
  if (!decodeOnly && !rope && rows >= PF_ROWS && (kc.dt == NV_F32 || kc.dt == NV_BF16) && (hd == 64 || hd == 128) && flashPrefillEnabled()) {
    int rc = attnPrefillTiles(ex, hd, qPtr, kc, vc, bt, rowSeq, pos, outPtr, rows, H, KVH, bs, mbps, qStride, qOff, scale,
                              window, lse, oneSeq);
    if (rc) return rc;
    flashRows = rows;
    // One sequence (the caller's promise): every tile was uniform and taken; no seam rows remain.
    if (oneSeq) return NERVA_OK;
  }
  long long maxLen = (long long)mbps * bs;
  size_t perSplit = (size_t)(hd + 2) * sizeof(float);
  const bool pair = hd % 64 == 0;  // lanes hold adjacent element pairs (attnElem)
  // Splits in whole waves of the split kernel's resident blocks (attnResident x SMs): the splits
  // of one wave (NERVA_ATTN_WAVES, default 1) when rows*heads is small; a long context that
  // needs more (at most 1024 keys a block) takes the next whole number of waves, so no wave runs a
  // few stragglers. Bounded by the workspace. H100, batch 1, same call (session 19, call 8):
  // against the old 8 blocks an SM (four waves of the fused decode kernel), the 0.6B decoded
  // 1.27x faster at a 1536-token context, 1.35x at 4000, 1.14x at 16000; the 8B 1.10x at 2000,
  // 1.09x at 6000, 1.03x at 12000 (12 splits needed: two whole waves, 16, beat 12 by 11 %, call
  // 6). Short contexts do not change (minChunk decides); more waves were slower (calls 5, 6).
  int resident = 0;
  switch (kc.dt) {
    case NV_F32: resident = attnResident<float>(rope != nullptr, hd, pair); break;
    case NV_BF16: resident = attnResident<uint16_t>(rope != nullptr, hd, pair); break;
    case NV_F16: resident = attnResident<__half>(rope != nullptr, hd, pair); break;
    default: return bad(ex, "attention: unsupported cache dtype");
  }
  const long long slots = (long long)ex->smCount * std::max(1, resident);
  const long long target = slots * attnTune().waves;
  // Batch-invariant decode: the splits (and so each row's key chunks and merge order) as for one
  // row alone, whatever the number of rows; rows go in chunks the workspace and the combine
  // counters cover, never fewer splits.
  const bool inv = ex->batchInv;
  const long long sRows = inv ? 1 : rows;
  const long long perWave = std::max<long long>(1, slots / (sRows * H));
  long long S = perWave * attnTune().waves;
  if (!flashRows) {
    const long long sMin = (maxLen + 1023) / 1024;  // long contexts: at most 1024 keys per block
    if (sMin > S) S = (sMin + perWave - 1) / perWave * perWave;
  }
  // At least minChunk keys per split: a split fewer keys than that costs more in merging than it
  // saves. (Capping S at maxLen/64 instead kept a short-context decode at 7 splits of ~55 keys,
  // 12 us per layer on the 0.6B shape.)
  // (minChunk 16 and 64 measured no better; 8 slower.)
  const int minChunk = attnTune().minChunk;
  S = std::min<long long>(S, std::max<long long>(1, (maxLen + minChunk - 1) / minChunk));
  S = std::min<long long>(S, 4096);
  int rowChunk = rows;
  if (inv) rowChunk = invRowChunk(ex, rows, H, S, perSplit);
  while (rowChunk > 1 && (size_t)rowChunk * H * S * perSplit > ex->wsBytes) {
    if (S > 1) S = std::max<long long>(1, S / 2);
    else rowChunk = (rowChunk + 1) / 2;
  }
  if ((size_t)rowChunk * H * S * perSplit > ex->wsBytes) return bad(ex, "attention: workspace too small");
  (void)maxLen;
  float* part = (float*)ex->ws;
  for (int r0 = 0; r0 < rows; r0 += rowChunk) {
    int nr = std::min(rowChunk, rows - r0);
    // Batch-invariant decode: S is a single row's split count; the blocks per row are what the
    // rows of this call need to fill the GPU, each taking every gridDim.x-th split (one row: S).
    long long sGrid = inv ? std::min<long long>(S, std::max<long long>(1, (target + (long long)nr * H - 1) / ((long long)nr * H))) : S;
    dim3 grid((unsigned)sGrid, (unsigned)H, (unsigned)nr);
    const float* qp = qPtr;
    const int *btp = (const int*)bt.p, *rsp = (const int*)rowSeq.p, *pp = (const int*)pos.p;
    // One kernel when the re-armed counters cover this chunk of rows; else a separate combine.
    int* cnt = ex->counters && (size_t)nr * H <= ex->counterCount ? ex->counters : nullptr;
    RopeFuse rf = rope ? *rope : RopeFuse();
#define ATT_K(KT, E, RP)                                                                                               \
  if (pair) {                                                                                                           \
    ATT_KP(KT, E, RP, true);                                                                                           \
  } else {                                                                                                             \
    ATT_KP(KT, E, RP, false);                                                                                          \
  }
#define ATT_KP(KT, E, RP, PR)                                                                                          \
  LAUNCH((k_attn_partial<KT, ATT_WARPS, E, RP, PR>), grid, 32 * ATT_WARPS, 0, qp, (const KT*)kc.p, (const KT*)vc.p, btp, rsp, pp, \
         part, H, KVH, hd, bs, mbps, qStride, qOff, scale, minChunk, (int)S, r0, outPtr, cnt, decodeOnly, rf, window, lse, \
         flashRows)
#define ATT_KR(KT)                                                                                                     \
  if (pair) {                                                                                                          \
    LAUNCH((k_attn_partial_rope<KT, ATT_WARPS, true>), grid, 32 * ATT_WARPS, 0, qp, (const KT*)kc.p, (const KT*)vc.p, btp, \
           rsp, pp, part, H, KVH, hd, bs, mbps, qStride, qOff, scale, minChunk, (int)S, r0, outPtr, cnt, decodeOnly, rf,   \
           window, lse, flashRows);                                                                                    \
  } else {                                                                                                             \
    return bad(ex, "attention: the fused rope needs headDim 128");                                                     \
  }
#define ATT_KT(KT)                     \
  if (rope) {                          \
    ATT_KR(KT)                         \
  } else if (hd <= 128) {              \
    ATT_K(KT, 4, false)                \
  } else {                             \
    ATT_K(KT, ATT_MAX_EPL, false)      \
  }
    switch (kc.dt) {
      case NV_F32: ATT_KT(float) break;
      case NV_BF16: ATT_KT(uint16_t) break;
      case NV_F16: ATT_KT(__half) break;
      default: return bad(ex, "attention: unsupported cache dtype");
    }
#undef ATT_KT
#undef ATT_KR
#undef ATT_K
#undef ATT_KP
    if (!cnt)
      LAUNCH(k_attn_combine, dim3(H, nr), ((std::min(hd, 256) + 31) / 32) * 32, 0, part, outPtr, H, hd, (int)S, r0, lse, rsp, flashRows);
  }
  return NERVA_OK;
}

int opAttention(NervaExec* ex, Args& A) {
  Buf q = buf(A), kc = buf(A), vc = buf(A), out = buf(A), bt = buf(A), rowSeq = buf(A), pos = buf(A);
  int rows = A.num(), H = A.num(), KVH = A.num(), hd = A.num(), bs = A.num(), mbps = A.num(), qStride = A.num(),
      qOff = A.num();
  float scale = (float)A.next();
  int window = A.num();
  Buf lse = buf(A);
  int oneSeq = A.num();
  if (!A.ok) return bad(ex, "attention: argument count");
  return attentionRun(ex, (const float*)q.p, kc, vc, (float*)out.p, bt, rowSeq, pos, rows, H, KVH, hd, bs, mbps, qStride,
                      qOff, scale, 0, nullptr, window, (float*)lse.p, oneSeq);
}

int opAttentionMerge(NervaExec* ex, Args& A) {
  Buf out = buf(A), lse = buf(A), other = buf(A), otherLse = buf(A);
  int rows = A.num(), H = A.num(), hd = A.num();
  if (!A.ok) return bad(ex, "attention_merge: argument count");
  if (rows <= 0 || H <= 0 || hd <= 0) return NERVA_OK;
  for (int r0 = 0; r0 < rows; r0 += 65535) {
    int nr = std::min(65535, rows - r0);
    size_t o = (size_t)r0 * H;
    LAUNCH(k_attn_merge, dim3(H, nr), ((std::min(hd, 256) + 31) / 32) * 32, 0, (float*)out.p + o * hd, (float*)lse.p + o,
           (const float*)other.p + o * hd, (const float*)otherLse.p + o, H, hd);
  }
  return NERVA_OK;
}

int ropeAppendRun(NervaExec* ex, float* qkv, Buf pos, Buf inv, Buf slots, Buf kc, Buf vc, Buf qn, Buf kn, int rows, int nq,
                  int nkv, int hd, int rowStride, float eps) {
  if (hd % 2 != 0 || hd > 2048) return bad(ex, "rope_append: headDim must be even and at most 2048");
  if (kc.dt != vc.dt) return bad(ex, "rope_append: kCache and vCache dtypes differ");
  if (qn.p && kn.p && qn.dt != kn.dt) return bad(ex, "rope_append: qNorm and kNorm dtypes differ");
  if (rows <= 0) return NERVA_OK;
  int ndt = qn.p ? qn.dt : kn.dt;
  LAUNCH(k_rope_append, dim3(rows, nq + nkv), ((hd / 2 + 31) / 32) * 32, 0, qkv, (const int*)pos.p, (const float*)inv.p,
         qn.p, kn.p, ndt, nq, hd, rowStride, eps, (const int*)slots.p, kc.p, vc.p, kc.dt, nkv, ex->bf16act ? 1 : 0);
  return NERVA_OK;
}

int opMoeMlp(NervaExec* ex, Args& A) {
  Buf x = buf(A), ids = buf(A), tw = buf(A), gu = buf(A), down = buf(A), out = buf(A);
  int rows = A.num(), hidden = A.num(), inter = A.num(), K = A.num();
  if (!A.ok) return bad(ex, "moe_mlp: argument count");
  if (gu.dt != down.dt) return bad(ex, "moe_mlp: gateUp and down dtypes differ");
  if (rows <= 0) return NERVA_OK;
  size_t perRow = (size_t)K * inter * sizeof(float);
  int rowChunk = (int)std::min<size_t>((size_t)rows, ex->wsBytes / perRow);
  if (rowChunk < 1) return bad(ex, "moe_mlp: workspace too small");
  rowChunk = std::min(rowChunk, 65535 / std::max(1, K));
  float* h = (float*)ex->ws;
  for (int r0 = 0; r0 < rows; r0 += rowChunk) {
    int nr = std::min(rowChunk, rows - r0);
    LAUNCH(k_moe_gate_up, dim3((inter + 3) / 4, nr * K), 128, 0, (const float*)x.p, (const int*)ids.p, gu.p, gu.dt, h,
           hidden, inter, K, r0, ex->bf16act ? 1 : 0);
    LAUNCH(k_moe_down, dim3((hidden + 3) / 4, nr), 128, 0, h, (const int*)ids.p, (const float*)tw.p, down.p, down.dt,
           (float*)out.p, hidden, inter, K, r0, ex->bf16act ? 1 : 0);
  }
  return NERVA_OK;
}

// Blocks a cluster of k_sample_cluster: NERVA_SAMPLE_CLUSTER (0: k_sample's blocks with a last-
// arriving merge; 4, 8 or 16), default 8; 0 where clusters of that size cannot run (before sm_90).
// Asked once per process.
int sampleClusterSize() {
  static int v = -1;
  if (v >= 0) return v;
  const char* e = getenv("NERVA_SAMPLE_CLUSTER");
  int c = e && *e ? atoi(e) : 8;
  if ((c != 4 && c != 8 && c != 16) || c > SAMPLE_MAX_CLUSTER) c = 0;
  if (c > 0) {
    ClusterLaunch L(dim3((unsigned)c, 1, 1), 1024, 0, c, nullptr, false);
    int clusters = 0;
    if ((c > 8 && cudaFuncSetAttribute(k_sample_cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) ||
        cudaOccupancyMaxActiveClusters(&clusters, k_sample_cluster, &L.cfg) != cudaSuccess) {
      cudaGetLastError();
      clusters = 0;
    }
    if (clusters <= 0) c = 0;
  }
  v = c;
  return v;
}

int launchRingPush(NervaExec* ex, const int* src, int* ring, int* cursor, int rows, int cap) {
  const int pre = ex->sinceRingPush >= 3 && ringPushEarly() ? 1 : 0;
  LAUNCH(k_ring_push, 1, std::min(1024, ((rows + 31) / 32) * 32), 0, src, ring, cursor, rows, cap, pre);
  ex->sinceRingPush = 0;
  return NERVA_OK;
}

int launchAdvance(NervaExec* ex, int* pos, int* slots, const int* bt, const int* rowSeq, int rows, int bs, int mbps) {
  LAUNCH(k_advance_positions, (rows + 127) / 128, 128, 0, pos, slots, bt, rowSeq, rows, bs, mbps);
  ex->sinceRingPush = 0;
  return NERVA_OK;
}

// Op sample, then (where given) its push (op ring_push of out) and advance (op
// advance_positions): in k_sample_cluster's block 0 for one greedy-or-sampled row on the cluster
// path (a decode step's tail in one kernel), else as those ops' kernels after it.
int opSample(NervaExec* ex, Args& A) {
  Buf logits = buf(A), params = buf(A), rng = buf(A), out = buf(A);
  int rows = A.num(), vocab = A.num();
  const int hasPush = A.num();
  Buf ring{}, cursor{};
  int cap = 1;
  if (hasPush) {
    ring = buf(A);
    cursor = buf(A);
    cap = A.num();
  }
  const int hasAdvance = A.num();
  Buf pos{}, slots{}, bt{}, rowSeq{};
  int bs = 1, mbps = 1;
  if (hasAdvance) {
    pos = buf(A);
    slots = buf(A);
    bt = buf(A);
    rowSeq = buf(A);
    bs = A.num();
    mbps = A.num();
  }
  if (!A.ok) return bad(ex, "sample: argument count");
  if (hasPush && cap <= 0) return bad(ex, "sample: push capacity must be positive");
  if (hasAdvance && (bs <= 0 || mbps <= 0)) return bad(ex, "sample: advance blockSize and maxBlocksPerSeq must be positive");
  if (rows <= 0) return NERVA_OK;
  size_t perRow = align256((size_t)vocab * sizeof(double));
  int rowChunk = (int)std::min<size_t>((size_t)rows, ex->wsBytes / perRow);
  if (rowChunk < 1) return bad(ex, "sample: workspace too small for one row of float64 probabilities");
  rowChunk = std::min(rowChunk, 65535);
  // Greedy rows split the vocabulary over G blocks of ~4096 logits (4 per thread) when the
  // re-armed counters cover the rows; a single block over 151,936 logits was a serial tail.
  int G = std::min(128, std::max(1, (vocab + 4095) / 4096));
  // Greedy rows as one cluster a row where clusters run (sampleClusterSize).
  const int C = vocab % 4 == 0 && ((uintptr_t)logits.p & 15) == 0 ? sampleClusterSize() : 0;
  // One row on the cluster path: the tail runs in the sampling kernel.
  const bool fold = C > 0 && rows == 1 && (hasPush || hasAdvance) && sampleTailFold();
  SampleTail tail;
  if (fold) {
    if (hasPush) {
      tail.ring = (int*)ring.p;
      tail.cursor = (int*)cursor.p;
      tail.capacity = cap;
    }
    if (hasAdvance) {
      tail.positions = (int*)pos.p;
      tail.slots = (int*)slots.p;
      tail.bt = (const int*)bt.p;
      tail.rowSeq = (const int*)rowSeq.p;
      tail.blockSize = bs;
      tail.mbps = mbps;
    }
    tail.pre = ex->sinceRingPush >= 3 && ringPushEarly() ? 1 : 0;
  }
  for (int r0 = 0; r0 < rows; r0 += rowChunk) {
    int nr = std::min(rowChunk, rows - r0);
    if (C > 0) {
      ClusterLaunch L(dim3((unsigned)C, (unsigned)nr, 1), 1024, 0, C, ex->stream, ex->pdl);
      cudaError_t e = cudaLaunchKernelEx(&L.cfg, k_sample_cluster, (const float*)logits.p, (const float*)params.p, (int*)rng.p,
                                         (int*)out.p, vocab, (double*)ex->ws, perRow / sizeof(double), r0, tail);
      int rc = check(ex, "k_sample_cluster", e);
      if (rc) return rc;
      if (ex->sinceRingPush < (1u << 20)) ex->sinceRingPush++;
      continue;
    }
    int g = ex->counters && (size_t)nr <= ex->counterCount ? G : 1;
    LAUNCH(k_sample, dim3(g, nr), 1024, 0, (const float*)logits.p, (const float*)params.p, (int*)rng.p, (int*)out.p,
           vocab, (double*)ex->ws, perRow / sizeof(double), r0, g > 1 ? ex->counters : (int*)nullptr);
  }
  if (fold) {
    ex->sinceRingPush = 0;
    return NERVA_OK;
  }
  if (hasPush) {
    int rc = launchRingPush(ex, (const int*)out.p, (int*)ring.p, (int*)cursor.p, rows, cap);
    if (rc) return rc;
  }
  if (hasAdvance) return launchAdvance(ex, (int*)pos.p, (int*)slots.p, (const int*)bt.p, (const int*)rowSeq.p, rows, bs, mbps);
  return NERVA_OK;
}

#include "decoder_layers.cuh"

}  // namespace

// Device timeline (NERVA_TRACE builds): the per-SM rings, allocated at the first launch (before
// any graph capture) and written to $NERVA_DEVICE_TRACE by nerva_trace_dump.
#ifdef NERVA_TRACE
namespace {
constexpr unsigned TRACE_CAP = 8192;  // records a SM keeps (the newest)
constexpr unsigned TRACE_SMS = 256;
unsigned long long* traceBuf = nullptr;
unsigned* traceCount = nullptr;
void traceInit() {
  if (traceBuf) return;
  cudaMalloc(&traceBuf, (size_t)TRACE_SMS * TRACE_CAP * 6 * 8);
  cudaMalloc(&traceCount, TRACE_SMS * 4);
  cudaMemset(traceCount, 0, TRACE_SMS * 4);
  cudaMemset(traceBuf, 0, (size_t)TRACE_SMS * TRACE_CAP * 6 * 8);
  unsigned cap = TRACE_CAP;
  cudaMemcpyToSymbol(g_tr, &traceBuf, sizeof(traceBuf));
  cudaMemcpyToSymbol(g_trCount, &traceCount, sizeof(traceCount));
  cudaMemcpyToSymbol(g_trCap, &cap, sizeof(cap));
  cudaDeviceSynchronize();
}
}  // namespace
#endif

void nerva_trace_dump() {
#ifdef NERVA_TRACE
  const char* path = getenv("NERVA_DEVICE_TRACE");
  if (!traceBuf || !path) return;
  cudaDeviceSynchronize();
  std::vector<unsigned long long> recs((size_t)TRACE_SMS * TRACE_CAP * 6);
  std::vector<unsigned> counts(TRACE_SMS);
  cudaMemcpy(recs.data(), traceBuf, recs.size() * 8, cudaMemcpyDeviceToHost);
  cudaMemcpy(counts.data(), traceCount, TRACE_SMS * 4, cudaMemcpyDeviceToHost);
  FILE* f = fopen(path, "wb");
  if (!f) return;
  fwrite(&TRACE_CAP, 4, 1, f);
  fwrite(counts.data(), 4, TRACE_SMS, f);
  fwrite(recs.data(), 8, recs.size(), f);
  fclose(f);
  fprintf(stderr, "[nerva] device trace written to %s\n", path);
#endif
}

int nerva_decode_short_keys(const NervaExec* ex) {
  if (ex->bf16act || ex->persistentDecoder || ex->batchInv || attnShortSetting() == 0) return 0;
  int dev = 0, clusters = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters ? SA_MAX_KEYS : 0;
}

int nerva_launch(NervaExec* ex, int op, const double* args, int nargs) {
#ifdef NERVA_TRACE
  traceInit();
#endif
  Args A{args, nargs};
  ex->errCall[0] = 0;
  switch (op) {
    case OP_EMBEDDING: {
      Buf table = buf(A), ids = buf(A), out = buf(A);
      int rows = A.num(), hidden = A.num();
      if (!A.ok) return bad(ex, "embedding: argument count");
      if (rows <= 0) return NERVA_OK;
      LAUNCH(k_embedding, rows, 256, 0, table.p, table.dt, (const int*)ids.p, (float*)out.p, hidden, ex->bf16act ? 1 : 0);
      return NERVA_OK;
    }
    case OP_RMSNORM: {
      Buf x = buf(A), w = buf(A), out = buf(A), res = buf(A);
      int rows = A.num(), dim = A.num();
      float eps = (float)A.next();
      if (!A.ok) return bad(ex, "rmsnorm: argument count");
      if (rows <= 0) return NERVA_OK;
      // A bf16 out (capabilities.bf16Activations): the values rounded to bf16 as they are stored.
      const bool bf = out.dt == NV_BF16;
      LAUNCH(k_rmsnorm, rows, std::min(1024, ((dim + 31) / 32) * 32), 0, (const float*)x.p, w.p, w.dt,
             bf ? (float*)nullptr : (float*)out.p, (float*)res.p, dim, eps, ex->bf16act ? 1 : 0,
             bf ? (uint16_t*)out.p : (uint16_t*)nullptr, (uint16_t*)nullptr);
      return NERVA_OK;
    }
    case OP_MATMUL: return opMatmul(ex, A);
    case OP_ROPE: {
      Buf x = buf(A), pos = buf(A), inv = buf(A), nw = buf(A);
      int rows = A.num(), heads = A.num(), hd = A.num(), rowStride = A.num(), headOffset = A.num();
      float eps = (float)A.next();
      if (!A.ok) return bad(ex, "rope: argument count");
      if (hd % 2 != 0 || hd > 2048) return bad(ex, "rope: headDim must be even and at most 2048");
      if (rows <= 0 || heads <= 0) return NERVA_OK;
      LAUNCH(k_rope, dim3(rows, heads), ((hd / 2 + 31) / 32) * 32, 0, (float*)x.p, (const int*)pos.p, (const float*)inv.p, nw.p, nw.dt, hd,
             rowStride, headOffset, eps, ex->bf16act ? 1 : 0);
      return NERVA_OK;
    }
    case OP_KV_APPEND: {
      Buf src = buf(A), kc = buf(A), vc = buf(A), slots = buf(A);
      int rows = A.num(), kvh = A.num(), hd = A.num(), rowStride = A.num(), kOff = A.num(), vOff = A.num();
      if (!A.ok) return bad(ex, "kv_append: argument count");
      if (kc.dt != vc.dt) return bad(ex, "kv_append: kCache and vCache dtypes differ");
      if (rows <= 0) return NERVA_OK;
      LAUNCH(k_kv_append, rows, 256, 0, (const float*)src.p, kc.p, vc.p, kc.dt, (const int*)slots.p, kvh * hd, rowStride,
             kOff, vOff);
      return NERVA_OK;
    }
    case OP_ATTENTION: return opAttention(ex, A);
    case OP_SILU_MUL: {
      Buf x = buf(A), out = buf(A);
      int rows = A.num(), dim = A.num();
      if (!A.ok) return bad(ex, "silu_mul: argument count");
      size_t n = (size_t)rows * dim;
      if (n == 0) return NERVA_OK;
      if (out.dt == NV_BF16) {  // capabilities.bf16Activations
        if (siluMulRowsFits(rows, dim) && ((uintptr_t)x.p & 15) == 0 && ((uintptr_t)out.p & 7) == 0)
          return siluMulRowsRun(ex, (const float*)x.p, (uint16_t*)out.p, rows, dim);
        LAUNCH(k_silu_mul_bf16, gridFor(n, 256, ex->smCount), 256, 0, (const float*)x.p, (uint16_t*)out.p, rows, dim, ex->bf16act ? 1 : 0);
        return NERVA_OK;
      }
      if (siluMulRowsFits(rows, dim) && ((uintptr_t)x.p & 15) == 0 && ((uintptr_t)out.p & 15) == 0)
        return siluMulRowsRun(ex, (const float*)x.p, (float*)out.p, rows, dim);
      LAUNCH(k_silu_mul, gridFor(n, 256, ex->smCount), 256, 0, (const float*)x.p, (float*)out.p, rows, dim, ex->bf16act ? 1 : 0);
      return NERVA_OK;
    }
    case OP_ADD: {
      Buf a = buf(A), b = buf(A), out = buf(A);
      double len = A.next();
      if (!A.ok) return bad(ex, "add: argument count");
      size_t n = (size_t)len;
      if (n == 0) return NERVA_OK;
      LAUNCH(k_add, gridFor(n, 256, ex->smCount), 256, 0, (const float*)a.p, (const float*)b.p, (float*)out.p, n, ex->bf16act ? 1 : 0);
      return NERVA_OK;
    }
    case OP_GATHER_ROWS: {
      Buf x = buf(A), idx = buf(A), out = buf(A);
      int n = A.num(), dim = A.num();
      if (!A.ok) return bad(ex, "gather_rows: argument count");
      if (n <= 0) return NERVA_OK;
      size_t eb = (x.dt == NV_BF16 || x.dt == NV_F16) ? 2 : 4;
      LAUNCH(k_gather_rows, n, 256, 0, (const char*)x.p, (const int*)idx.p, (char*)out.p, (size_t)dim * eb);
      return NERVA_OK;
    }
    case OP_MOE_ROUTE: {
      Buf logits = buf(A), ids = buf(A), tw = buf(A);
      int rows = A.num(), E = A.num(), K = A.num(), norm = A.num();
      if (!A.ok) return bad(ex, "moe_route: argument count");
      if (K > 32 || K > E) return bad(ex, "moe_route: topK must be <= 32 and <= numExperts");
      if ((size_t)E * 4 * sizeof(float) > 48 * 1024) return bad(ex, "moe_route: too many experts (max 3072)");
      if (rows <= 0) return NERVA_OK;
      LAUNCH(k_moe_route, (rows + 3) / 4, 128, (size_t)E * 4 * sizeof(float), (const float*)logits.p, (int*)ids.p,
             (float*)tw.p, rows, E, K, norm, ex->bf16act ? 1 : 0);
      return NERVA_OK;
    }
    case OP_MOE_MLP: return opMoeMlp(ex, A);
    case OP_ARGMAX: {
      Buf logits = buf(A), out = buf(A);
      int rows = A.num(), vocab = A.num();
      if (!A.ok) return bad(ex, "argmax: argument count");
      if (rows <= 0) return NERVA_OK;
      LAUNCH(k_argmax, rows, 1024, 0, (const float*)logits.p, (int*)out.p, vocab);
      return NERVA_OK;
    }
    case OP_SAMPLE: return opSample(ex, A);
    case OP_RING_PUSH: {
      Buf src = buf(A), ring = buf(A), cursor = buf(A);
      int rows = A.num(), cap = A.num();
      if (!A.ok) return bad(ex, "ring_push: argument count");
      if (cap <= 0) return bad(ex, "ring_push: capacity must be positive");
      if (rows <= 0) return NERVA_OK;
      return launchRingPush(ex, (const int*)src.p, (int*)ring.p, (int*)cursor.p, rows, cap);
    }
    case OP_ADVANCE_POSITIONS: {
      Buf pos = buf(A), slots = buf(A), bt = buf(A), rowSeq = buf(A);
      int rows = A.num(), bs = A.num(), mbps = A.num();
      if (!A.ok) return bad(ex, "advance_positions: argument count");
      if (rows <= 0) return NERVA_OK;
      return launchAdvance(ex, (int*)pos.p, (int*)slots.p, (const int*)bt.p, (const int*)rowSeq.p, rows, bs, mbps);
    }
    case OP_FUSED_MATMUL: return opFusedMatmul(ex, A);
    case OP_ROPE_APPEND: {
      Buf x = buf(A), pos = buf(A), inv = buf(A), slots = buf(A), kc = buf(A), vc = buf(A), qn = buf(A), kn = buf(A);
      int rows = A.num(), nq = A.num(), nkv = A.num(), hd = A.num(), rowStride = A.num();
      float eps = (float)A.next();
      if (!A.ok) return bad(ex, "rope_append: argument count");
      if (rows > 0 && ropeAppendRowsFits(rows, hd))
        return ropeAppendRowsRun(ex, (float*)x.p, pos, inv, slots, kc, vc, qn, kn, rows, nq, nkv, hd, rowStride, eps);
      return ropeAppendRun(ex, (float*)x.p, pos, inv, slots, kc, vc, qn, kn, rows, nq, nkv, hd, rowStride, eps);
    }
    case OP_DECODER_LAYERS: return opDecoderLayers(ex, A);
    case OP_ATTENTION_MERGE: return opAttentionMerge(ex, A);
    default: return bad(ex, "unknown op code");
  }
}

bool nerva_pdl_compiled() {
  // griddepcontrol exists only in code compiled for compute_90+; PTX of an older arch JIT-ed
  // onto a Hopper would launch early without waiting, so PDL needs the kernels' own PTX >= 9.0.
  cudaFuncAttributes a;
  if (cudaFuncGetAttributes(&a, k_add) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.ptxVersion >= 90;
}

int nerva_copy_bandwidth(size_t bytes, int iters, double* gbps, uint64_t* allocs, uint64_t* frees) {
  void *a = nullptr, *b = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaError_t e = cudaMalloc(&a, bytes);
  if (e == cudaSuccess) {
    (*allocs)++;
    e = cudaMalloc(&b, bytes);
    if (e == cudaSuccess) (*allocs)++;
  }
  if (e == cudaSuccess) e = cudaEventCreate(&e0);
  if (e == cudaSuccess) e = cudaEventCreate(&e1);
  if (e == cudaSuccess) e = cudaMemset(a, 1, bytes);
  if (e == cudaSuccess) e = cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);  // warm-up
  if (e == cudaSuccess) e = cudaEventRecord(e0, 0);
  for (int i = 0; i < iters && e == cudaSuccess; i++) e = cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, 0);
  if (e == cudaSuccess) e = cudaEventRecord(e1, 0);
  if (e == cudaSuccess) e = cudaEventSynchronize(e1);
  float ms = 0;
  if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, e1);
  if (e == cudaSuccess) *gbps = 2.0 * (double)bytes * iters / (ms * 1e-3) / 1e9;
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (a) {
    cudaFree(a);
    (*frees)++;
  }
  if (b) {
    cudaFree(b);
    (*frees)++;
  }
  return (int)e;
}

// The host channel's stage and wait kernels (host_channel.h).
#include "host_channel.cuh"
