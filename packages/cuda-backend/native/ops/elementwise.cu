// Element-wise and row ops: embedding, rmsnorm, rope, kv_append, rope_append, silu_mul, add,
// gather_rows (kernels and launchers).
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/ops.h"

namespace nerva::ops {

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

// Elements of a row a k_rmsnorm thread loads before it uses the first: 8 at up to 512 threads a
// block, 4 above. At 1024 the kernel must fit 32 registers for two blocks to share an SM: at 48,
// one block an SM waited out its loads alone and a 4096-row prefill's residual norm ran at a third
// of the copy bandwidth (12.3 ms of the 8B's prefill, now 6.1). Every element is still summed in
// the one-at-a-time loop's order: the unroll changes no bit.
template <int U>
constexpr int rmsMaxThreads() {
  return U <= 4 ? 1024 : 512;
}

// A thread's remaining elements of row r, i, i + B, ... (those of U below dim), loaded together
// (one at a time, each load would wait for the residual store before it, which it may alias), x +
// residual written back to the residual, into v (zero past dim); each square added to ss in
// ascending order, as the one-at-a-time loop adds them.
template <int U, class In>
__device__ __forceinline__ void rmsGatherTail(const In& x, float* rr, int r, int i, int B, int dim, int bfa, float (&v)[U],
                                              float& ss) {
  float q[U];
  typename In::Raw a[U];
#pragma unroll
  for (int u = 0; u < U; u++)
    if (i + u * B < dim) a[u] = x.load(r, i + u * B);
  if (rr) {
#pragma unroll
    for (int u = 0; u < U; u++) q[u] = i + u * B < dim ? rr[i + u * B] : 0.f;
  }
#pragma unroll
  for (int u = 0; u < U; u++) v[u] = i + u * B < dim ? x.finish(a[u], i + u * B) : 0.f;
  if (rr) {
#pragma unroll
    for (int u = 0; u < U; u++)
      if (i + u * B < dim) {
        v[u] = bfr(v[u] + q[u], bfa);
        rr[i + u * B] = v[u];
      }
  }
#pragma unroll
  for (int u = 0; u < U; u++)
    if (i + u * B < dim) ss += v[u] * v[u];
}

// RMSNorm, a block a row: with `residual`, x + residual first (written back to residual, the
// norm's input); then out = norm(x) * w, or with hi (lo optional) that value's bf16 split
// (storeSplit: x = hi + lo, a tensor-core GEMM's operand keeping ~16 bits of its mantissa). x is
// In's rows: FloatRows, or a GemmSum (with residual: a deferred accumulate epilogue applied here).
template <int RMS_UNROLL, class In>
__global__ void __launch_bounds__(rmsMaxThreads<RMS_UNROLL>(), 2) k_rmsnorm(In x, const void* w, int wdt, float* out,
                                                                             float* residual, int dim, float eps, int bfa,
                                                                             uint16_t* hi, uint16_t* lo) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  __shared__ float sh[32];
  int r = blockIdx.x;
  float* rr = residual ? residual + (size_t)r * dim : nullptr;
  // Each thread's elements i = tid, tid + B, ... in ascending order, RMS_UNROLL of them loaded
  // (x's and the residual's) before any is used: a row of 4096 at 256 threads otherwise waits out 16 load latencies one
  // after the other (12 us a call). The sum's order, and so every bit, is the one-at-a-time loop's.
  const int B = blockDim.x;
  float ss = 0.f;
  int i = threadIdx.x;
  for (; i + (RMS_UNROLL - 1) * B < dim; i += RMS_UNROLL * B) {
    float v[RMS_UNROLL], q[RMS_UNROLL];
    typename In::Raw a[RMS_UNROLL];
#pragma unroll
    for (int u = 0; u < RMS_UNROLL; u++) a[u] = x.load(r, i + u * B);
    if (rr) {
#pragma unroll
      for (int u = 0; u < RMS_UNROLL; u++) q[u] = rr[i + u * B];
    }
#pragma unroll
    for (int u = 0; u < RMS_UNROLL; u++) v[u] = x.finish(a[u], i + u * B);
    if (rr) {
#pragma unroll
      for (int u = 0; u < RMS_UNROLL; u++) {
        v[u] = bfr(v[u] + q[u], bfa);
        rr[i + u * B] = v[u];
      }
    }
#pragma unroll
    for (int u = 0; u < RMS_UNROLL; u++) ss += v[u] * v[u];
  }
  // Fewer than RMS_UNROLL left: loaded together too.
  if (i < dim) {
    float v[RMS_UNROLL];
    rmsGatherTail(x, rr, r, i, B, dim, bfa, v, ss);
  }
  ss = blockSum(ss, sh);
  float inv = rsqrtf(ss / (float)dim + eps);
  auto src = [&](int j) { return rr ? rr[j] : x.finish(x.load(r, j), j); };
  auto put = [&](int j, float s, float wv) {
    const float v = bfr(bfr(s * inv, bfa) * wv, bfa);
    if (hi)
      storeSplit(v, hi, lo, (size_t)r * dim + j);
    else
      out[(size_t)r * dim + j] = v;
  };
  i = threadIdx.x;
  for (; i + (RMS_UNROLL - 1) * B < dim; i += RMS_UNROLL * B) {
    float sv[RMS_UNROLL], wv[RMS_UNROLL];
#pragma unroll
    for (int u = 0; u < RMS_UNROLL; u++) {
      sv[u] = src(i + u * B);
      wv[u] = ldf(w, wdt, i + u * B);
    }
#pragma unroll
    for (int u = 0; u < RMS_UNROLL; u++) put(i + u * B, sv[u], wv[u]);
  }
  if (i < dim) {
    float sv[RMS_UNROLL], wv[RMS_UNROLL];
#pragma unroll
    for (int u = 0; u < RMS_UNROLL; u++)
      if (i + u * B < dim) {
        sv[u] = src(i + u * B);
        wv[u] = ldf(w, wdt, i + u * B);
      }
#pragma unroll
    for (int u = 0; u < RMS_UNROLL; u++)
      if (i + u * B < dim) put(i + u * B, sv[u], wv[u]);
  }
}

