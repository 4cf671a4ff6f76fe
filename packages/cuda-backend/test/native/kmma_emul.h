// Shared by the K-quant tensor-core GEMV emulations (q4k_mma_test.cc, q6k_mma_test.cc): the
// activations' split as kmmaSplitRow leaves it (ops/kmma.cuh), m16n8k32 from the lanes'
// fragments, the warp count, the test activations and the error score.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "float_bits.h"

namespace {

constexpr int KMMA_QK = 256;

float h2f(uint16_t h) {
  const uint32_t s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? std::ldexp((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp((float)(m | 1024), (int)e - 25);
  return s ? -v : v;
}

struct Stats {
  long long splitChecked = 0, splitBad = 0, digitRangeBad = 0, overflow = 0;
  double maxErrScaled = 0, maxErrScaledF32 = 0;
  long long rows = 0;
};

// One SB's activations as the kernel's lanes leave them: for each 32-element chunk and term, 32
// bytes; the 32- and 16-element sub-block sums; the SB's scale 2^(E-30).
struct SbTerms {
  int8_t t[8][4][32];
  float sx[8], sx16[16];
  float xsc;
};

SbTerms splitSb(const float* x, Stats& st) {
  SbTerms o{};
  float m = 0.f;
  bool finite = true;
  for (int i = 0; i < KMMA_QK; i++) {
    m = std::fmax(m, std::fabs(x[i]));
    finite = finite && std::isfinite(x[i]);
  }
  int E = (int)((f2u(m) >> 23) & 0xFF) - 126;
  if (E < -96) E = -96;
  const float up = u2f((uint32_t)(157 - E) << 23);
  for (int lane = 0; lane < 32; lane++) {
    for (int i = 0; i < 8; i++) {
      const float e = x[8 * lane + i];
      const int X = finite ? (int)std::nearbyint(e * up) : 0;
      const int d0 = X, d1 = (X + 128) >> 8, d2 = (d1 + 128) >> 8, d3 = (d2 + 128) >> 8;
      const int8_t b[4] = {(int8_t)d3, (int8_t)d2, (int8_t)d1, (int8_t)d0};  // terms 0..3, most significant first
      if (d3 < -128 || d3 > 127) st.digitRangeBad++;
      const long long back = (long long)b[0] * (1 << 24) + (long long)b[1] * 65536 + (long long)b[2] * 256 + b[3];
      st.splitChecked++;
      if (back != X) st.splitBad++;
      if (finite && std::fabs((double)X * std::ldexp(1.0, E - 30) - (double)e) > std::ldexp(1.0, E - 31)) st.splitBad++;
      for (int k = 0; k < 4; k++) o.t[lane >> 2][k][8 * (lane & 3) + i] = b[k];
    }
  }
  // A lane's 8 in order, then the shuffles: 16-element sums l0 + l1, 32-element (l0 + l1) + (l2 + l3).
  float q[32];
  for (int l = 0; l < 32; l++) {
    float s8 = 0.f;
    for (int i = 0; i < 8; i++) s8 += x[8 * l + i];
    q[l] = s8;
  }
  for (int s = 0; s < 16; s++) o.sx16[s] = q[2 * s] + q[2 * s + 1];
  for (int sub = 0; sub < 8; sub++) o.sx[sub] = o.sx16[2 * sub] + o.sx16[2 * sub + 1];
  o.xsc = finite ? u2f((uint32_t)(97 + E) << 23) : NAN;
  return o;
}

// The chunk element at mma k, for A and B alike: lane t's first word (k = 4t .. 4t + 3) holds
// elements 8t .. 8t + 3, its second (k = 16 + 4t ..) 8t + 4 .. 8t + 7.
[[maybe_unused]] int kmmaElem(int k) { return k < 16 ? 8 * (k >> 2) + (k & 3) : 8 * ((k - 16) >> 2) + 4 + (k & 3); }

// B (32 x 8, s8) from the lanes' fragments (column g, k = 4t + i and 16 + 4t + i).
void mmaB(const uint32_t (&b)[32][2], int8_t (&B)[32][8]) {
  for (int lane = 0; lane < 32; lane++) {
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 8; i++) B[t * 4 + (i & 3) + (i >= 4 ? 16 : 0)][g] = (int8_t)(b[lane][i / 4] >> (8 * (i & 3)));
  }
}

// m16n8k32 by definition from the lanes' fragments: A u8 [lane][4 words], B s8 [lane][2 words].
void mma(const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], long long (&c)[32][4]) {
  uint8_t A[16][32];
  int8_t B[32][8];
  for (int lane = 0; lane < 32; lane++) {
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 16; i++) {
      const int row = (i < 4 || (i >= 8 && i < 12)) ? g : g + 8;
      const int col = t * 4 + (i & 3) + (i >= 8 ? 16 : 0);
      A[row][col] = (uint8_t)(a[lane][i / 4] >> (8 * (i & 3)));
    }
  }
  mmaB(b, B);
  for (int lane = 0; lane < 32; lane++) {
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
      const int row = i < 2 ? g : g + 8, col = 2 * t + (i & 1);
      long long s = 0;
      for (int k = 0; k < 32; k++) s += (long long)A[row][k] * B[k][col];
      c[lane][i] = s;
    }
  }
}

