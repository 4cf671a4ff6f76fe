// Matmuls over ggml block-quantized weights (Q8_0, Q4_0, Q4_K, Q6_K): a GEMV that streams each
// weight block once from memory and dequantizes it in registers against float32 activations.
// Exact with respect to the dequantized weights up to float32 summation order: the activations
// are never quantized (llama.cpp quantizes them to 8 bits for its dot products), and every
// product of a weight and an activation is a float32 product of the weight's own value.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/ops.h"

namespace nerva::ops {

// Weight rows a warp streams against its activations (GLU: two gate and two up rows).
constexpr int QG_ROWS = 4;

// 2^23 + byte: a byte turned into a float by placing it in the mantissa (one PRMT, no I2F,
// whose rate is an eighth of the FMA's); subtracting 2^23 + offset gives the signed value exactly.
__device__ __forceinline__ float magic(uint32_t v, int k) {
  return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7650u + (unsigned)k));
}
// 1 + n/16 for a nibble n held as (n << 3) | 0x80 in byte k of v: n lands on the top four mantissa
// bits, so sum(x * f) = sum(x) + sum(x * n) / 16 (see Q4_K's dot).
__device__ __forceinline__ float nib16(uint32_t v, int k) {
  return __uint_as_float(__byte_perm(v, 0x3F000000u, 0x7044u | ((unsigned)k << 8)));
}
__device__ __forceinline__ uint32_t ld32u2(const uint8_t* p) {  // 2-byte aligned
  const uint16_t* q = (const uint16_t*)p;
  return (uint32_t)q[0] | ((uint32_t)q[1] << 16);
}
__device__ __forceinline__ void ldx(const float* x, float* v, int n) {  // n floats, 16-byte aligned
#pragma unroll
  for (int i = 0; i < n; i += 4) {
    const float4 t = *reinterpret_cast<const float4*>(x + i);
    v[i] = t.x;
    v[i + 1] = t.y;
    v[i + 2] = t.z;
    v[i + 3] = t.w;
  }
}

// One type's tile: the elements a lane takes at a time, its activations held in registers
// (load) and their dot product with one weight row's tile (dot).
template <int DT>
struct QTile;

template <>
struct QTile<NV_Q8_0> {  // a tile is a block: f16 d, 32 int8
  static constexpr int ELEMS = 32, BYTES = 34;
  float x[32];
  __device__ void load(const float* xr, int t) { ldx(xr + t * 32, x, 32); }
  __device__ float dot(const uint8_t* row, int t) const {
    const uint8_t* b = row + (size_t)t * BYTES;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < 8; w++) {
      const uint32_t v = ld32u2(b + 2 + 4 * w) ^ 0x80808080u;  // q + 128 a byte
#pragma unroll
      for (int k = 0; k < 4; k++) s = fmaf(x[4 * w + k], magic(v, k) - 8388736.f, s);
    }
    return h2f(b) * s;
  }
};

template <>
struct QTile<NV_Q4_0> {  // a block: f16 d, 16 bytes (element j: low nibble of byte j, j + 16: high)
  static constexpr int ELEMS = 32, BYTES = 18;
  float x[32];
  __device__ void load(const float* xr, int t) { ldx(xr + t * 32, x, 32); }
  __device__ float dot(const uint8_t* row, int t) const {
    const uint8_t* b = row + (size_t)t * BYTES;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < 4; w++) {
      const uint32_t v = ld32u2(b + 2 + 4 * w);
      const uint32_t lo = v & 0x0F0F0F0Fu, hi = (v >> 4) & 0x0F0F0F0Fu;
#pragma unroll
      for (int k = 0; k < 4; k++) {
        s = fmaf(x[4 * w + k], magic(lo, k) - 8388616.f, s);
        s = fmaf(x[16 + 4 * w + k], magic(hi, k) - 8388616.f, s);
      }
    }
    return h2f(b) * s;
  }
};

