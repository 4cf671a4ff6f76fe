// Many-row matmuls on cuBLAS (and cuBLASLt pinned, batch-invariant): the operand split, the GEMM
// and its epilogue.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "common/quant.cuh"
#include "ops/ops.h"

namespace nerva::ops {

constexpr int CUBLAS_OP_N = 0;
constexpr int CUBLAS_OP_T = 1;
constexpr int CUDA_R_32F_ = 0;
constexpr int CUDA_R_16BF_ = 14;
constexpr int CUBLAS_COMPUTE_32F_ = 68;
constexpr int CUBLAS_GEMM_DEFAULT_ = -1;

// GEMM epilogue: out += bias (when given), then R (bf16 numerics).
__global__ void k_bias_add(float* out, const void* bias, int bdt, int rows, int outDim, int bfa) {
  PDL_ENTER();
  size_t n = (size_t)rows * outDim;
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x)
    out[t] = bfr(bias ? out[t] + ldf(bias, bdt, t % outDim) : out[t], bfa);
}

// Epilogue of fused_matmul's many-row GEMM (gemmRowsBlas): G's t holds x.W^T as [rows, wOut]
// (GemmOut), wOut = outDim (2 outDim with glu: gate then up). The same formulas as k_gemv_generic:
// y = R(g + bias); glu: R(R(silu(y)) * R(u)); accumulate. nextHi (and nextLo): out's values also as
// their bf16 split (storeSplit), the next GEMM's operand.
__global__ void k_gemm_epilogue(GemmOut G, float* out, int rows, int outDim, int glu, int accumulate, uint16_t* nextHi,
                                uint16_t* nextLo) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  size_t n = (size_t)rows * outDim;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const int r = (int)(i / outDim), o = (int)(i % outDim);
    float y = G.value(r, o);
    if (glu) {
      const float u = G.raw(r, outDim + o);
      y = bfr(bfr(y / (1.f + expf(-y)), G.bfa) * bfr(u, G.bfa), G.bfa);
    }
    const float v = accumulate ? bfr(out[i] + y, G.bfa) : y;
    out[i] = v;
    if (nextHi) storeSplit(v, nextHi, nextLo, i);
  }
}

static int launchGemmEpilogue(NervaExec* ex, const GemmOut& G, float* out, int rows, int outDim, bool glu, bool accumulate,
                              uint16_t* nextHi, uint16_t* nextLo) {
  LAUNCH(k_gemm_epilogue, gridFor((size_t)rows * outDim, 256, ex->smCount), 256, 0, G, out, rows, outDim, glu ? 1 : 0,
         accumulate ? 1 : 0, nextHi, nextLo);
  return NERVA_OK;
}

int flushEpilogue(NervaExec* ex, DeferredEpilogue* d) {
  if (!d || !d->g.t) return NERVA_OK;
  const GemmOut g = d->g.as<true>();  // (a deferred epilogue has no bias)
  d->g.t = nullptr;
  return launchGemmEpilogue(ex, g, d->out, d->rows, d->dim, false, d->accumulate, nullptr, nullptr);
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

// The same split, eight elements a thread: two 16-byte loads, one 16-byte store a half (n a
// multiple of 8, every pointer 16-byte aligned). A prompt's f32 operand (the attention's output
// before o) streams at the copy rate instead of a 4-byte load a thread at a time.
__device__ __forceinline__ uint32_t bfPair(float a, float b) { return (uint32_t)f2bf(a) | ((uint32_t)f2bf(b) << 16); }

__global__ void __launch_bounds__(256) k_split_bf16_v8(const float4* x, uint4* hi, uint4* lo, size_t n8) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n8; t += (size_t)gridDim.x * blockDim.x) {
    const float4 a = x[2 * t], b = x[2 * t + 1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint16_t h[8];
#pragma unroll
    for (int j = 0; j < 8; j++) h[j] = f2bf(v[j]);
    hi[t] = make_uint4(h[0] | ((uint32_t)h[1] << 16), h[2] | ((uint32_t)h[3] << 16), h[4] | ((uint32_t)h[5] << 16),
                       h[6] | ((uint32_t)h[7] << 16));
    if (lo) {
      float r[8];
#pragma unroll
      for (int j = 0; j < 8; j++) r[j] = v[j] - bf2f(h[j]);
      lo[t] = make_uint4(bfPair(r[0], r[1]), bfPair(r[2], r[3]), bfPair(r[4], r[5]), bfPair(r[6], r[7]));
    }
  }
}