// k_rmsnorm for a row of at most U elements a thread (decode rows: up to 256 threads) with f32
// or bf16 weights: the row stays in registers between the sum and the scaling (no second read of
// the residual or of x), and with wFirst (w is a weight, written by no kernel of the stream) the
// thread's norm weights are loaded before the PDL wait, under the previous kernel's tail. The
// same arithmetic in the same order as k_rmsnorm (the same thread owns the same elements): the
// same bits.
template <int U, class In>
__global__ void __launch_bounds__(256, 2) k_rmsnorm_row(In x, const void* w, int wbf, float* out, float* residual, int dim,
                                                        float eps, int bfa, uint16_t* hi, uint16_t* lo, int wFirst) {
  NERVA_TRACE_KERNEL();
  __shared__ float sh[32];
  const int r = blockIdx.x, B = blockDim.x, i = threadIdx.x;
  float* rr = residual ? residual + (size_t)r * dim : nullptr;
  auto ldw = [&](int j) { return wbf ? bf2f(((const uint16_t*)w)[j]) : ((const float*)w)[j]; };
  float wv[U];
  if (wFirst) {
#pragma unroll
    for (int u = 0; u < U; u++) wv[u] = i + u * B < dim ? ldw(i + u * B) : 0.f;
  }
  PDL_ENTER();
  float v[U], ss = 0.f;
  rmsGatherTail(x, rr, r, i, B, dim, bfa, v, ss);
  ss = blockSum(ss, sh);
  const float inv = rsqrtf(ss / (float)dim + eps);
  if (!wFirst) {
#pragma unroll
    for (int u = 0; u < U; u++) wv[u] = i + u * B < dim ? ldw(i + u * B) : 0.f;
  }
#pragma unroll
  for (int u = 0; u < U; u++)
    if (i + u * B < dim) {
      const float o = bfr(bfr(v[u] * inv, bfa) * wv[u], bfa);
      if (hi)
        storeSplit(o, hi, lo, (size_t)r * dim + i + u * B);
      else
        out[(size_t)r * dim + i + u * B] = o;
    }
}