template <>
struct QTile<NV_Q4_K> {  // a tile is 64 elements: 32 bytes of one block's qs (sub-blocks 2g, 2g + 1)
  static constexpr int ELEMS = 64, BYTES = 144;
  float x[64];
  float sx[2];  // the sums of the two sub-blocks' activations
  __device__ void load(const float* xr, int t) {
    ldx(xr + t * 64, x, 64);
    sx[0] = sx[1] = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) {
      sx[0] += x[i];
      sx[1] += x[32 + i];
    }
  }
  __device__ float dot(const uint8_t* row, int t) const {
    const uint8_t* b = row + (size_t)(t >> 2) * BYTES;
    const int g = t & 3;
    const uint4 q0 = *reinterpret_cast<const uint4*>(b + 16 + 32 * g);
    const uint4 q1 = *reinterpret_cast<const uint4*>(b + 32 + 32 * g);
    const uint32_t q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    float f0 = 0.f, f1 = 0.f;  // sum(x * (1 + n / 16)) of the low and the high nibbles
#pragma unroll
    for (int w = 0; w < 8; w++) {
      const uint32_t lo = ((q[w] & 0x0F0F0F0Fu) << 3) | 0x80808080u, hi = ((q[w] >> 1) & 0x78787878u) | 0x80808080u;
#pragma unroll
      for (int k = 0; k < 4; k++) {
        f0 = fmaf(x[4 * w + k], nib16(lo, k), f0);
        f1 = fmaf(x[32 + 4 * w + k], nib16(hi, k), f1);
      }
    }
    int sc0, m0, sc1, m1;
    q4kScaleMin(b + 4, 2 * g, sc0, m0);
    q4kScaleMin(b + 4, 2 * g + 1, sc1, m1);
    const float d = h2f(b), dmin = h2f(b + 2);
    // y = d*sc*n - dmin*m a weight; sum(x * n) = 16 * (f - sum(x)).
    return __fmul_rn(d, (float)sc0) * (16.f * (f0 - sx[0])) - __fmul_rn(dmin, (float)m0) * sx[0] +
           __fmul_rn(d, (float)sc1) * (16.f * (f1 - sx[1])) - __fmul_rn(dmin, (float)m1) * sx[1];
  }
};

template <>
struct QTile<NV_Q6_K> {  // a tile is 32 elements: l in [l0, l0 + 8) of one half's four quadrants
  static constexpr int ELEMS = 32, BYTES = 210;
  float x[32];  // quadrant qd's 8 activations at x[8 * qd]
  __device__ void load(const float* xr, int t) {
    const int n = (t >> 2) & 1, l0 = (t & 3) * 8;
    const float* base = xr + (size_t)(t >> 3) * 256 + 128 * n + l0;
#pragma unroll
    for (int qd = 0; qd < 4; qd++) ldx(base + 32 * qd, x + 8 * qd, 8);
  }
  __device__ float dot(const uint8_t* row, int t) const {
    const uint8_t* b = row + (size_t)(t >> 3) * BYTES;
    const int n = (t >> 2) & 1, l0 = (t & 3) * 8;
    const uint8_t* ql = b + 64 * n + l0;
    const uint8_t* qh = b + 128 + 32 * n + l0;
    const int8_t* sc = (const int8_t*)(b + 192 + 8 * n + l0 / 16);
    const float d = h2f(b + 208);
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < 2; w++) {
      const uint32_t la = ld32u2(ql + 4 * w), lb = ld32u2(ql + 32 + 4 * w), h = ld32u2(qh + 4 * w);
      const uint32_t v[4] = {(la & 0x0F0F0F0Fu) | ((h << 4) & 0x30303030u), (lb & 0x0F0F0F0Fu) | ((h << 2) & 0x30303030u),
                             ((la >> 4) & 0x0F0F0F0Fu) | (h & 0x30303030u),
                             ((lb >> 4) & 0x0F0F0F0Fu) | ((h >> 2) & 0x30303030u)};
#pragma unroll
      for (int qd = 0; qd < 4; qd++)
#pragma unroll
        for (int k = 0; k < 4; k++) s[qd] = fmaf(x[8 * qd + 4 * w + k], magic(v[qd], k) - 8388640.f, s[qd]);
    }
    float r = 0.f;
#pragma unroll
    for (int qd = 0; qd < 4; qd++) r += __fmul_rn(d, (float)sc[2 * qd]) * s[qd];
    return r;
  }
};

// One block: KS warps over the tiles of one activation row, QG_ROWS weight rows: outputs
// [o0, o0 + QG_ROWS) (GLU: gate rows o0, o0 + 1 and their up rows outDim + o0, + 1). Epilogue as
// k_gemv_generic's: bias, GLU, accumulate, bf16 numerics' rounding.
template <int DT, int KS, bool GLU>
__global__ void __launch_bounds__(32 * KS) k_qgemv(const float* __restrict__ x, const uint8_t* __restrict__ w, float* out,
                                                     int rows, int inDim, int outDim, const void* bias, int bdt, int acc,
                                                     int bfa) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  using T = QTile<DT>;
  constexpr int OUTS = GLU ? QG_ROWS / 2 : QG_ROWS;
  const int r = blockIdx.x % rows;
  const int o0 = (blockIdx.x / rows) * OUTS;
  const size_t rowBytes = (size_t)(inDim / (DT == NV_Q4_K || DT == NV_Q6_K ? 256 : 32)) * T::BYTES;
  const uint8_t* wr[QG_ROWS];