static int launchSplit(NervaExec* ex, const float* x, uint16_t* hi, uint16_t* lo, size_t n) {
  const bool v8 = n % 8 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)hi & 15) == 0 && ((uintptr_t)lo & 15) == 0;
  if (v8)
    LAUNCH(k_split_bf16_v8, gridFor(n / 8, 256, ex->smCount), 256, 0, (const float4*)x, (uint4*)hi, (uint4*)lo, n / 8);
  else
    LAUNCH(k_split_bf16, gridFor(n, 256, ex->smCount), 256, 0, x, hi, lo, n);
  return NERVA_OK;
}


// Op matmul past 8 rows over bf16 weights. An f32 x is split (exact) or rounded (bf16) into the
// workspace first; a bf16 x is the GEMM's operand as it is (its values are bf16 already, so under
// 'split-bf16' the lo half would be zero). Then the epilogue: bias, bf16 numerics, and with
// `accumulate` the add into out. Without a bias or bf16 numerics the GEMMs add into out
// themselves (beta = 1: under 'split-bf16' the hi product, then the lo one, as qgemmRows adds its
// terms; one f32 add each); else y goes to the workspace first and the epilogue adds R(y).
int gemmCublas(NervaExec* ex, const void* x, bool xBf16, Buf w, float* out, int rows, int inDim, int outDim, Buf bias,
               bool accumulate) {
  const CublasApi* api = ex->api;
  // Under bf16 numerics the activations are bf16 values already: the low half would be zero.
  const bool split = ex->gemmMode == GEMM_SPLIT_BF16 && !ex->bf16act && !xBf16;
  const bool direct = !bias.p && !ex->bf16act;
  const bool staged = accumulate && !direct;  // y into the workspace, then out = R(out + y)
  const size_t perRow = (xBf16 ? 0 : (size_t)inDim * 2 * (split ? 2 : 1)) + (staged ? (size_t)outDim * 4 : 0);
  const size_t maxRows = perRow ? ex->wsBytes / (perRow + 512) : (size_t)rows;
  if (maxRows < 1) return bad(ex, "matmul: workspace too small for one row (raise workspaceBytes)");
  if (api->setStream(ex->cublas, ex->stream) != 0) {
    snprintf(ex->errCall, sizeof ex->errCall, "cublasSetStream");
    return NERVA_CUBLAS_FAILED;
  }
  float one = 1.f, zero = 0.f;
  for (int r0 = 0; r0 < rows; r0 += (int)maxRows) {
    const int nr = (int)std::min<size_t>(maxRows, (size_t)(rows - r0));
    const size_t n = (size_t)nr * inDim;
    const uint16_t* hi = xBf16 ? (const uint16_t*)x + (size_t)r0 * inDim : (const uint16_t*)ex->ws;
    uint16_t* lo = split ? (uint16_t*)(ex->ws + align256(n * 2)) : nullptr;
    const size_t xBytes = xBf16 ? 0 : align256(n * 2) * (split ? 2 : 1);
    if (!xBf16) {
      const int rc = launchSplit(ex, (const float*)x + (size_t)r0 * inDim, (uint16_t*)hi, lo, n);
      if (rc) return rc;
    }
    float* o = out + (size_t)r0 * outDim;
    float* y = staged ? (float*)(ex->ws + xBytes) : o;
    const float* beta = accumulate && direct ? &one : &zero;
    // Row-major out[nr, outDim] = x[nr, K] . W[outDim, K]^T  <=>  column-major out^T = W^T(op T) . x^T
    int st = api->gemmEx(ex->cublas, CUBLAS_OP_T, CUBLAS_OP_N, outDim, nr, inDim, &one, w.p, CUDA_R_16BF_, inDim, hi,
                         CUDA_R_16BF_, inDim, beta, y, CUDA_R_32F_, outDim, CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_);
    if (!ex->capturing) ex->launches++;
    if (st == 0 && split) {
      st = api->gemmEx(ex->cublas, CUBLAS_OP_T, CUBLAS_OP_N, outDim, nr, inDim, &one, w.p, CUDA_R_16BF_, inDim, lo,
                       CUDA_R_16BF_, inDim, &one, y, CUDA_R_32F_, outDim, CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_);
      if (!ex->capturing) ex->launches++;
    }
    if (st != 0) {
      snprintf(ex->errCall, sizeof ex->errCall, "cublasGemmEx (status %d)", st);
      return NERVA_CUBLAS_FAILED;
    }
    if (staged) {
      const GemmOut G{y, 0, outDim, 0, bias.p, bias.dt, ex->bf16act ? 1 : 0};
      int rc = launchGemmEpilogue(ex, G, o, nr, outDim, false, true, nullptr, nullptr);
      if (rc) return rc;
    } else if (!direct) {
      LAUNCH(k_bias_add, gridFor((size_t)nr * outDim, 256, ex->smCount), 256, 0, o, bias.p, bias.dt, nr, outDim, ex->bf16act ? 1 : 0);
    }
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
// nothing, when one row does not fit. Fuse::defer: an epilogue without glu or bias is left to whatever
// reads out next (DeferredEpilogue); Fuse::pending: such an epilogue whose out is our x, applied
// by our norm as its residual add (k_rmsnorm over the GemmSum) where it accumulates and the norm
// runs here over all rows clear of the pending GEMM output, else launched first.
int gemmRowsBlas(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias,
                 const Fuse& f, bool pinned) {
  const CublasApi* api = ex->api;
  const int bfa = ex->bf16act ? 1 : 0;
  const bool split = ex->gemmMode == GEMM_SPLIT_BF16 && !ex->bf16act;
  const int halves = split ? 2 : 1;
  const int wOut = outDim * (f.glu ? 2 : 1);
  const bool direct = !split && !f.glu && !bias.p && !bfa;
  // Per row: the GEMM's out (unless direct) and the bf16 operand rows (normalized first with a norm).
  const size_t perRow = (direct ? 0 : (size_t)halves * wOut * sizeof(float)) + (size_t)halves * inDim * sizeof(uint16_t);
  const size_t slack = 3 * 256;  // alignment of the regions
  if (ex->wsBytes < perRow + slack) return NERVA_BAD_ARGS;
  const int chunk = (int)std::min<size_t>((size_t)rows, (ex->wsBytes - slack) / perRow);
  // The hand-offs need every row in one chunk: the handed-off region then holds all of them.
  const size_t tAll = direct ? 0 : align256((size_t)halves * rows * wOut * sizeof(float));
  const size_t xAll = align256((size_t)halves * rows * inDim * sizeof(uint16_t));
  const size_t nextAll = (size_t)halves * rows * outDim * sizeof(uint16_t);
  const SplitHandoff* tk = f.take;
  const bool take = tk && tk->hi && !f.nw.p && chunk == rows && tk->rows == rows && tk->dim == inDim && tk->lo == split &&
                    ((const char*)tk->hi >= ex->ws + tAll || (const char*)tk->hi + xAll <= ex->ws);
  const bool emit = f.emit && !direct && chunk == rows && tAll + xAll + nextAll <= ex->wsBytes;
  if (f.emit) *f.emit = SplitHandoff();
  if (f.defer) *f.defer = DeferredEpilogue();
  DeferredEpilogue* pend = f.pending && f.pending->g.t ? f.pending : nullptr;
  if (pend) {
    const bool ours = f.nw.p && !take && chunk == rows && pend->accumulate && pend->out == x && pend->rows == rows &&
                      pend->dim == inDim && tAll >= pend->tEnd;
    if (!ours) {
      int rc = flushEpilogue(ex, pend);
      if (rc) return rc;
      pend = nullptr;
    }
  }
  const bool defer = f.defer && !f.glu && !bias.p && !direct && !emit && chunk == rows;
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
    } else if (pend) {
      int rc = launchRmsnormAfter(ex, nr, 256, pend->g, pend->out, f.nw.p, f.nw.dt, inDim, f.eps, xh,
                                  split ? xh + n : (uint16_t*)nullptr);
      if (rc) return rc;
      pend->g.t = nullptr;
    } else if (f.nw.p) {
      int rc = launchRmsnorm(ex, nr, 256, xin, f.nw.p, f.nw.dt, (float*)nullptr, (float*)nullptr, inDim, f.eps, xh,
                             split ? xh + n : (uint16_t*)nullptr, true);
      if (rc) return rc;
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
    const GemmOut G{t, (size_t)nr * wOut, wOut, split ? 1 : 0, bias.p, bias.dt, bfa};
    if (defer) {
      *f.defer = DeferredEpilogue{G.as<false>(), o, nr, outDim, f.accumulate, tBytes};
    } else if (!direct) {
      int rc = launchGemmEpilogue(ex, G, o, nr, outDim, f.glu, f.accumulate, nextHi,
                                  split && emit ? nextHi + (size_t)nr * outDim : nullptr);
      if (rc) return rc;
    }
    if (emit) *f.emit = SplitHandoff{nextHi, rows, outDim, split};
  }
  return NERVA_OK;
}

// Elements [0, n) of a block-quantized matrix (n a multiple of 8) as the bf16 split of each
// dequantized value (storeSplit: hi, and lo unless null), eight a thread (one block, one scale),
// stored 16 bytes at a time.
__global__ void k_dequant_split(const void* w, int wdt, size_t n, uint16_t* hi, uint16_t* lo) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n / 8; t += (size_t)gridDim.x * blockDim.x) {
    float v[8];
    qElem8(w, wdt, t * 8, v);
    uint32_t h[4], l[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const uint16_t h0 = f2bf(v[2 * j]), h1 = f2bf(v[2 * j + 1]);
      h[j] = h0 | ((uint32_t)h1 << 16);
      l[j] = f2bf(v[2 * j] - bf2f(h0)) | ((uint32_t)f2bf(v[2 * j + 1] - bf2f(h1)) << 16);
    }
    reinterpret_cast<uint4*>(hi)[t] = make_uint4(h[0], h[1], h[2], h[3]);
    if (lo) reinterpret_cast<uint4*>(lo)[t] = make_uint4(l[0], l[1], l[2], l[3]);
  }
}