// k_rmsnorm's 1024-thread form over rows of U * 1024 elements (op rmsnorm over a prompt) with a
// row in 256 threads: lane l of warp w holds the elements of k_rmsnorm's threads (4w + k) * 32 + l,
// k < 4, so each of those threads' sums runs in its order, the four butterflies are its warps', and
// the 32 warp sums meet in blockSum's order: the same bits. The row stays in registers (no second
// read), every element at a constant offset from the lane's first: 40 registers, six rows an SM.
// k_rmsnorm's blocks, two an SM, waited out a row's loads, sum and stores one after another (a
// 4096-row norm of the 8B ran at ~0.4 of the copy bandwidth).
template <int U, bool RES>
__global__ void __launch_bounds__(256, 6) k_rmsnorm_rows(const float* x, const void* w, int wdt, float* out, float* residual,
                                                         float eps, int bfa, uint16_t* hi, uint16_t* lo) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  constexpr int E = 4, B = 1024, dim = U * B;
  __shared__ float sh[32];
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  const int first = wp * E * 32 + lane;  // element (k, u) of this lane: first + k * 32 + u * B
  const size_t row = (size_t)blockIdx.x * dim + first;
  float v[E][U];
#pragma unroll
  for (int k = 0; k < E; k++)
#pragma unroll
    for (int u = 0; u < U; u++) v[k][u] = x[row + k * 32 + u * B];
  if (RES) {
    float q[E][U];
#pragma unroll
    for (int k = 0; k < E; k++)
#pragma unroll
      for (int u = 0; u < U; u++) q[k][u] = residual[row + k * 32 + u * B];
#pragma unroll
    for (int k = 0; k < E; k++)
#pragma unroll
      for (int u = 0; u < U; u++) {
        v[k][u] = bfr(v[k][u] + q[k][u], bfa);
        residual[row + k * 32 + u * B] = v[k][u];
      }
  }
  float ss[E];
#pragma unroll
  for (int k = 0; k < E; k++) {
    ss[k] = 0.f;
#pragma unroll
    for (int u = 0; u < U; u++) ss[k] += v[k][u] * v[k][u];
  }
#pragma unroll
  for (int k = 0; k < E; k++)
    for (int o = 16; o > 0; o >>= 1) ss[k] += __shfl_xor_sync(0xffffffffu, ss[k], o);
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < E; k++) sh[wp * E + k] = ss[k];
  }
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < 32; i++) t += sh[i];
  const float inv = rsqrtf(t / (float)dim + eps);
#pragma unroll
  for (int k = 0; k < E; k++)
