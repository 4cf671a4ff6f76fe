// Element-wise and row ops: embedding, rope, kv_append, rope_append, silu_mul, add, gather_rows
// (kernels and launchers; rmsnorm is in rmsnorm.cu).
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
  // A block-quantized row (GGUF's token_embd), 8 elements a thread from one block's scale: each
  // thread's loads in flight together, where one element at a time waited out a round trip each
  // behind the store before it (a 4096-wide row of the 8B took ~11 us, on the step's critical path).
  if (tdt >= NV_Q8_0 && tdt <= NV_Q6_K && hidden % 8 == 0) {
    for (int j = threadIdx.x * 8; j < hidden; j += blockDim.x * 8) {
      float v[8];
      qElem8(table, tdt, id * hidden + j, v);
#pragma unroll
      for (int k = 0; k < 8; k++) o[j + k] = bfr(v[k], bfa);
    }
    return;
  }
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = bfr(ldf(table, tdt, id * hidden + i), bfa);
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