// Many rows over a block-quantized weight (prefill): chunks of the weight's rows (a multiple of
// 128) dequantized into the workspace as a bf16 split W = Whi + Wlo (~16 bits of each value), the
// activations split likewise (x = xhi + xlo), then tensor-core GEMMs with fp32 accumulation:
// Whi.xhi, Whi.xlo and Wlo.xhi (the lo.lo term, ~2^-16 of the others, is left out). f32-grade like
// the split-bf16 prefill of bf16 weights; under gemm 'bf16' one term (Whi.xhi).
//
// Direct (no glu, no bias: every prefill projection): the GEMMs write out's columns themselves,
// adding into them after the first (or from the first, with accumulate). The activations' split
// takes what every row needs, the weight chunks the rest of the workspace, so the weight is
// dequantized once a pass and each GEMM spans as many of its rows as fit. (Chunks of 2048 weight
// rows a 1024-row prompt gave GEMMs of 2048 x 1024 outputs, half the SMs' tiles, each followed by
// an epilogue pass: the 8B's Q4_K_M prefill under bf16 matmuls ran at 0.60 of the bf16 model's.)
// Else (glu or bias: batched decode's fused projections) the GEMMs write the workspace, the hi and
// lo halves stacked, and gemmRowsBlas's epilogue applies the rest. Returns NERVA_BAD_ARGS, having
// enqueued nothing, when the workspace cannot hold one row and 128 weight rows (the caller then
// runs the GEMV).
int qgemmRows(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias, const Fuse& f) {
  const CublasApi* api = ex->api;
  const bool split = ex->gemmMode == GEMM_SPLIT_BF16;
  const int halves = split ? 2 : 1;
  const int wOut = outDim * (f.glu ? 2 : 1);
  const bool direct = !f.glu && !bias.p;
  const size_t wRow = (size_t)halves * inDim * sizeof(uint16_t);  // a dequantized weight row
  const size_t perRow = (direct ? 0 : (size_t)halves * wOut * sizeof(float)) + (size_t)halves * inDim * sizeof(uint16_t);
  const size_t slack = 3 * 256;
  // (128 weight rows and the 256 bytes aligning the split after them: a direct chunk always
  // leaves room for at least 128 weight rows.)
  const size_t minW = 128 * wRow + 256;
  if (ex->wsBytes < minW + perRow + slack) return NERVA_BAD_ARGS;
  int chunk, oc;
  if (direct) {
    chunk = (int)std::min<size_t>((size_t)rows, (ex->wsBytes - slack - minW) / perRow);
    const size_t left = ex->wsBytes - slack - align256((size_t)chunk * perRow);
    oc = std::min(wOut, (int)std::min<size_t>(1 << 20, left / wRow / 128 * 128));
  } else {
    // At most 2048 weight rows (16 MiB a split 4096-wide chunk), fewer for wide rows; the rows of
    // x in chunks of what the rest holds. A multiple of 128 weight rows: each chunk's GEMM then
    // writes at a 512-byte-aligned column of t (a misaligned one sent cuBLAS to a kernel ~6x
    // slower: the 8B's down projection, 1170-row chunks).
    const int ocMax = (int)std::min<size_t>(2048, ((size_t)64 << 20) / wRow);
    oc = std::min(wOut, std::max(128, ocMax / 128 * 128));
    if (ex->wsBytes < align256((size_t)oc * wRow) + perRow + slack) return NERVA_BAD_ARGS;
    chunk = (int)std::min<size_t>((size_t)rows, (ex->wsBytes - align256((size_t)oc * wRow) - slack) / perRow);
  }
  const size_t wBytes = align256((size_t)oc * wRow);
  if (f.emit) *f.emit = SplitHandoff();  // (no operand hand-off from here)
  if (api->setStream(ex->cublas, ex->stream) != 0) {
    snprintf(ex->errCall, sizeof ex->errCall, "cublasSetStream");
    return NERVA_CUBLAS_FAILED;
  }
  auto gemm = [&](int m, int nn, const uint16_t* a, const uint16_t* b, float* c, int ldc, bool acc) -> int {
    float one = 1.f, zero = 0.f;
    int st = api->gemmEx(ex->cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, inDim, &one, a, CUDA_R_16BF_, inDim, b, CUDA_R_16BF_, inDim,
                         acc ? &one : &zero, c, CUDA_R_32F_, ldc, CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_);
    if (!ex->capturing) ex->launches++;
    if (st != 0) {
      snprintf(ex->errCall, sizeof ex->errCall, "cublasGemmEx (status %d)", st);
      return NERVA_CUBLAS_FAILED;
    }
    return NERVA_OK;
  };
  for (int r0 = 0; r0 < rows; r0 += chunk) {
    const int nr = std::min(chunk, rows - r0);
    const size_t n = (size_t)nr * inDim;
    uint16_t* wd = (uint16_t*)ex->ws;
    float* t = (float*)(ex->ws + wBytes);
    uint16_t* xh = (uint16_t*)(ex->ws + wBytes + (direct ? 0 : align256((size_t)halves * nr * wOut * sizeof(float))));
    const float* xin = x + (size_t)r0 * inDim;
    float* o = out + (size_t)r0 * outDim;
    if (f.nw.p) {
      int rc = launchRmsnorm(ex, nr, 256, xin, f.nw.p, f.nw.dt, (float*)nullptr, (float*)nullptr, inDim, f.eps, xh,
                             split ? xh + n : (uint16_t*)nullptr, true);
      if (rc) return rc;
    } else {
      LAUNCH(k_split_bf16, gridFor(n, 256, ex->smCount), 256, 0, xin, xh, split ? xh + n : (uint16_t*)nullptr, n);
    }
    for (int o0 = 0; o0 < wOut;) {
      const int m = std::min(oc, wOut - o0);
      // Rows o0.. of the matrix: the tail's past tailFrom (never with glu).
      const bool inTail = f.tail.p && o0 >= f.tailFrom;
      const int mm = f.tail.p && !inTail ? std::min(m, f.tailFrom - o0) : m;
      const Buf src = inTail ? f.tail : w;
      const size_t first = (size_t)(inTail ? o0 - f.tailFrom : o0) * inDim;
      const size_t ne = (size_t)mm * inDim;
      const char* base = (const char*)src.p + nvBytes(src.dt, first);
      LAUNCH(k_dequant_split, gridFor(ne / 8, 256, ex->smCount), 256, 0, (const void*)base, src.dt, ne, wd,
             split ? wd + ne : (uint16_t*)nullptr);
      int rc;
      if (direct) {
        rc = gemm(mm, nr, wd, xh, o + o0, outDim, f.accumulate);
        if (!rc && split) rc = gemm(mm, nr, wd + ne, xh, o + o0, outDim, true);
        if (!rc && split) rc = gemm(mm, nr, wd, xh + n, o + o0, outDim, true);
      } else {
        rc = gemm(mm, halves * nr, wd, xh, t + o0, wOut, false);
        if (!rc && split) rc = gemm(mm, nr, wd + ne, xh, t + o0, wOut, true);
      }
      if (rc) return rc;
      o0 += mm;  // (a chunk cut at tailFrom resumes there)
    }
    if (!direct) {
      const GemmOut G{t, (size_t)nr * wOut, wOut, split ? 1 : 0, bias.p, bias.dt, 0};
      int rc = launchGemmEpilogue(ex, G, o, nr, outDim, f.glu, f.accumulate, nullptr, nullptr);
      if (rc) return rc;
    }
  }
  return NERVA_OK;
}

}  // namespace nerva::ops