#pragma unroll
    for (int u = 0; u < U; u++) {
      const float o = bfr(bfr(v[k][u] * inv, bfa) * ldf(w, wdt, first + k * 32 + u * B), bfa);
      if (hi)
        storeSplit(o, hi, lo, row + k * 32 + u * B);
      else
        out[row + k * 32 + u * B] = o;
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
// row; a k-head block also stores its rotated key and the matching value head in the cache. The
// row's values come from In: x itself (FloatRows), or the GEMM output whose epilogue would have
// written x (GemmSum; x then gets the rotated q and k, not the values).
template <class In>
__global__ void k_rope_append(In src, float* x, const int* positions, const float* invFreq, const void* qn, const void* kn,
                              int ndt, int nq, int headDim, int rowStride, float eps, const int* slots, void* kc, void* vc,
                              int cdt, int nkv, int bfa) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  __shared__ float sh[32];
  int r = blockIdx.x, h = blockIdx.y, i = threadIdx.x, half = headDim / 2;
  bool isK = h >= nq;
  const void* nw = isK ? kn : qn;
  bool act = i < half;
  const int col = h * headDim;  // k heads follow the q heads
  float* base = x + (size_t)r * rowStride + col;
  typename In::Raw la{}, lb{};
  if (act) {
    la = src.load(r, col + i);
    lb = src.load(r, col + i + half);
  }
  float a = act ? src.finish(la, col + i) : 0.f, b = act ? src.finish(lb, col + i + half) : 0.f;
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
  const int vcol = col + nkv * headDim;  // value head kh sits nkv heads after key head kh
  const typename In::Raw v0 = src.load(r, vcol + i), v1 = src.load(r, vcol + i + half);
  stf(vc, cdt, c0 + i, src.finish(v0, vcol + i));
  stf(vc, cdt, c0 + i + half, src.finish(v1, vcol + i + half));
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

// ---------------------------------------------------------------- rope_append over many rows
// Op rope_append over many rows (prefill chunks).
//
// k_rope_append takes one block per (row, head): at 4096 rows and 40 heads that is 164k blocks
// of 64 threads, each taking the row's cos/sin in float64 again, and the launch is latency-bound.
// Here one block of four warps takes a whole row: the cos/sin of the row's angles are taken once
// per warp, and each warp runs over every fourth head (q heads, then k heads, whose keys and
// values go to the cache). The arithmetic is k_rope_append's, step for step, so the results are
// the same bits: the QK-norm sum is the warp butterfly of blockSum for each 32 lanes of the half
// head, added in blockSum's order; the scale, the angle, cos/sin and the rotation are the same
// expressions.

// rotateHalf with the angle's cos and sin already taken.
__device__ __forceinline__ void rotateHalfSC(float a, float b, double s, double c, int bfa, float& ra, float& rb) {
  if (bfa) {
    float cf = rbf((float)c), sf = rbf((float)s);
    ra = rbf(rbf(__fmul_rn(a, cf)) - rbf(__fmul_rn(b, sf)));
    rb = rbf(rbf(__fmul_rn(b, cf)) + rbf(__fmul_rn(a, sf)));
  } else {
    ra = (float)((double)a * c - (double)b * s);
    rb = (float)((double)b * c + (double)a * s);
  }
}

// E elements per lane in each half of a head: headDim = 64 E.
template <int E>
__global__ void __launch_bounds__(128) k_rope_append_rows(float* x, const int* positions, const float* invFreq,
                                                          const void* qn, const void* kn, int ndt, int nq, int rowStride,
                                                          float eps, const int* slots, void* kc, void* vc, int cdt,
                                                          int nkv, int bfa) {
  PDL_ENTER();
  constexpr int HALF = 32 * E, HD = 2 * HALF;
  const int r = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float posf = (float)positions[r];
  double sn[E], cs[E];
#pragma unroll
  for (int j = 0; j < E; j++) sincos((double)__fmul_rn(posf, invFreq[lane + 32 * j]), &sn[j], &cs[j]);
  const int slot = slots[r];
  float* row = x + (size_t)r * rowStride;
  const size_t width = (size_t)nkv * HD;
  for (int h = warp; h < nq + nkv; h += 4) {
    const bool isK = h >= nq;
    const void* nw = isK ? kn : qn;
    float* base = row + (size_t)h * HD;  // k heads follow the q heads
    float a[E], b[E];
#pragma unroll
    for (int j = 0; j < E; j++) {
      a[j] = base[lane + 32 * j];
      b[j] = base[lane + 32 * j + HALF];
    }
    if (nw) {
      // blockSum over HALF threads: each warp's butterfly (lane 0's sum), then 0 + w0 + w1 + ...
      float t = 0.f;
#pragma unroll
      for (int j = 0; j < E; j++) {
        float v = a[j] * a[j] + b[j] * b[j];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        t += __shfl_sync(0xffffffffu, v, 0);
      }
      const float inv = rsqrtf(t / (float)HD + eps);
#pragma unroll
      for (int j = 0; j < E; j++) {
        const int i = lane + 32 * j;
        a[j] = bfr(bfr(a[j] * inv, bfa) * ldf(nw, ndt, i), bfa);
        b[j] = bfr(bfr(b[j] * inv, bfa) * ldf(nw, ndt, i + HALF), bfa);
      }
    }
#pragma unroll
    for (int j = 0; j < E; j++) {
      const int i = lane + 32 * j;
      float ra, rb;
      rotateHalfSC(a[j], b[j], sn[j], cs[j], bfa, ra, rb);
      base[i] = ra;
      base[i + HALF] = rb;
      if (isK && slot >= 0) {
        const size_t c0 = (size_t)slot * width + (size_t)(h - nq) * HD;
        stf(kc, cdt, c0 + i, ra);
        stf(kc, cdt, c0 + i + HALF, rb);
        const float* v = base + (size_t)nkv * HD;  // value head kh sits nkv heads after key head kh
        stf(vc, cdt, c0 + i, v[i]);
        stf(vc, cdt, c0 + i + HALF, v[i + HALF]);
      }
    }
  }
}

// Whether op rope_append's rows take k_rope_append_rows: more than a decode batch (8 rows), and
// head sizes of 64, 128 or 256.
bool ropeAppendRowsFits(int rows, int hd) { return rows > 8 && (hd == 64 || hd == 128 || hd == 256); }

int ropeAppendRowsRun(NervaExec* ex, float* qkv, Buf pos, Buf inv, Buf slots, Buf kc, Buf vc, Buf qn, Buf kn, int rows,
                      int nq, int nkv, int hd, int rowStride, float eps) {
  if (kc.dt != vc.dt) return bad(ex, "rope_append: kCache and vCache dtypes differ");
  if (qn.p && kn.p && qn.dt != kn.dt) return bad(ex, "rope_append: qNorm and kNorm dtypes differ");
  const int ndt = qn.p ? qn.dt : kn.dt;
#define RAR(E)                                                                                                          \
  LAUNCH(k_rope_append_rows<E>, rows, 128, 0, qkv, (const int*)pos.p, (const float*)inv.p, qn.p, kn.p, ndt, nq, rowStride, \
         eps, (const int*)slots.p, kc.p, vc.p, kc.dt, nkv, ex->bf16act ? 1 : 0)
  switch (hd) {
    case 64: RAR(1); break;
    case 128: RAR(2); break;
    default: RAR(4); break;
  }
#undef RAR
  return NERVA_OK;
}
// ---------------------------------------------------------------- silu_mul over many rows
// Op silu_mul over many rows (prefill chunks). k_silu_mul indexes the flat output
// with 64-bit division and modulo per element; here a block row takes four elements a thread of
// one row (blockIdx.y), with vector loads and stores. The formula is k_silu_mul's (the same bits).
// A bf16 `out` (capabilities.bf16Activations) gets the same values rounded to bf16 (nearest even).
__device__ __forceinline__ void siluStore4(float* p, float4 o) { *reinterpret_cast<float4*>(p) = o; }
__device__ __forceinline__ void siluStore4(uint16_t* p, float4 o) {
  *reinterpret_cast<uint2*>(p) = make_uint2((uint32_t)f2bf(o.x) | ((uint32_t)f2bf(o.y) << 16), (uint32_t)f2bf(o.z) | ((uint32_t)f2bf(o.w) << 16));
}

template <typename OT>
__global__ void __launch_bounds__(256) k_silu_mul_rows(const float* x, OT* out, int rowBase, int dim, int bfa) {
  PDL_ENTER();
  const int r = rowBase + blockIdx.y;
  const int i = (blockIdx.x * 256 + threadIdx.x) * 4;
  if (i >= dim) return;
  const float* xr = x + (size_t)r * 2 * dim;
  const float4 g4 = *reinterpret_cast<const float4*>(xr + i), u4 = *reinterpret_cast<const float4*>(xr + dim + i);
  float4 o;
  o.x = bfr(bfr(g4.x / (1.f + expf(-g4.x)), bfa) * u4.x, bfa);
  o.y = bfr(bfr(g4.y / (1.f + expf(-g4.y)), bfa) * u4.y, bfa);
  o.z = bfr(bfr(g4.z / (1.f + expf(-g4.z)), bfa) * u4.z, bfa);
  o.w = bfr(bfr(g4.w / (1.f + expf(-g4.w)), bfa) * u4.w, bfa);
  siluStore4(out + (size_t)r * dim + i, o);
}

// Any shape, bf16 out: k_silu_mul's loop with the store rounded.
__global__ void k_silu_mul_bf16(const float* x, uint16_t* out, int rows, int dim, int bfa) {
  PDL_ENTER();
  size_t n = (size_t)rows * dim;
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x) {
    size_t r = t / dim, i = t % dim;
    float g = x[r * 2 * dim + i], u = x[r * 2 * dim + dim + i];
    out[t] = f2bf(bfr(bfr(g / (1.f + expf(-g)), bfa) * u, bfa));
  }
}