#pragma unroll
  for (int j = 0; j < QG_ROWS; j++) {
    int o = GLU ? (j < OUTS ? o0 + j : outDim + o0 + j - OUTS) : o0 + j;
    const bool valid = (GLU ? o0 + (j % OUTS) : o) < outDim;
    wr[j] = valid ? w + (size_t)o * rowBytes : nullptr;
  }
  const float* xr = x + (size_t)r * inDim;
  const int tiles = inDim / T::ELEMS;
  float a[QG_ROWS] = {};
  T tile;
  for (int t = threadIdx.x; t < tiles; t += 32 * KS) {
    tile.load(xr, t);
#pragma unroll
    for (int j = 0; j < QG_ROWS; j++)
      if (wr[j]) a[j] += tile.dot(wr[j], t);
  }
  __shared__ float part[KS][QG_ROWS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < QG_ROWS; j++) {
    a[j] = warpSum(a[j]);
    if (lane == 0) part[warp][j] = a[j];
  }
  __syncthreads();
  if (threadIdx.x >= OUTS) return;
  const int j = threadIdx.x, o = o0 + j;
  if (o >= outDim) return;
  float g = 0.f, u = 0.f;
  for (int k = 0; k < KS; k++) {
    g += part[k][j];
    if (GLU) u += part[k][OUTS + j];
  }
  float y = bfr(g + (bias ? ldf(bias, bdt, o) : 0.f), bfa);
  if (GLU) y = bfr(bfr(y / (1.f + expf(-y)), bfa) * bfr(u, bfa), bfa);
  float* dst = out + (size_t)r * outDim + o;
  *dst = acc ? bfr(*dst + y, bfa) : y;
}

template <int DT, bool GLU>
int qgemvLaunch(NervaExec* ex, int ks, const float* x, const uint8_t* w, float* out, int rows, int inDim, int outDim,
                Buf bias, int acc) {
  constexpr int OUTS = GLU ? QG_ROWS / 2 : QG_ROWS;
  const int bfa = ex->bf16act ? 1 : 0;
  const size_t chunks = (size_t)(outDim + OUTS - 1) / OUTS;
  // Row-major in the grid (row fastest): the blocks of one weight chunk run together and the
  // chunk is read once from memory for all rows.
  for (int r0 = 0; r0 < rows;) {
    const int nr = (int)std::min<size_t>((size_t)(rows - r0), (size_t)0x7fffffff / chunks);
    const unsigned grid = (unsigned)(chunks * nr);
    const float* xr = x + (size_t)r0 * inDim;
    float* orow = out + (size_t)r0 * outDim;
#define QL(KS_)                                                                                                            \
  LAUNCH((k_qgemv<DT, KS_, GLU>), grid, 32 * KS_, 0, xr, w, orow, nr, inDim, outDim, bias.p, bias.dt, acc, bfa)
    if (ks >= 8) QL(8);
    else if (ks >= 4) QL(4);
    else if (ks >= 2) QL(2);
    else QL(1);
#undef QL
    r0 += nr;
  }
  return NERVA_OK;
}

// A matmul over a quantized weight: the norm (when fused) into the workspace first, then the GEMV.
int qgemvRun(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias, const Fuse& f) {
  const int be = nvQuantBlockElems(w.dt);
  if (inDim % be != 0) return bad(ex, "matmul: a quantized weight's rows must be whole blocks (inDim a multiple of the block)");
  if (((uintptr_t)x & 15) != 0) return bad(ex, "matmul: x must be 16-byte aligned for a quantized weight");
  if (w.dt == NV_Q4_K && ((uintptr_t)w.p & 15) != 0) return bad(ex, "matmul: a Q4_K weight must be 16-byte aligned");
  if (((uintptr_t)w.p & 1) != 0) return bad(ex, "matmul: a quantized weight must be 2-byte aligned");
  const float* xr = x;
  if (f.nw.p) {
    if ((size_t)rows * inDim * sizeof(float) > ex->wsBytes) return bad(ex, "fused_matmul: workspace too small");
    int rc = launchRmsnorm(ex, rows, 256, x, f.nw.p, f.nw.dt, (float*)ex->ws, nullptr, inDim, f.eps, nullptr, nullptr);
    if (rc) return rc;
    xr = (const float*)ex->ws;
  }
  const int tiles = inDim / (w.dt == NV_Q4_K ? 64 : 32);
  const int ks = std::max(1, std::min(8, tiles / 32));
  const uint8_t* wp = (const uint8_t*)w.p;
  const int acc = f.accumulate ? 1 : 0;
#define QD(DT_) \
  return f.glu ? qgemvLaunch<DT_, true>(ex, ks, xr, wp, out, rows, inDim, outDim, bias, acc) : qgemvLaunch<DT_, false>(ex, ks, xr, wp, out, rows, inDim, outDim, bias, acc)
  switch (w.dt) {
    case NV_Q8_0: QD(NV_Q8_0);
    case NV_Q4_0: QD(NV_Q4_0);
    case NV_Q4_K: QD(NV_Q4_K);
    case NV_Q6_K: QD(NV_Q6_K);
    default: return bad(ex, "matmul: unknown quantized weight dtype");
  }
#undef QD
}

}  // namespace nerva::ops