int fit(long long v, Stats& st) {
  if (v > INT32_MAX || v < INT32_MIN) st.overflow++;
  return (int)v;
}

// kmmaWarps.
int kmmaWarpsEmul(int sbs) {
  int ks = sbs < 16 ? sbs : 16;
  if (sbs > 16)
    for (int d = 16; d >= 8; d--)
      if (sbs % d == 0) return d;
  return ks;
}

// Test activations x (the kernel's input) and xref (double, the reference's), variant 0..7: normal,
// + an outlier of 3000, + a zero SB, + a subnormal and a value a million times the rest; variants
// 4..7 the same through the fused RMSNorm (eps 1e-6, a norm weight around 1) as kmmaSplitRow
// applies it: the warps' sums of squares over their SBs added in warp order, then x * inv * nw.
void makeActivations(std::mt19937& rng, int variant, int ks, std::vector<float>& x, std::vector<double>& xref) {
  std::normal_distribution<float> nd(0.f, 1.f);
  const int inDim = (int)x.size(), sbs = inDim / KMMA_QK;
  for (auto& v : x) v = nd(rng);
  if (variant % 4 >= 1) x[rng() % inDim] = 3000.f;
  if (variant % 4 >= 2 && sbs > 1)
    for (int i = KMMA_QK; i < 2 * KMMA_QK; i++) x[i] = 0.f;
  if (variant % 4 == 3) {
    x[rng() % inDim] = 1e-40f;
    x[rng() % inDim] = -3e6f;
  }
  xref.assign(x.begin(), x.end());
  if (variant >= 4) {
    std::vector<float> nw(inDim);
    for (auto& v : nw) v = 1.f + 0.1f * nd(rng);
    float ss = 0.f;
    double ssd = 0;
    for (int w = 0; w < ks; w++) {
      float sw = 0.f;
      for (int sb = w; sb < sbs; sb += ks)
        for (int i = 0; i < KMMA_QK; i++) sw += x[(size_t)sb * KMMA_QK + i] * x[(size_t)sb * KMMA_QK + i];
      ss += sw;
    }
    for (float v : x) ssd += (double)v * v;
    const float inv = 1.f / std::sqrt(ss / (float)inDim + 1e-6f);
    const double invd = 1.0 / std::sqrt(ssd / inDim + 1e-6);
    for (int i = 0; i < inDim; i++) {
      xref[i] = (double)x[i] * invd * nw[i];
      x[i] = x[i] * inv * nw[i];
    }
  }
}

// One row's result against the double reference: |got - ref| / sum_i parts_i |x_i| (parts: the
// magnitude of the terms the kernel sums apart), and a sequential float32 dot's |seq - ref| / sum |w x|.
void score(float got, const std::vector<float>& wd, const std::vector<float>& parts, const std::vector<float>& x,
           const std::vector<double>& xref, Stats& st) {
  double ref = 0, mag = 0, magParts = 0;
  float seq = 0.f;
  for (size_t i = 0; i < wd.size(); i++) {
    ref += (double)wd[i] * xref[i];
    mag += std::fabs((double)wd[i] * xref[i]);
    magParts += (double)parts[i] * std::fabs(xref[i]);
    seq += wd[i] * x[i];
  }
  st.rows++;
  if (mag > 0) {
    st.maxErrScaled = std::fmax(st.maxErrScaled, std::fabs(got - ref) / magParts);
    st.maxErrScaledF32 = std::fmax(st.maxErrScaledF32, std::fabs(seq - ref) / mag);
  }
}

}  // namespace