// More than a decode batch, rows of whole float4s (the buffers are 16-byte aligned: arena slices).
bool siluMulRowsFits(int rows, int dim) { return rows > 8 && dim % 4 == 0; }

template <typename OT>
int siluMulRowsRun(NervaExec* ex, const float* x, OT* out, int rows, int dim) {
  const unsigned gx = (unsigned)((dim / 4 + 255) / 256);
  for (int r0 = 0; r0 < rows; r0 += 65535) {
    const int nr = std::min(65535, rows - r0);
    LAUNCH(k_silu_mul_rows<OT>, dim3(gx, (unsigned)nr), 256, 0, x, out, r0, dim, ex->bf16act ? 1 : 0);
  }
  return NERVA_OK;
}


// ---------------------------------------------------------------- launchers

int launchEmbedding(NervaExec* ex, const void* table, int tdt, const int* ids, float* out, int rows, int hidden) {
  LAUNCH(k_embedding, rows, 256, 0, table, tdt, ids, out, hidden, ex->bf16act ? 1 : 0);
  return NERVA_OK;
}

// k_rmsnorm_row where the row fits 16 elements a thread of at most 256, the weights are f32 or
// bf16, and the rows are a decode batch's (at most two blocks an SM: the kernel's registers would
// cost a many-row norm its occupancy, where the second pass is no latency anyway).
static bool rmsnormRowFits(const NervaExec* ex, int rows, int threads, int dim, int wdt) {
  return threads <= 256 && dim <= 16 * threads && (wdt == NV_F32 || wdt == NV_BF16) && rows <= 2 * ex->smCount;
}

