// Decode matmuls over Q4_K weights on the integer tensor cores, to float32 grade.
//
// Why: the float GEMV (qgemv.cu) spends ~3.4 instructions a Q4_K weight (unpack, make a float,
// FMA) and is issue-bound at 0.2-0.5 of the copy bandwidth. Here the weights' 4-bit quants enter
// an int8 mma as they are (one mask a word for 8 weights) and the activations are split into
// integer terms instead of being rounded to 8 bits as llama.cpp does:
//
//   each 256-element super-block (SB) of x gets a power-of-two scale 2^(E-30) with max|x| < 2^E,
//   X = rint(x * 2^(30-E)) (|X| < 2^30, the float's 24 significant bits kept, so the error is at
//   most 2^-31 of the SB's largest activation), and X = t0 2^24 + t1 2^16 + t2 2^8 + t3 with
//   signed byte digits t0..t3: the mma's B holds the four terms as four of its eight columns.
//
// Per 32-element sub-block j of a weight row the mma gives sum(q * t_k) exactly (int32), which
// is weighted by the sub-block's integer scale sc_j, still exact; per SB the four terms meet in
// float32 (one rounding each, relative 2^-24), times d and the activations' scale. The mins part,
// dmin * sum_j m_j * sum(x in j), is float32 from x itself. So the result differs from the float
// reference only by float32 rounding and the 2^-31 split, not by a quantization of x; the
// conformance block cases hold it to the f32 bound (relTol 1e-4) like every other matmul.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/ops.h"
#include "ops/qepilogue.cuh"

