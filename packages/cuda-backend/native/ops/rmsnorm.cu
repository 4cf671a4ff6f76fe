// Op rmsnorm and the norm of fused_matmul's many-row path: k_rmsnorm (a block a row, with an
// optional residual add, over float rows or a pending GEMM output), k_rmsnorm_row (decode batches,
// the row in registers) and k_rmsnorm_rows (prompts' rows), all summing in one order.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/ops.h"

namespace nerva::ops {

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
  // A group's weights are loaded together before its stores: a load after a store to `out`,
  // which the compiler cannot tell apart from `w`, would wait for it, and a decode row's norm
  // (one block: the 8B's Q8_0 and Q6_K normed matmuls, the LM head's norm) then waited out 16
  // round trips one after another (~12 us).
#pragma unroll
  for (int k = 0; k < E; k++) {
    float wv[U];
#pragma unroll
    for (int u = 0; u < U; u++) wv[u] = ldf(w, wdt, first + k * 32 + u * B);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const float o = bfr(bfr(v[k][u] * inv, bfa) * wv[u], bfa);
      if (hi)
        storeSplit(o, hi, lo, row + k * 32 + u * B);
      else
        out[row + k * 32 + u * B] = o;
    }
  }
}

// ---------------------------------------------------------------- launchers

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

template <int U, bool RES>
static int launchRmsnormRows(NervaExec* ex, int rows, const float* x, const void* w, int wdt, float* out, float* residual,
                             float eps, uint16_t* hi, uint16_t* lo) {
  LAUNCH((k_rmsnorm_rows<U, RES>), rows, 256, 0, x, w, wdt, out, residual, eps, ex->bf16act ? 1 : 0, hi, lo);
  return NERVA_OK;
}

int launchRmsnorm(NervaExec* ex, int rows, int threads, const float* x, const void* w, int wdt, float* out, float* residual,
                  int dim, float eps, uint16_t* hi, uint16_t* lo, bool wIsWeight) {
  // k_rmsnorm's 1024-thread blocks as k_rmsnorm_rows (the same bits) for rows of 1, 2, 4, 5 or 8
  // times 1024 elements (4 at most with a residual, whose second row of registers would spill).
  if (threads == 1024 && dim % 1024 == 0) {
    const int u = dim / 1024;
    if (residual) {
      if (u == 1) return launchRmsnormRows<1, true>(ex, rows, x, w, wdt, out, residual, eps, hi, lo);
      if (u == 2) return launchRmsnormRows<2, true>(ex, rows, x, w, wdt, out, residual, eps, hi, lo);
      if (u == 4) return launchRmsnormRows<4, true>(ex, rows, x, w, wdt, out, residual, eps, hi, lo);
    } else {
      if (u == 1) return launchRmsnormRows<1, false>(ex, rows, x, w, wdt, out, residual, eps, hi, lo);
      if (u == 2) return launchRmsnormRows<2, false>(ex, rows, x, w, wdt, out, residual, eps, hi, lo);
      if (u == 4) return launchRmsnormRows<4, false>(ex, rows, x, w, wdt, out, residual, eps, hi, lo);
      if (u == 5) return launchRmsnormRows<5, false>(ex, rows, x, w, wdt, out, residual, eps, hi, lo);
      if (u == 8) return launchRmsnormRows<8, false>(ex, rows, x, w, wdt, out, residual, eps, hi, lo);
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

}  // namespace nerva::ops