template <class In>
static int launchRmsnormRow(NervaExec* ex, int rows, int threads, const In& x, const void* w, int wdt, float* out,
                            float* residual, int dim, float eps, uint16_t* hi, uint16_t* lo, int wFirst) {
  const int bfa = ex->bf16act ? 1 : 0, wbf = wdt == NV_BF16 ? 1 : 0;
  if (dim <= 8 * threads)
    LAUNCH((k_rmsnorm_row<8, In>), rows, threads, 0, x, w, wbf, out, residual, dim, eps, bfa, hi, lo, wFirst);
  else
    LAUNCH((k_rmsnorm_row<16, In>), rows, threads, 0, x, w, wbf, out, residual, dim, eps, bfa, hi, lo, wFirst);
  return NERVA_OK;
}

template <class In>
static int launchRmsnormOf(NervaExec* ex, int rows, int threads, const In& x, const void* w, int wdt, float* out,
                           float* residual, int dim, float eps, uint16_t* hi, uint16_t* lo, int wFirst) {
  if (rmsnormRowFits(ex, rows, threads, dim, wdt)) return launchRmsnormRow(ex, rows, threads, x, w, wdt, out, residual, dim, eps, hi, lo, wFirst);
  if (threads > 512)
    LAUNCH((k_rmsnorm<4, In>), rows, threads, 0, x, w, wdt, out, residual, dim, eps, ex->bf16act ? 1 : 0, hi, lo);
  else
    LAUNCH((k_rmsnorm<8, In>), rows, threads, 0, x, w, wdt, out, residual, dim, eps, ex->bf16act ? 1 : 0, hi, lo);
  return NERVA_OK;
}

template <int U>
static int launchRmsnormRows(NervaExec* ex, int rows, const float* x, const void* w, int wdt, float* out, float* residual,
                             float eps, uint16_t* hi, uint16_t* lo) {
  const int bfa = ex->bf16act ? 1 : 0;
  if constexpr (U <= 4) {
    if (residual) {
      LAUNCH((k_rmsnorm_rows<U, true>), rows, 256, 0, x, w, wdt, out, residual, eps, bfa, hi, lo);
      return NERVA_OK;
    }
  }
  LAUNCH((k_rmsnorm_rows<U, false>), rows, 256, 0, x, w, wdt, out, residual, eps, bfa, hi, lo);
  return NERVA_OK;
}

int launchRmsnorm(NervaExec* ex, int rows, int threads, const float* x, const void* w, int wdt, float* out, float* residual,
                  int dim, float eps, uint16_t* hi, uint16_t* lo, bool wIsWeight) {
  // k_rmsnorm's 1024-thread blocks as k_rmsnorm_rows (the same bits) for rows of 1, 2, 4, 5 or 8
  // times 1024 elements (4 at most with a residual, whose second row of registers would spill).
  if (threads == 1024 && dim % 1024 == 0) {
    switch (dim / 1024 * (residual ? -1 : 1)) {
      case 1: case -1: return launchRmsnormRows<1>(ex, rows, x, w, wdt, out, residual, eps, hi, lo);
      case 2: case -2: return launchRmsnormRows<2>(ex, rows, x, w, wdt, out, residual, eps, hi, lo);
      case 4: case -4: return launchRmsnormRows<4>(ex, rows, x, w, wdt, out, residual, eps, hi, lo);
      case 5: return launchRmsnormRows<5>(ex, rows, x, w, wdt, out, residual, eps, hi, lo);
      case 8: return launchRmsnormRows<8>(ex, rows, x, w, wdt, out, residual, eps, hi, lo);
      default: break;
    }
  }
  return launchRmsnormOf(ex, rows, threads, FloatRows{x, dim}, w, wdt, out, residual, dim, eps, hi, lo, wIsWeight ? 1 : 0);
}

