// What the K-quant GEMVs on the integer tensor cores (q4k_mma.cu, q6k_mma.cu) share: the mma, the
// activations' split into a power-of-two scale and four signed byte digits (the B operand), and
// the launch shape. The exactness argument is q4k_mma.cu's header comment.
#pragma once
#include <algorithm>

#include "common/elem.cuh"
#include "common/exec.cuh"

namespace nerva::ops {

constexpr int KMMA_QK = 256;         // elements a super-block (SB)
constexpr int KMMA_XT_SB = 8 * 4 * 32;  // an SB's activation terms in shared memory: [32-element chunk][term][32 bytes]

// D = A * B + D: m16n8k32, A unsigned bytes (row-major), B signed bytes (column-major), int32.
__device__ __forceinline__ void immaU8S8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Byte 0 of a, b, c, d packed into one word.
__device__ __forceinline__ uint32_t kmmaPack4(int a, int b, int c, int d) {
  return __byte_perm(__byte_perm((uint32_t)a, (uint32_t)b, 0x0040), __byte_perm((uint32_t)c, (uint32_t)d, 0x0040), 0x5410);
}

// Activation row xr (sbs SBs) into terms, by the block's KS warps (warp w takes SBs w, w + KS, ...):
// xt [sbs][KMMA_XT_SB], sx [sbs][256 / SUMW] (sums of x over SUMW-element sub-blocks: 32 for Q4_K's
// mins, 16 for Q6_K's -32 offset), xsc [sbs] (2^(E-30), NaN where x is not finite). A fused RMSNorm
// (nw set): the row's sum of squares, each warp over its SBs, the warps' sums in order (every
// block computes the same inverse), then each activation as k_rmsnorm writes it; xn set: the
// normalized row is also written to its row r (for a tail of another type). The caller syncs after.
template <int SUMW>
__device__ __forceinline__ void kmmaSplitRow(const float* xr, int sbs, const void* nw, int nwdt, float eps, int bfa, float* xn, int r,
                                             uint8_t* xt, float* sx, float* xsc) {
  static_assert(SUMW == 16 || SUMW == 32, "sub-block sums of 16 or 32 elements");
  const int KS = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int inDim = sbs * KMMA_QK;
  float inv = 1.f;
  if (nw) {
    __shared__ float ssw[16];
    float ss = 0.f;
    for (int sb = warp; sb < sbs; sb += KS) {
      const float4 v0 = *reinterpret_cast<const float4*>(xr + sb * KMMA_QK + 8 * lane);
      const float4 v1 = *reinterpret_cast<const float4*>(xr + sb * KMMA_QK + 8 * lane + 4);
      ss += v0.x * v0.x + v0.y * v0.y + v0.z * v0.z + v0.w * v0.w + v1.x * v1.x + v1.y * v1.y + v1.z * v1.z + v1.w * v1.w;
    }
    ss = warpSum(ss);
    if (lane == 0) ssw[warp] = ss;
    __syncthreads();
    ss = 0.f;
    for (int k = 0; k < KS; k++) ss += ssw[k];
    inv = rsqrtf(ss / (float)inDim + eps);
  }
  // A warp an SB, a lane 8 consecutive elements (a quarter of a 32-element chunk).
  for (int sb = warp; sb < sbs; sb += KS) {
    const float4 v0 = *reinterpret_cast<const float4*>(xr + sb * KMMA_QK + 8 * lane);
    const float4 v1 = *reinterpret_cast<const float4*>(xr + sb * KMMA_QK + 8 * lane + 4);
    float e[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    if (nw) {
#pragma unroll
      for (int i = 0; i < 8; i++) e[i] = bfr(bfr(e[i] * inv, bfa) * ldf(nw, nwdt, (size_t)sb * KMMA_QK + 8 * lane + i), bfa);
      if (xn) {
        float4* d = reinterpret_cast<float4*>(xn + (size_t)r * inDim + sb * KMMA_QK + 8 * lane);
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
    uint8_t* dst = xt + (size_t)sb * KMMA_XT_SB + sub * 128 + q8;
    // Term 0 is the most significant (t0 = d3).
    *reinterpret_cast<uint2*>(dst + 0 * 32) = make_uint2(kmmaPack4(d3[0], d3[1], d3[2], d3[3]), kmmaPack4(d3[4], d3[5], d3[6], d3[7]));
    *reinterpret_cast<uint2*>(dst + 1 * 32) = make_uint2(kmmaPack4(d2[0], d2[1], d2[2], d2[3]), kmmaPack4(d2[4], d2[5], d2[6], d2[7]));
    *reinterpret_cast<uint2*>(dst + 2 * 32) = make_uint2(kmmaPack4(d1[0], d1[1], d1[2], d1[3]), kmmaPack4(d1[4], d1[5], d1[6], d1[7]));
    *reinterpret_cast<uint2*>(dst + 3 * 32) = make_uint2(kmmaPack4(d0[0], d0[1], d0[2], d0[3]), kmmaPack4(d0[4], d0[5], d0[6], d0[7]));
    s8 += __shfl_xor_sync(0xffffffffu, s8, 1);
    if constexpr (SUMW == 16) {
      if ((lane & 1) == 0) sx[sb * 16 + (lane >> 1)] = s8;
    } else {
      s8 += __shfl_xor_sync(0xffffffffu, s8, 2);
      if ((lane & 3) == 0) sx[sb * 8 + sub] = s8;
    }
    if (lane == 0) xsc[sb] = finite ? __uint_as_float((uint32_t)(97 + E) << 23) : __uint_as_float(0x7fc00000u);
  }
}

// Warps a block: one an SB up to 16; past that a divisor of the SB count in [8, 16] where there is
// one (every warp the same number of SBs), else 16.
inline int kmmaWarps(int sbs) {
  int ks = std::min(sbs, 16);
  if (sbs > 16) {
    for (int d = 16; d >= 8; d--)
      if (sbs % d == 0) return d;
  }
  return ks;
}

// Outputs a block: whole groups of 16 weight rows, about one block an SM (in as many waves as keep
// a block's partial sums within 16 groups a warp, so a block's weight rows are at most 256).
inline int kmmaPer(const NervaExec* ex, int outDim, bool glu) {
  const long long groups = ((long long)outDim * (glu ? 2 : 1) + 15) / 16;
  long long gpb = std::max<long long>(1, (groups + ex->smCount - 1) / ex->smCount);
  if (gpb > 16) gpb = (groups + ex->smCount * ((gpb + 15) / 16) - 1) / (ex->smCount * ((gpb + 15) / 16));
  return (int)std::min<long long>(outDim, gpb * (glu ? 8 : 16));
}

}  // namespace nerva::ops
