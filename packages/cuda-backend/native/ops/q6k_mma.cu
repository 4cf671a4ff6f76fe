// Decode matmuls over Q6_K weights on the integer tensor cores, to float32 grade: q4k_mma.cu's
// scheme (its header comment has the exactness argument) for ggml's 6-bit K-quant.
//
// A Q6_K super-block (SB, 210 bytes) holds 256 weights d * sc_s * (q - 32): ql[128] (low nibbles),
// qh[64] (2 high bits each), int8 sc[16] (one a 16-weight sub-block s), f16 d. Weight 128 n + 32 qd
// + l (n, qd < 4, l < 32): q = nibble qd >> 1 of ql[64 n + 32 (qd & 1) + l] | bits 2 qd of
// qh[32 n + l] << 4, sub-block s = 8 n + 2 qd + l / 16. So 32-element chunk c = 4 n + qd is two
// sub-blocks (2c, 2c + 1), while an mma k-step is 32: B's eight columns are the four activation
// terms x the chunk's two halves (column (k, h) holds term k for elements 16 h .. 16 h + 15 and
// zero for the other half), so one mma gives each sub-block's per-term sums apart. A = q as an
// unsigned byte (0..63, one mask a word for 4 weights); the -32 enters per sub-block as
// -32 sc_s sum(x in s) in float32 from x itself (like Q4_K's mins), the rest is exact int32 as for
// Q4_K, meeting in float32 once an SB times d.
//
// Blocks are 2-byte aligned (210-byte blocks), so registers cannot take them as vectors: each warp
// copies its items into a shared-memory ring with 16-byte cp.async of the 14 aligned granules that
// cover a row's block (each holds a byte of it, so nothing outside the tensor's allocation is
// read), and lanes read their bytes from there, a funnel shift fixing the 2-byte offset.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/cp_async.cuh"
#include "ops/kmma.cuh"
#include "ops/ops.h"
#include "ops/qepilogue.cuh"