int launchRmsnormAfter(NervaExec* ex, int rows, int threads, const GemmSum& g, float* residual, const void* w, int wdt,
                       int dim, float eps, uint16_t* hi, uint16_t* lo) {
  // The residual add is the epilogue's accumulate, out + y, here y + out: the same sum.
  // (Up to 512 threads: at 1024 the four-ahead form's 32 registers cannot hold the GEMM's halves.)
  if (!residual) return bad(ex, "rmsnorm: a GEMM output needs the residual it accumulates into");
  if (threads > rmsMaxThreads<8>()) return bad(ex, "rmsnorm: at most 512 threads over a GEMM output");
  if (rmsnormRowFits(ex, rows, threads, dim, wdt))  // (w: fused_matmul's norm weight)
    return launchRmsnormRow(ex, rows, threads, g, w, wdt, (float*)nullptr, residual, dim, eps, hi, lo, 1);
  LAUNCH((k_rmsnorm<8, GemmSum>), rows, threads, 0, g, w, wdt, nullptr, residual, dim, eps, ex->bf16act ? 1 : 0, hi, lo);
  return NERVA_OK;
}

int kernelsPtxVersion() {
  cudaFuncAttributes a;
  if (cudaFuncGetAttributes(&a, k_add) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return a.ptxVersion;
}

template <class In>
static int ropeAppendOf(NervaExec* ex, const In& src, float* qkv, Buf pos, Buf inv, Buf slots, Buf kc, Buf vc, Buf qn, Buf kn,
                        int rows, int nq, int nkv, int hd, int rowStride, float eps) {
  if (hd % 2 != 0 || hd > 2048) return bad(ex, "rope_append: headDim must be even and at most 2048");
  if (kc.dt != vc.dt) return bad(ex, "rope_append: kCache and vCache dtypes differ");
  if (qn.p && kn.p && qn.dt != kn.dt) return bad(ex, "rope_append: qNorm and kNorm dtypes differ");
  if (rows <= 0) return NERVA_OK;
  int ndt = qn.p ? qn.dt : kn.dt;
  LAUNCH(k_rope_append<In>, dim3(rows, nq + nkv), ((hd / 2 + 31) / 32) * 32, 0, src, qkv, (const int*)pos.p,
         (const float*)inv.p, qn.p, kn.p, ndt, nq, hd, rowStride, eps, (const int*)slots.p, kc.p, vc.p, kc.dt, nkv,
         ex->bf16act ? 1 : 0);
  return NERVA_OK;
}

int ropeAppendRun(NervaExec* ex, float* qkv, Buf pos, Buf inv, Buf slots, Buf kc, Buf vc, Buf qn, Buf kn, int rows, int nq,
                  int nkv, int hd, int rowStride, float eps) {
  return ropeAppendOf(ex, FloatRows{qkv, rowStride}, qkv, pos, inv, slots, kc, vc, qn, kn, rows, nq, nkv, hd, rowStride, eps);
}

int ropeAppendAfter(NervaExec* ex, DeferredEpilogue* d, Buf pos, Buf inv, Buf slots, Buf kc, Buf vc, Buf qn, Buf kn, int rows,
                    int nq, int nkv, int hd, float eps) {
  float* qkv = d->out;
  const int rowStride = d->dim;
  if (!d->g.t || d->accumulate || d->rows != rows || rowStride < (nq + 2 * nkv) * hd) {
    int rc = flushEpilogue(ex, d);
    return rc ? rc : ropeAppendRun(ex, qkv, pos, inv, slots, kc, vc, qn, kn, rows, nq, nkv, hd, rowStride, eps);
  }
  const GemmSum g = d->g;
  d->g.t = nullptr;
  return ropeAppendOf(ex, g, qkv, pos, inv, slots, kc, vc, qn, kn, rows, nq, nkv, hd, rowStride, eps);
}
int opEmbedding(NervaExec* ex, Args& A) {
  Buf table = buf(A), ids = buf(A), out = buf(A);
  int rows = A.num(), hidden = A.num();
  if (!A.ok) return bad(ex, "embedding: argument count");
  if (rows <= 0) return NERVA_OK;
  LAUNCH(k_embedding, rows, 256, 0, table.p, table.dt, (const int*)ids.p, (float*)out.p, hidden, ex->bf16act ? 1 : 0);
  return NERVA_OK;
}

int opRmsnorm(NervaExec* ex, Args& A) {
  Buf x = buf(A), w = buf(A), out = buf(A), res = buf(A);
  int rows = A.num(), dim = A.num();
  float eps = (float)A.next();
  if (!A.ok) return bad(ex, "rmsnorm: argument count");
  if (rows <= 0) return NERVA_OK;
  // A bf16 out (capabilities.bf16Activations): the values rounded to bf16 as they are stored.
  const bool bf = out.dt == NV_BF16;
  return launchRmsnorm(ex, rows, std::min(1024, ((dim + 31) / 32) * 32), (const float*)x.p, w.p, w.dt,
                       bf ? (float*)nullptr : (float*)out.p, (float*)res.p, dim, eps,
                       bf ? (uint16_t*)out.p : (uint16_t*)nullptr, (uint16_t*)nullptr);
}

int opRope(NervaExec* ex, Args& A) {
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

int opKvAppend(NervaExec* ex, Args& A) {
  Buf src = buf(A), kc = buf(A), vc = buf(A), slots = buf(A);
  int rows = A.num(), kvh = A.num(), hd = A.num(), rowStride = A.num(), kOff = A.num(), vOff = A.num();
  if (!A.ok) return bad(ex, "kv_append: argument count");
  if (kc.dt != vc.dt) return bad(ex, "kv_append: kCache and vCache dtypes differ");
  if (rows <= 0) return NERVA_OK;
  LAUNCH(k_kv_append, rows, 256, 0, (const float*)src.p, kc.p, vc.p, kc.dt, (const int*)slots.p, kvh * hd, rowStride,
         kOff, vOff);
  return NERVA_OK;
}

int opSiluMul(NervaExec* ex, Args& A) {
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

int opAdd(NervaExec* ex, Args& A) {
  Buf a = buf(A), b = buf(A), out = buf(A);
  double len = A.next();
  if (!A.ok) return bad(ex, "add: argument count");
  size_t n = (size_t)len;
  if (n == 0) return NERVA_OK;
  LAUNCH(k_add, gridFor(n, 256, ex->smCount), 256, 0, (const float*)a.p, (const float*)b.p, (float*)out.p, n, ex->bf16act ? 1 : 0);
  return NERVA_OK;
}

int opGatherRows(NervaExec* ex, Args& A) {
  Buf x = buf(A), idx = buf(A), out = buf(A);
  int n = A.num(), dim = A.num();
  if (!A.ok) return bad(ex, "gather_rows: argument count");
  if (n <= 0) return NERVA_OK;
  size_t eb = (x.dt == NV_BF16 || x.dt == NV_F16) ? 2 : 4;
  LAUNCH(k_gather_rows, n, 256, 0, (const char*)x.p, (const int*)idx.p, (char*)out.p, (size_t)dim * eb);
  return NERVA_OK;
}

int opRopeAppend(NervaExec* ex, Args& A) {
  Buf x = buf(A), pos = buf(A), inv = buf(A), slots = buf(A), kc = buf(A), vc = buf(A), qn = buf(A), kn = buf(A);
  int rows = A.num(), nq = A.num(), nkv = A.num(), hd = A.num(), rowStride = A.num();
  float eps = (float)A.next();
  if (!A.ok) return bad(ex, "rope_append: argument count");
  if (rows > 0 && ropeAppendRowsFits(rows, hd))
    return ropeAppendRowsRun(ex, (float*)x.p, pos, inv, slots, kc, vc, qn, kn, rows, nq, nkv, hd, rowStride, eps);
  return ropeAppendRun(ex, (float*)x.p, pos, inv, slots, kc, vc, qn, kn, rows, nq, nkv, hd, rowStride, eps);
}

}  // namespace nerva::ops