namespace nerva::ops {

namespace {

constexpr int QK = 256, QK_BYTES = 144;
constexpr int XT_SB = 8 * 4 * 32;  // an SB's activation terms in shared memory: [sub-block][term][32 bytes]

// D = A * B + D: m16n8k32, A unsigned bytes (row-major), B signed bytes (column-major), int32.
__device__ __forceinline__ void immaU8S8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A weight load of the stream, asking L2 to fill 256 bytes from memory: the block's warps read a
// row's neighbouring super-blocks at about the same time (8B Q4_K_M +1 %). L1 keeps its lines:
// an even super-block's 32-byte quant groups straddle two sectors, the second read from L1 by the
// next group (L1::no_allocate as well lost 15 %).
__device__ __forceinline__ uint4 ldW4(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ldW2(const uint8_t* p) {
  uint2 v;
  asm("ld.global.nc.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// Byte 0 of a, b, c, d packed into one word.
__device__ __forceinline__ uint32_t pack4(int a, int b, int c, int d) {
  return __byte_perm(__byte_perm((uint32_t)a, (uint32_t)b, 0x0040), __byte_perm((uint32_t)c, (uint32_t)d, 0x0040), 0x5410);
}

// One work item's weights as a lane holds them: 16 weight rows (the mma's A rows; this lane's are
// g and g + 8) of one SB. Per row: the 16-byte head (d, dmin, 12 scale
// bytes) and, of each of the four 32-byte qs chunks, the 8 bytes at 8t (low nibbles: sub-block 2c,
// high: 2c + 1).
struct Q4kItem {
  uint4 head[2];
  uint2 q[2][4];
};

}  // namespace

// One block: KS warps split the SBs (warp w takes SBs w, w + KS, ...) over `per` consecutive
// outputs [o0, o0 + per) of activation row r; the block first turns its row of x into terms in
// shared memory, then each warp runs its items (16 weight rows x one SB, SB-major: the SB's
// activation terms stay in registers across its groups), two in flight in registers. GLU: the
// block's weight rows are its gates then its up rows. Partial sums meet in shared memory and
// qgemvEpilogue finishes (bias, GLU, accumulate, bf16 numerics), as in k_qgemv.
//
// Measured against two other forms on the H200 (Qwen3-8B projections, one row, fraction of the
// copy bandwidth; qkv / o / gate_up / down / LM head): this one 0.21 / 0.29 / 0.39 / 0.62 / 0.72;
// weights through a per-warp cp.async ring in shared memory (4 slots) 0.20 / 0.35 / 0.39 / 0.50 /
// 0.61; the ring plus the next item's slot read ahead 0.21 / 0.29 / 0.38 / 0.48 / 0.60; this form
// plus each warp asking the item 6 ahead into L2 (cp.async.bulk.prefetch) 0.22 / 0.36 / 0.34 /
// 0.49 / 0.50; three items in flight (each row's head a word a lane, shuffled within the quad; B
// read from shared memory per item) 0.22 / 0.30 / 0.40 / 0.57 / 0.63. Profiled (gate_up), this form waits on its global loads most of its time (long
// scoreboard 3.7 of 9.7 cycles an instruction, 4 warps a scheduler at 120 registers).
// ONE_SB (every warp one SB: rows of up to 4096): the warp reads its norm weights before the
// dependency wait and its activations once for the norm and the terms, and waits only for its own
// terms, not for the block's; with the rows' addresses from two bases and the scales picked by
// PRMT, an item takes ~230 instructions instead of ~300. What a launch does after its wait is its
// chain: H200, synthetic Q4_K_M, tok/s: 0.6B 1410-1416 before these, 1510-1514 with all but the
// early norm weights, 1660-1678 with them; 8B 365.5-366.4, 373.2-374.0, 392.7; the same tokens.
template <bool GLU, bool ONE_SB>
__global__ void __launch_bounds__(512) k_q4k_mma(const float* __restrict__ x, const uint8_t* __restrict__ w, float* out, int rows,
                                                 int inDim, int outDim, int per, const void* bias, int bdt, int acc, int bfa,
                                                 int ldo, int oOff, const void* nw, int nwdt, float eps, float* xn, int accPre) {
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
  float* sx = reinterpret_cast<float*>(xt + (size_t)sbs * XT_SB);  // [sbs][8]: sum of x over each sub-block
  float* xsc = sx + (size_t)sbs * 8;                               // [sbs]: 2^(E-30), NaN where x is not finite
  const size_t rowBytes = (size_t)sbs * QK_BYTES;
  const int mine = (sbs - warp + KS - 1) / KS;  // this warp's SBs
  const int groups = (nv + 15) >> 4;
  const int items = groups * mine;  // (group, SB) pairs
  // Block row v's weights start at wGate + v * rowBytes, GLU's up rows (v >= n) upOff further on
  // (32 bits: q4kMmaRun keeps a weight under 4 GiB). A row past the block's copies row 0: computed,
  // never stored.
  const uint8_t* wGate = w + (size_t)o0 * rowBytes;
  const uint32_t upOff = GLU ? (uint32_t)((size_t)(outDim - n) * rowBytes) : 0u;
  // Items are fetched in order; (fg, fs) is the next fetched one's group and SB index.
  int fg = 0, fs = 0, fetched = 0;
  auto fetch = [&](Q4kItem& it) {
    if (fetched++ >= items) return;
    const uint32_t sbOff = (uint32_t)(warp + fs * KS) * QK_BYTES;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int v = fg * 16 + g + 8 * h;
      if (v >= nv) v = 0;
      const uint8_t* b = wGate + ((size_t)v * rowBytes + sbOff + (GLU && v >= n ? upOff : 0u));
      it.head[h] = ldW4(b);
#pragma unroll
      for (int c = 0; c < 4; c++) it.q[h][c] = ldW2(b + 16 + 32 * c + 8 * t);
    }
    if (ONE_SB) {
      fg++;  // one SB a warp: the items are its groups
    } else if (++fg == groups) {
      fg = 0;
      fs++;
    }
  };
  Q4kItem ra, rb;
  fetch(ra);  // weights only: before the dependency wait
  fetch(rb);
  // One SB a warp with a fused norm: the lane's eight norm weights, read before the wait (they are
  // the model's, not the previous kernel's).
  float nwv[8];
  if (ONE_SB && nw) {
#pragma unroll
    for (int i = 0; i < 8; i++) nwv[i] = ldf(nw, nwdt, (size_t)warp * QK + 8 * lane + i);
  }
  // accPre: the values this block accumulates into, read before the wait.
  const QPre pre = qgemvPre(accPre && acc, n, out, r, ldo, oOff, o0);
  pdlWait();
  pdlTrigger();

  const float* xr = x + (size_t)r * inDim;
  // One SB a warp: the warp's eight activations a lane are read once, for the norm and the terms.
  float4 o0v, o1v;
  if (ONE_SB) {
    o0v = *reinterpret_cast<const float4*>(xr + warp * QK + 8 * lane);
    o1v = *reinterpret_cast<const float4*>(xr + warp * QK + 8 * lane + 4);
  }
  // A fused RMSNorm (nw set): the row's sum of squares, each warp over its SBs, the warps' sums in
  // order (every block computes the same inverse), then each activation as k_rmsnorm writes it.
  float inv = 1.f;
  if (nw) {
    __shared__ float ssw[16];
    float ss = 0.f;
    for (int sb = warp; sb < sbs; sb += KS) {
      const float4 v0 = ONE_SB ? o0v : *reinterpret_cast<const float4*>(xr + sb * QK + 8 * lane);
      const float4 v1 = ONE_SB ? o1v : *reinterpret_cast<const float4*>(xr + sb * QK + 8 * lane + 4);
      ss += v0.x * v0.x + v0.y * v0.y + v0.z * v0.z + v0.w * v0.w + v1.x * v1.x + v1.y * v1.y + v1.z * v1.z + v1.w * v1.w;
    }
    ss = warpSum(ss);
    if (lane == 0) ssw[warp] = ss;
    __syncthreads();
    ss = 0.f;
    for (int k = 0; k < KS; k++) ss += ssw[k];
    inv = rsqrtf(ss / (float)inDim + eps);
  }
  // The activations' terms: a warp an SB, a lane 8 consecutive elements (a quarter sub-block).
  for (int sb = warp; sb < sbs; sb += KS) {
    const float4 v0 = ONE_SB ? o0v : *reinterpret_cast<const float4*>(xr + sb * QK + 8 * lane);
    const float4 v1 = ONE_SB ? o1v : *reinterpret_cast<const float4*>(xr + sb * QK + 8 * lane + 4);
    float e[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    if (nw) {
#pragma unroll
      for (int i = 0; i < 8; i++) e[i] = bfr(bfr(e[i] * inv, bfa) * (ONE_SB ? nwv[i] : ldf(nw, nwdt, (size_t)sb * QK + 8 * lane + i)), bfa);
      // The normalized row for a tail of another type (xn): written by the row's first block.
      if (xn && o0 == 0) {
        float4* d = reinterpret_cast<float4*>(xn + (size_t)r * inDim + sb * QK + 8 * lane);
        d[0] = make_float4(e[0], e[1], e[2], e[3]);
        d[1] = make_float4(e[4], e[5], e[6], e[7]);
      }
    }
    float m = 0.f, s8 = 0.f;
    bool finite = true;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      m = fmaxf(m, fabsf(e[i]));
      s8 += e[i];
      finite = finite && isfinite(e[i]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    finite = __all_sync(0xffffffffu, finite);
    // max|x| < 2^E (E from m's exponent field; zero and subnormal SBs take the smallest E, whose
    // scale 2^126 still maps every subnormal below 1).
    int E = (int)((__float_as_uint(m) >> 23) & 0xFF) - 126;
    E = max(E, -96);
    const float up = __uint_as_float((uint32_t)(157 - E) << 23);  // 2^(30-E)
    int d0[8], d1[8], d2[8], d3[8];  // digits, least significant first: X = d3 2^24 + d2 2^16 + d1 2^8 + d0
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const int X = finite ? __float2int_rn(e[i] * up) : 0;
      // Balanced bytes: the low byte read as signed, the rest carried (arithmetic shifts).
      d0[i] = X;
      d1[i] = (X + 128) >> 8;
      d2[i] = (d1[i] + 128) >> 8;
      d3[i] = (d2[i] + 128) >> 8;
    }
    const int sub = lane >> 2, q8 = 8 * (lane & 3);
    uint8_t* dst = xt + (size_t)sb * XT_SB + sub * 128 + q8;
    // Term 0 is the most significant (t0 = d3).
    *reinterpret_cast<uint2*>(dst + 0 * 32) = make_uint2(pack4(d3[0], d3[1], d3[2], d3[3]), pack4(d3[4], d3[5], d3[6], d3[7]));
    *reinterpret_cast<uint2*>(dst + 1 * 32) = make_uint2(pack4(d2[0], d2[1], d2[2], d2[3]), pack4(d2[4], d2[5], d2[6], d2[7]));
    *reinterpret_cast<uint2*>(dst + 2 * 32) = make_uint2(pack4(d1[0], d1[1], d1[2], d1[3]), pack4(d1[4], d1[5], d1[6], d1[7]));
    *reinterpret_cast<uint2*>(dst + 3 * 32) = make_uint2(pack4(d0[0], d0[1], d0[2], d0[3]), pack4(d0[4], d0[5], d0[6], d0[7]));
    s8 += __shfl_xor_sync(0xffffffffu, s8, 1);
    s8 += __shfl_xor_sync(0xffffffffu, s8, 2);
    if ((lane & 3) == 0) sx[sb * 8 + sub] = s8;
    if (lane == 0) xsc[sb] = finite ? __uint_as_float((uint32_t)(97 + E) << 23) : __uint_as_float(0x7fc00000u);
  }
  // One SB a warp reads back only the terms it wrote (its loadSb); the epilogue's partial sums
  // meet behind the barrier after the items.
  if (ONE_SB)
    __syncwarp();
  else
    __syncthreads();

  // The computed item's group and SB index, and the SB's activations as this lane holds them:
  // the mma's B fragments (term (g & 3) of each sub-block, elements 8t .. 8t + 7; lanes g >= 4
  // fill unused columns), the terms' weights and this lane's two mins sub-block sums.
  int grp = 0, si = 0;
  uint2 bx[8];
  float xs = 0.f, sxa = 0.f, sxb = 0.f;
  auto loadSb = [&]() {
    const int sb = warp + si * KS;
    const uint8_t* xb = xt + (size_t)sb * XT_SB + (g & 3) * 32 + 8 * t;
#pragma unroll
    for (int j = 0; j < 8; j++) bx[j] = *reinterpret_cast<const uint2*>(xb + j * 128);
    // t = 0 holds t0 (2^24) and t1 (2^16), t = 1 holds t2 (2^8) and t3; f = 256 T_a + T_b, so 2^16
    // (t = 0) or 1 (t = 1), and 1/16 for the high nibbles' factor (T = 16 lo + hi is 16x the sum).
    xs = xsc[sb] * (t == 0 ? 4096.f : t == 1 ? 0.0625f : 0.f);
    sxa = sx[sb * 8 + 2 * t];
    sxb = sx[sb * 8 + 2 * t + 1];
  };
  auto compute = [&](const Q4kItem& it) {
    uint32_t scw[2][2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const uint32_t w0 = it.head[h].y, w2 = it.head[h].w;
      scw[h][0] = w0 & 0x3F3F3F3Fu;                                   // sub-blocks 0..3
      scw[h][1] = (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u);     // 4..7
    }
    // sum_j sc_j * sum(q * t_k) for the low-nibble (even) and the high-nibble (odd) sub-blocks
    // apart: a high nibble enters the mma as 16 q (w & 0xF0: no shift), folded in below.
    int lo[2][2] = {{0, 0}, {0, 0}}, hi[2][2] = {{0, 0}, {0, 0}};
#pragma unroll
    for (int c = 0; c < 4; c++) {
      int cl[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
      immaU8S8(cl, it.q[0][c].x & 0x0F0F0F0Fu, it.q[1][c].x & 0x0F0F0F0Fu, it.q[0][c].y & 0x0F0F0F0Fu,
               it.q[1][c].y & 0x0F0F0F0Fu, bx[2 * c].x, bx[2 * c].y);
      immaU8S8(ch, it.q[0][c].x & 0xF0F0F0F0u, it.q[1][c].x & 0xF0F0F0F0u, it.q[0][c].y & 0xF0F0F0F0u,
               it.q[1][c].y & 0xF0F0F0F0u, bx[2 * c + 1].x, bx[2 * c + 1].y);
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const uint32_t sw = scw[h][c >> 1];
        // Bytes of sw (already 6-bit): one PRMT each.
        const int sl = (int)__byte_perm(sw, 0u, 0x4440u | (unsigned)((2 * c) & 3));
        const int sh = (int)__byte_perm(sw, 0u, 0x4440u | (unsigned)((2 * c + 1) & 3));
        lo[h][0] += sl * cl[2 * h];
        lo[h][1] += sl * cl[2 * h + 1];
        hi[h][0] += sh * ch[2 * h];
        hi[h][1] += sh * ch[2 * h + 1];
      }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int Ta = 16 * lo[h][0] + hi[h][0], Tb = 16 * lo[h][1] + hi[h][1];
      const float f = fmaf((float)Ta, 256.f, (float)Tb);
      const uint32_t hx = it.head[h].x, w1 = it.head[h].z, w2 = it.head[h].w;
      const float d = __half2float(__ushort_as_half((uint16_t)(hx & 0xFFFF)));
      const float dmin = __half2float(__ushort_as_half((uint16_t)(hx >> 16)));
      // Mins: this lane takes sub-blocks 2t and 2t + 1.
      const uint32_t mw = t < 2 ? (w1 & 0x3F3F3F3Fu) : (((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u));
      const unsigned sel = 0x4440u | (unsigned)(2 * (t & 1));  // this lane's mins: bytes 2 (t & 1) and the next
      const float ms = fmaf((float)__byte_perm(mw, 0u, sel), sxa, (float)__byte_perm(mw, 0u, sel + 1u) * sxb);
      float y = fmaf(-dmin, ms, f * (d * xs));
      // The row's sum over the lanes of its quad, into the warp's partial sums (the first SB stores).
      y += __shfl_xor_sync(0xffffffffu, y, 1);
      y += __shfl_xor_sync(0xffffffffu, y, 2);
      const int v = grp * 16 + g + 8 * h;
      if (t == 0 && v < nv) {
        float* p = part + warp * stride + (GLU ? (v < n ? 2 * v : 2 * (v - n) + 1) : v);
        *p = ONE_SB || si == 0 ? y : *p + y;
      }
    }
  };
  if (items > 0) loadSb();
  auto step = [&](const Q4kItem& it) {
    compute(it);
    if (ONE_SB) {
      grp++;
    } else if (++grp == groups) {
      grp = 0;
      si++;
      if (si < mine) loadSb();
    }
  };
  for (int i = 0; i < items; i += 2) {
    step(ra);
    fetch(ra);
    if (i + 1 < items) {
      step(rb);
      fetch(rb);
    }
  }
  __syncthreads();
  qgemvEpilogue<GLU>(part, KS, stride, n, o0, bias, bdt, acc, bfa, out, r, ldo, oOff, pre);
}

template <bool GLU>
static int q4kLaunch(NervaExec* ex, bool one, unsigned grid, int ks, size_t smem, const float* x, const uint8_t* w, float* out, int rows,
                     int inDim, int outDim, int per, Buf bias, int acc, int bfa, int ldo, int oOff, Buf nw, float eps, float* xn,
                     int accPre) {
  auto fn = one ? k_q4k_mma<GLU, true> : k_q4k_mma<GLU, false>;
  if (allowDynamicSmem(fn, smem) != cudaSuccess) {
    cudaGetLastError();
    return bad(ex, "matmul: the Q4_K GEMV's shared memory could not be raised");
  }
  LAUNCH(fn, grid, 32 * ks, smem, x, w, out, rows, inDim, outDim, per, bias.p, bias.dt, acc, bfa, ldo, oOff, (const void*)nw.p, nw.dt, eps, xn,
         accPre);
  return NERVA_OK;
}

int q4kMmaRun(NervaExec* ex, const float* x, const uint8_t* w, float* out, int rows, int inDim, int outDim, Buf bias, int acc,
              bool glu, int ldo, int oOff, Buf nw, float eps, float* xn, int accPre) {
  if (inDim % QK != 0) return bad(ex, "matmul: a Q4_K weight's rows must be whole blocks (inDim a multiple of 256)");
  if (((uintptr_t)w & 15) != 0) return bad(ex, "matmul: a Q4_K weight must be 16-byte aligned");
  if ((size_t)outDim * (glu ? 2 : 1) * (inDim / QK) * QK_BYTES > 0xFFFFFFFFull)
    return bad(ex, "matmul: a Q4_K weight over 4 GiB (the GEMV addresses its rows by 32-bit offsets)");
  const int sbs = inDim / QK;
  // Warps a block: one an SB up to 16; past that a divisor of the SB count in [8, 16] where there
  // is one (every warp the same number of SBs), else 16.
  int ks = std::min(sbs, 16);
  if (sbs > 16) {
    for (int d = 16; d >= 8; d--)
      if (sbs % d == 0) {
        ks = d;
        break;
      }
  }
  // Outputs a block: whole groups of 16 weight rows, about one block an SM (in as many waves as
  // keep a block's partial sums within 16 groups a warp).
  const long long groups = ((long long)outDim * (glu ? 2 : 1) + 15) / 16;
  long long gpb = std::max<long long>(1, (groups + ex->smCount - 1) / ex->smCount);
  if (gpb > 16) gpb = (groups + ex->smCount * ((gpb + 15) / 16) - 1) / (ex->smCount * ((gpb + 15) / 16));
  const int per = (int)std::min<long long>(outDim, gpb * (glu ? 8 : 16));
  const size_t chunks = (size_t)(outDim + per - 1) / per;
  const int stride = per * (glu ? 2 : 1);
  const size_t smem = (((size_t)ks * stride * sizeof(float) + 15) & ~(size_t)15) + (size_t)sbs * (XT_SB + 9 * sizeof(float));
  // (+ 64: the fused norm's static per-warp sums.)
  if (smem + 64 > (size_t)ex->smemOptin) return bad(ex, "matmul: a Q4_K weight's rows are too long for the GEMV's shared memory");
  const int bfa = ex->bf16act ? 1 : 0;
  for (int r0 = 0; r0 < rows;) {
    const int nr = (int)std::min<size_t>((size_t)(rows - r0), (size_t)0x7fffffff / chunks);
    const unsigned grid = (unsigned)(chunks * nr);
    const float* xr = x + (size_t)r0 * inDim;
    float* orow = out + (size_t)r0 * ldo;
    float* xnr = xn && nw.p ? xn + (size_t)r0 * inDim : nullptr;
    // Every warp one SB (sbs <= ks): the kernel's lean form.
    const bool one = sbs <= ks;
    const int rc = glu ? q4kLaunch<true>(ex, one, grid, ks, smem, xr, w, orow, nr, inDim, outDim, per, bias, acc, bfa, ldo, oOff, nw, eps, xnr, accPre)
                       : q4kLaunch<false>(ex, one, grid, ks, smem, xr, w, orow, nr, inDim, outDim, per, bias, acc, bfa, ldo, oOff, nw, eps, xnr, accPre);
    if (rc) return rc;
    r0 += nr;
  }
  return NERVA_OK;
}

}  // namespace nerva::ops