namespace nerva::ops {

namespace {

constexpr int QK = KMMA_QK, QK_BYTES = 210;
constexpr int XT_SB = KMMA_XT_SB;
constexpr int ROWB = 224;         // a row's block in the ring: the 14 granules covering it
constexpr int SLOT = 16 * ROWB;   // an item: 16 rows
constexpr int SUMS = 16 + 1;      // floats an SB of sx and xsc

// 8 bytes at p (2-byte aligned, in shared memory) as two words.
__device__ __forceinline__ uint2 lds8(const uint8_t* p) {
  const uint32_t* q = reinterpret_cast<const uint32_t*>((uintptr_t)p & ~(uintptr_t)3);
  const int s = (int)((uintptr_t)p & 2) * 8;
  const uint32_t w0 = q[0], w1 = q[1], w2 = q[2];
  return make_uint2(__funnelshift_r(w0, w1, s), __funnelshift_r(w1, w2, s));
}

// qd's 4 quants a word (unsigned bytes 0..63) from the ql word (nibble qd >> 1) and the qh word.
template <int QD>
__device__ __forceinline__ uint32_t q6(uint32_t l, uint32_t h) {
  const uint32_t lo = (QD >> 1 ? l >> 4 : l) & 0x0F0F0F0Fu;
  const uint32_t hi = (QD == 0 ? h << 4 : QD == 1 ? h << 2 : QD == 2 ? h : h >> 2) & 0x30303030u;
  return lo | hi;
}

}  // namespace

// One block: KS warps split the SBs (warp w takes SBs w, w + KS, ...) over `per` consecutive
// outputs [o0, o0 + per) of activation row r, as k_q4k_mma: the block first turns its row of x
// into terms in shared memory, then each warp runs its items (16 weight rows x one SB, SB-major),
// streaming them through its ring of `stages` slots stages - 1 items ahead (the first before the
// dependency wait: weights only). GLU: the block's weight rows are its gates then its up rows.
// Partial sums meet in shared memory and qgemvEpilogue finishes, as in k_qgemv.
template <bool GLU>
__global__ void __launch_bounds__(512) k_q6k_mma(const float* __restrict__ x, const uint8_t* __restrict__ w, float* out, int rows,
                                                 int inDim, int outDim, int per, const void* bias, int bdt, int acc, int bfa,
                                                 int ldo, int oOff, const void* nw, int nwdt, float eps, float* xn, int stages) {
  NERVA_TRACE_KERNEL();
  extern __shared__ __align__(16) uint8_t sm[];
  const int KS = blockDim.x >> 5;
  const int sbs = inDim / QK;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int r = blockIdx.x % rows;
  const int o0 = (blockIdx.x / rows) * per;
  const int n = min(per, outDim - o0);
  const int nv = GLU ? 2 * n : n;  // weight rows of the block
  const int stride = GLU ? 2 * per : per;
  float* part = reinterpret_cast<float*>(sm);  // [KS][stride]
  uint8_t* xt = sm + (((size_t)KS * stride * sizeof(float) + 15) & ~(size_t)15);
  uint8_t* ring = xt + (size_t)sbs * XT_SB;  // [KS][stages][SLOT]
  float* sx = reinterpret_cast<float*>(ring + (size_t)KS * stages * SLOT);  // [sbs][16]: sum of x over each sub-block
  float* xsc = sx + (size_t)sbs * 16;                                        // [sbs]: 2^(E-30), NaN where x is not finite
  ring += (size_t)warp * stages * SLOT;
  const size_t rowBytes = (size_t)sbs * QK_BYTES;
  const int mine = (sbs - warp + KS - 1) / KS;  // this warp's SBs
  const int groups = (nv + 15) >> 4;
  const int items = groups * mine;  // (group, SB) pairs
  // Block row v's block at SB sb (v < nv).
  auto rowOf = [&](int v) { return GLU ? (v < n ? o0 + v : outDim + o0 + (v - n)) : o0 + v; };
  auto blockOf = [&](int v, int sb) -> const uint8_t* { return w + (size_t)rowOf(v) * rowBytes + (size_t)sb * QK_BYTES; };
  // The next item (in order: group fg of SB index fs) into its slot, two lanes a row (rows past
  // the block's are not copied: their sums are never stored), one commit group (committed even
  // when empty, so wait_group's count holds at the tail).
  int fg = 0, fs = 0, issued = 0, slotIn = 0;
  auto issue = [&]() {
    if (issued++ < items) {
      const int v = fg * 16 + (lane >> 1);
      if (v < nv) {
        const uint8_t* src = reinterpret_cast<const uint8_t*>((uintptr_t)blockOf(v, warp + fs * KS) & ~(uintptr_t)15);
        uint8_t* dst = ring + (size_t)slotIn * SLOT + (lane >> 1) * ROWB;
#pragma unroll
        for (int j = lane & 1; j < ROWB / 16; j += 2) cpAsync<16>(dst + 16 * j, src + 16 * j);
      }
      if (++slotIn == stages) slotIn = 0;
      if (++fg == groups) {
        fg = 0;
        fs++;
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  for (int s = 0; s < stages - 1; s++) issue();
  pdlWait();
  pdlTrigger();

  // The activations' terms (and the fused norm), with 16-element sub-block sums.
  kmmaSplitRow<16>(x + (size_t)r * inDim, sbs, nw, nwdt, eps, bfa, o0 == 0 ? xn : nullptr, r, xt, sx, xsc);
  __syncthreads();

  // The computed item's group and SB index, and the SB's activations as this lane holds them: the
  // mma's B fragments (column g: term g & 3 of half g >> 2, elements 8t .. 8t + 7 of each chunk,
  // so lanes whose elements lie in the other half hold zeros), the terms' weight and this lane's
  // four sub-block sums (half t >> 1 of the chunks c = t & 1, + 2, + 4, + 6).
  int grp = 0, si = 0, slotOut = 0;
  uint2 bx[8];
  float xs = 0.f, sxl[4];
  const bool live = (t >> 1) == (g >> 2);
  auto loadSb = [&]() {
    const int sb = warp + si * KS;
    const uint8_t* xb = xt + (size_t)sb * XT_SB + (g & 3) * 32 + 8 * t;
#pragma unroll
    for (int c = 0; c < 8; c++) {
      const uint2 v = *reinterpret_cast<const uint2*>(xb + c * 128);
      bx[c] = live ? v : make_uint2(0u, 0u);
    }
    // Lanes t = 0, 2 hold terms 0 (2^24) and 1 (2^16): f = 256 T0 + T1, so 2^16; t = 1, 3 terms
    // 2 (2^8) and 3: 1.
    xs = xsc[sb] * ((t & 1) ? 1.f : 65536.f);
#pragma unroll
    for (int i = 0; i < 4; i++) sxl[i] = sx[sb * 16 + 2 * (2 * i + (t & 1)) + (t >> 1)];
  };
  auto compute = [&](const uint8_t* slot) {
    const int sb = warp + si * KS;
    // This lane's rows g, g + 8: per half n the ql bytes 8t .. 8t + 7 of both 32-byte runs and
    // the qh bytes 8t .. 8t + 7; the scales of its half (t >> 1) of each chunk; d.
    uint2 l0[2][2], l1[2][2], hb[2][2];
    uint32_t scw[2][2];
    float d[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int v = grp * 16 + g + 8 * h;
      // The block's offset in its first granule (any row past the block's reads row 0's slot: its
      // sums are never stored).
      // (The low bits only: 32-bit arithmetic.)
      const int a = v < nv ? (int)(((uint32_t)(uintptr_t)w + (uint32_t)rowOf(v) * (uint32_t)rowBytes + (uint32_t)sb * QK_BYTES) & 15) : 0;
      const uint8_t* p = slot + (g + 8 * h) * ROWB + a;
#pragma unroll
      for (int m = 0; m < 2; m++) {
        l0[h][m] = lds8(p + 64 * m + 8 * t);
        l1[h][m] = lds8(p + 64 * m + 32 + 8 * t);
        hb[h][m] = lds8(p + 128 + 32 * m + 8 * t);
      }
      const uint2 s0 = lds8(p + 192), s1 = lds8(p + 200);
      const uint32_t sel = (t >> 1) ? 0x7531u : 0x6420u;  // the odd or the even scale bytes
      scw[h][0] = __byte_perm(s0.x, s0.y, sel);  // chunks 0..3
      scw[h][1] = __byte_perm(s1.x, s1.y, sel);  // chunks 4..7
      d[h] = __half2float(*reinterpret_cast<const __half*>(p + 208));
    }
    // sum_c sc * sum(q * t_k) over the lane's half of each chunk, terms 2 (t & 1) and 2 (t & 1) + 1.
    // Bounds: an mma sum is over 16 elements, |q t| <= 63 * 128: |C| <= 129,024 < 2^17; times
    // |sc| <= 128 and over 8 chunks: |T| <= 132,120,576 < 2^27, far inside int32.
    int T[2][2] = {{0, 0}, {0, 0}};
#pragma unroll
    for (int c = 0; c < 8; c++) {
      const int m = c >> 2;
      uint32_t A[2][2];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const uint2 l = (c & 1) ? l1[h][m] : l0[h][m], hh = hb[h][m];
#define Q6W(QD_)                     \
  A[h][0] = q6<QD_>(l.x, hh.x);      \
  A[h][1] = q6<QD_>(l.y, hh.y);
        switch (c & 3) {
          case 0: Q6W(0) break;
          case 1: Q6W(1) break;
          case 2: Q6W(2) break;
          default: Q6W(3) break;
        }
#undef Q6W
      }
      int cc[4] = {0, 0, 0, 0};
      immaU8S8(cc, A[0][0], A[1][0], A[0][1], A[1][1], bx[c].x, bx[c].y);
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int s = (int)(int8_t)(scw[h][c >> 2] >> (8 * (c & 3)));
        T[h][0] += s * cc[2 * h];
        T[h][1] += s * cc[2 * h + 1];
      }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const float f = fmaf((float)T[h][0], 256.f, (float)T[h][1]);
      // The -32 offset: this lane's chunks c = t & 1, + 2, + 4, + 6 of its half.
      float ms = 0.f;
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int c = 2 * i + (t & 1);
        ms = fmaf((float)(int)(int8_t)(scw[h][c >> 2] >> (8 * (c & 3))), sxl[i], ms);
      }
      float y = d[h] * fmaf(-32.f, ms, f * xs);
      // The row's sum over the lanes of its quad, into the warp's partial sums (the first SB stores).
      y += __shfl_xor_sync(0xffffffffu, y, 1);
      y += __shfl_xor_sync(0xffffffffu, y, 2);
      const int v = grp * 16 + g + 8 * h;
      if (t == 0 && v < nv) {
        float* q = part + warp * stride + (GLU ? (v < n ? 2 * v : 2 * (v - n) + 1) : v);
        *q = si == 0 ? y : *q + y;
      }
    }
  };
  if (items > 0) loadSb();
  for (int i = 0; i < items; i++) {
    // Item i's copies have landed for this lane; after the warp barrier, for the warp's lanes,
    // which are also all done with the slot the next issue refills (item i - 1's).
    cpWait(stages - 2);
    __syncwarp();
    issue();
    compute(ring + (size_t)slotOut * SLOT);
    if (++slotOut == stages) slotOut = 0;
    if (++grp == groups) {
      grp = 0;
      si++;
      if (si < mine) loadSb();
    }
  }
  __syncthreads();
  qgemvEpilogue<GLU>(part, KS, stride, n, o0, bias, bdt, acc, bfa, out, r, ldo, oOff);
}

namespace {

// The launch shape: warps, ring slots and shared memory, for outputs `per` (0: the largest a
// launch takes). stages 0: rows this long do not fit.
struct Q6kShape {
  int ks, stages;
  size_t smem;
};

Q6kShape q6kShape(const NervaExec* ex, int inDim, int per, bool glu) {
  const int sbs = inDim / QK;
  const size_t stride = per > 0 ? (size_t)per * (glu ? 2 : 1) : 256;
  // (- 64: the fused norm's static per-warp sums.)
  const size_t limit = (size_t)ex->smemOptin - 64;
  // Fewer warps where 16 warps' rings do not fit beside a long row's terms; up to 4 slots a warp.
  for (int ks = kmmaWarps(sbs);; ks /= 2) {
    const size_t fixed = (((size_t)ks * stride * sizeof(float) + 15) & ~(size_t)15) + (size_t)sbs * (XT_SB + SUMS * sizeof(float));
    for (int stages = 4; stages >= 2; stages--) {
      const size_t smem = fixed + (size_t)ks * stages * SLOT;
      if (smem <= limit) return {ks, stages, smem};
    }
    if (ks <= 4) break;
  }
  return {0, 0, 0};
}

template <bool GLU>
int q6kLaunch(NervaExec* ex, unsigned grid, const Q6kShape& sh, const float* x, const uint8_t* w, float* out, int rows, int inDim,
              int outDim, int per, Buf bias, int acc, int bfa, int ldo, int oOff, Buf nw, float eps, float* xn) {
  auto fn = k_q6k_mma<GLU>;
  if (allowDynamicSmem(fn, sh.smem) != cudaSuccess) {
    cudaGetLastError();
    return bad(ex, "matmul: the Q6_K GEMV's shared memory could not be raised");
  }
  LAUNCH(fn, grid, 32 * sh.ks, sh.smem, x, w, out, rows, inDim, outDim, per, bias.p, bias.dt, acc, bfa, ldo, oOff, (const void*)nw.p,
         nw.dt, eps, xn, sh.stages);
  return NERVA_OK;
}

}  // namespace

bool q6kMmaFits(const NervaExec* ex, int inDim) {
  return inDim > 0 && inDim % QK == 0 && q6kShape(ex, inDim, 0, false).stages > 0;
}

int q6kMmaRun(NervaExec* ex, const float* x, const uint8_t* w, float* out, int rows, int inDim, int outDim, Buf bias, int acc,
              bool glu, int ldo, int oOff, Buf nw, float eps, float* xn) {
  if (inDim % QK != 0) return bad(ex, "matmul: a Q6_K weight's rows must be whole blocks (inDim a multiple of 256)");
  if (((uintptr_t)w & 1) != 0) return bad(ex, "matmul: a Q6_K weight must be 2-byte aligned");
  const int per = kmmaPer(ex, outDim, glu);
  const Q6kShape sh = q6kShape(ex, inDim, per, glu);
  if (sh.stages == 0) return bad(ex, "matmul: a Q6_K weight's rows are too long for the tensor-core GEMV's shared memory");
  const size_t chunks = (size_t)(outDim + per - 1) / per;
  const int bfa = ex->bf16act ? 1 : 0;
  for (int r0 = 0; r0 < rows;) {
    const int nr = (int)std::min<size_t>((size_t)(rows - r0), (size_t)0x7fffffff / chunks);
    const unsigned grid = (unsigned)(chunks * nr);
    const float* xr = x + (size_t)r0 * inDim;
    float* orow = out + (size_t)r0 * ldo;
    float* xnr = xn && nw.p ? xn + (size_t)r0 * inDim : nullptr;
    const int rc = glu ? q6kLaunch<true>(ex, grid, sh, xr, w, orow, nr, inDim, outDim, per, bias, acc, bfa, ldo, oOff, nw, eps, xnr)
                       : q6kLaunch<false>(ex, grid, sh, xr, w, orow, nr, inDim, outDim, per, bias, acc, bfa, ldo, oOff, nw, eps, xnr);
    if (rc) return rc;
    r0 += nr;
  }
  return NERVA_OK;
}

}  // namespace nerva::ops
