// CPU emulation of k_gemm_bi (native/ops/gemm_bi.cu), the batch-invariant tensor-core matmul, without
// CUDA: the same per-lane fragment construction (16-byte weight loads of rows g and g + 8 at k
// offsets 32 h + 8 q of a 64-k chunk, activation float4s of row g split into bf16 hi, mid, lo),
// the mma.sync m16n8k16 operand layouts of the PTX ISA, the same step and term order, each
// chunk's 12 mmas into a zeroed accumulator added into the stripe's sum, split-K stripes and
// their ordered reduction. The tensor core's internal summation of one mma is
// hardware-defined, so two models stand in for it: "rn" (the exact sum of the 16 products and the
// accumulator rounded to nearest f32) and "rz" (rounded toward zero, as tensor cores truncate).
// Checks (TERMS = 3 and, for matmul precision bf16, TERMS = 1), printed as one JSON line:
//  - accuracy against a double reference, |got - ref| / sum_i |x_i w_i| (and / |ref| where
//    |ref| > 1e-3 sum_i |x_i w_i|), inDim 1024..12288 (tails of 16, 32 and 48 k included), KS as
//    biSplitK picks and KS = 1; a sequential f32 dot product's errors for comparison;
//  - the split: hi + mid + lo == x for every activation;
//  - invariance: each row's outputs, bit for bit, alone (1 row, one n-tile) and at its place in
//    launches of 9, 17, 33 and 64 rows.
// Keep in step with k_gemm_bi and biSplitK.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "float_bits.h"

namespace {

constexpr int BI_CHUNK = 64;
constexpr int BI_MAX_KS = 8;

// Round to nearest even (cvt.rn.bf16.f32 for finite values).
uint16_t f2bf(float x) {
  uint32_t b = f2u(x);
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
float bf2f(uint16_t b) { return u2f((uint32_t)b << 16); }
uint32_t cvt2(float lo, float hi) { return (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16); }
void split2(float a, float b, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
  hi = cvt2(a, b);
  const float ra = a - u2f(hi << 16), rb = b - u2f(hi & 0xffff0000u);
  mid = cvt2(ra, rb);
  const float sa = ra - u2f(mid << 16), sb = rb - u2f(mid & 0xffff0000u);
  lo = cvt2(sa, sb);
}
float lowHalf(uint32_t v) { return u2f(v << 16); }
float highHalf(uint32_t v) { return u2f(v & 0xffff0000u); }

int biSplitK(int inDim, int outDim, bool glu) {
  const long long mtiles = (long long)((outDim + 15) / 16) * (glu ? 2 : 1);
  const int chunks = (inDim + BI_CHUNK - 1) / BI_CHUNK;
  int ks = 1;
  while (ks < BI_MAX_KS && mtiles * ks < 2048 && 4 * ks <= chunks) ks *= 2;
  return ks;
}

enum Model { RN, RZ };

float roundModel(double v, Model m) {
  float f = (float)v;  // nearest
  if (m == RZ && std::fabs((double)f) > std::fabs(v)) f = std::nextafter(f, 0.f);
  return f;
}

struct Frag {
  uint32_t a[32][4];
  uint32_t b[32][2];
};

// D = C + A B by the PTX m16n8k16 layouts (groupID g = lane >> 2, threadID_in_group q = lane & 3).
void mma(float (&c)[32][4], const Frag& f, Model model) {
  double A[16][16], B[16][8];
  for (int lane = 0; lane < 32; lane++) {
    const int g = lane >> 2, q = lane & 3;
    const uint32_t* a = f.a[lane];
    A[g][2 * q] = lowHalf(a[0]), A[g][2 * q + 1] = highHalf(a[0]);
    A[g + 8][2 * q] = lowHalf(a[1]), A[g + 8][2 * q + 1] = highHalf(a[1]);
    A[g][2 * q + 8] = lowHalf(a[2]), A[g][2 * q + 9] = highHalf(a[2]);
    A[g + 8][2 * q + 8] = lowHalf(a[3]), A[g + 8][2 * q + 9] = highHalf(a[3]);
    B[2 * q][g] = lowHalf(f.b[lane][0]), B[2 * q + 1][g] = highHalf(f.b[lane][0]);
    B[2 * q + 8][g] = lowHalf(f.b[lane][1]), B[2 * q + 9][g] = highHalf(f.b[lane][1]);
  }
  float D[16][8];
  for (int lane = 0; lane < 32; lane++) {
    const int g = lane >> 2, q = lane & 3;
    D[g][2 * q] = c[lane][0], D[g][2 * q + 1] = c[lane][1];
    D[g + 8][2 * q] = c[lane][2], D[g + 8][2 * q + 1] = c[lane][3];
  }
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 8; n++) {
      // bf16 * bf16 products are exact in double, and so is their sum here (16 terms of 16-bit
      // significands within the exponent spread of these data).
      double s = D[m][n];
      for (int k = 0; k < 16; k++) s += A[m][k] * B[k][n];
      D[m][n] = roundModel(s, model);
    }
  for (int lane = 0; lane < 32; lane++) {
    const int g = lane >> 2, q = lane & 3;
    c[lane][0] = D[g][2 * q], c[lane][1] = D[g][2 * q + 1];
    c[lane][2] = D[g + 8][2 * q], c[lane][3] = D[g + 8][2 * q + 1];
  }
}

// out[r * outDim + o] (no epilogue: the raw sums) of one k_gemm_bi launch over `rows` rows of x,
// with TERMS = 3 (hi, mid, lo: exact matmuls) or 1 (hi alone: matmul precision bf16).
void emulate(const std::vector<float>& x, const std::vector<uint16_t>& w, int rows, int inDim, int outDim, int KS,
             Model model, std::vector<float>& out, int terms = 3) {
  const int NT = rows <= 8 ? 1 : rows <= 16 ? 2 : rows <= 32 ? 4 : 8;
  const int nChunks = (inDim + BI_CHUNK - 1) / BI_CHUNK;
  out.assign((size_t)rows * outDim, 0.f);
  const int tiles = (outDim + 15) / 16;
  std::vector<float> part;
  for (int tile = 0; tile < tiles; tile++) {
    const int o0 = tile * 16;
    // acc[ks][n][lane][i]
    std::vector<float> accAll((size_t)KS * NT * 32 * 4, 0.f);
    for (int ks = 0; ks < KS; ks++)
      for (int n = 0; n < NT; n++) {
        if (n * 8 >= rows) continue;
        float(&acc)[32][4] = *reinterpret_cast<float(*)[32][4]>(&accAll[((size_t)ks * NT + n) * 128]);
        for (int c = ks; c < nChunks; c += KS) {
          float tmp[32][4] = {};  // the chunk's sum, added into acc with an f32 add (round to nearest)
          // Per lane: the chunk's weights (rows g, g + 8; h = 0, 1) and activations.
          uint32_t wq[32][2][2][4];
          float xv[32][2][8];
          for (int lane = 0; lane < 32; lane++) {
            const int g = lane >> 2, q = lane & 3;
            for (int hh = 0; hh < 2; hh++)
              for (int h = 0; h < 2; h++) {
                const int o = o0 + g + 8 * hh, k = c * BI_CHUNK + 32 * h + 8 * q;
                for (int j = 0; j < 4; j++) {
                  uint32_t v = 0;
                  if (o < outDim && k < inDim) v = (uint32_t)w[(size_t)o * inDim + k + 2 * j] | ((uint32_t)w[(size_t)o * inDim + k + 2 * j + 1] << 16);
                  wq[lane][hh][h][j] = v;
                }
              }
            const int r = n * 8 + g;
            for (int h = 0; h < 2; h++) {
              const int k = c * BI_CHUNK + 32 * h + 8 * q;
              for (int j = 0; j < 8; j++) xv[lane][h][j] = r < rows && k < inDim ? x[(size_t)r * inDim + k + j] : 0.f;
            }
          }
          for (int h = 0; h < 2; h++)
            for (int s = 0; s < 2; s++) {
              Frag f[3];
              for (int lane = 0; lane < 32; lane++) {
                const float* v = &xv[lane][h][4 * s];
                uint32_t b0[3], b1[3];
                split2(v[0], v[1], b0[0], b0[1], b0[2]);
                split2(v[2], v[3], b1[0], b1[1], b1[2]);
                for (int e = 0; e < 3; e++) {
                  f[e].a[lane][0] = wq[lane][0][h][2 * s];
                  f[e].a[lane][1] = wq[lane][1][h][2 * s];
                  f[e].a[lane][2] = wq[lane][0][h][2 * s + 1];
                  f[e].a[lane][3] = wq[lane][1][h][2 * s + 1];
                  f[e].b[lane][0] = b0[e];
                  f[e].b[lane][1] = b1[e];
                }
              }
              for (int e = 0; e < terms; e++) mma(tmp, f[e], model);
            }
          for (int l = 0; l < 32; l++)
            for (int i = 0; i < 4; i++) acc[l][i] += tmp[l][i];
        }
      }
    // Stripe 0 adds stripes 1, 2, ... in order; lane (g, q) holds outputs o0 + g (+ 8), rows 8 n + 2 q (+ 1).
    for (int n = 0; n < NT; n++)
      for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
          float v = accAll[((size_t)0 * NT + n) * 128 + lane * 4 + i];
          for (int j = 1; j < KS; j++) v += accAll[((size_t)j * NT + n) * 128 + lane * 4 + i];
          const int g = lane >> 2, q = lane & 3;
          const int o = o0 + g + 8 * (i >> 1), r = n * 8 + 2 * q + (i & 1);
          if (o < outDim && r < rows) out[(size_t)r * outDim + o] = v;
        }
  }
}

}  // namespace

int main() {
  std::mt19937_64 rng(12345);
  std::normal_distribution<double> nd(0.0, 1.0);
  const int dims[] = {1024, 1040, 2080, 3072, 3120, 4096, 12288};
  const int outDim = 40;  // three tiles, the last partial
  double maxErrScaled[2] = {0, 0}, maxErrRel[2] = {0, 0}, maxErrF32Seq = 0, maxErrRelF32Seq = 0;
  // One term: against the product of the bf16-rounded activations (what it computes), and against x itself.
  double maxErrScaledOneTerm = 0, maxErrScaledOneTermVsX = 0;
  long long splitBad = 0, splitChecked = 0;
  int checkedShapes = 0;
  for (int inDim : dims) {
    const int rows = 3;
    std::vector<float> x((size_t)rows * inDim);
    // Activations of varied magnitude (as a residual stream has), weights ~ 1 / sqrt(inDim).
    for (size_t i = 0; i < x.size(); i++) x[i] = (float)(nd(rng) * std::exp(nd(rng)));
    std::vector<uint16_t> w((size_t)outDim * inDim);
    for (auto& v : w) v = f2bf((float)(nd(rng) / std::sqrt((double)inDim)));
    for (float v : x) {
      uint32_t h, m, l;
      split2(v, 0.f, h, m, l);
      splitChecked++;
      if ((double)lowHalf(h) + (double)lowHalf(m) + (double)lowHalf(l) != (double)v) splitBad++;
    }
    for (int KS : {biSplitK(inDim, outDim, false), 1}) {
      for (int mi = 0; mi < 2; mi++) {
        std::vector<float> got;
        emulate(x, w, rows, inDim, outDim, KS, (Model)mi, got);
        for (int r = 0; r < rows; r++)
          for (int o = 0; o < outDim; o++) {
            double ref = 0, mag = 0;
            float seq = 0.f;
            for (int i = 0; i < inDim; i++) {
              const double p = (double)x[(size_t)r * inDim + i] * bf2f(w[(size_t)o * inDim + i]);
              ref += p;
              mag += std::fabs(p);
              seq += x[(size_t)r * inDim + i] * bf2f(w[(size_t)o * inDim + i]);
            }
            const double e = std::fabs((double)got[(size_t)r * outDim + o] - ref);
            maxErrScaled[mi] = std::max(maxErrScaled[mi], e / mag);
            if (std::fabs(ref) > 1e-3 * mag) maxErrRel[mi] = std::max(maxErrRel[mi], e / std::fabs(ref));
            maxErrF32Seq = std::max(maxErrF32Seq, std::fabs((double)seq - ref) / mag);
            if (std::fabs(ref) > 1e-3 * mag) maxErrRelF32Seq = std::max(maxErrRelF32Seq, std::fabs((double)seq - ref) / std::fabs(ref));
          }
      }
      checkedShapes++;
      std::vector<float> one;
      emulate(x, w, rows, inDim, outDim, KS, RZ, one, 1);
      for (int r = 0; r < rows; r++)
        for (int o = 0; o < outDim; o++) {
          double ref = 0, ref1 = 0, mag = 0, mag1 = 0;
          for (int i = 0; i < inDim; i++) {
            const double wv = bf2f(w[(size_t)o * inDim + i]);
            const double xv = x[(size_t)r * inDim + i];
            const double x1 = bf2f(f2bf((float)xv));
            ref += xv * wv;
            mag += std::fabs(xv * wv);
            ref1 += x1 * wv;
            mag1 += std::fabs(x1 * wv);
          }
          const double g1 = one[(size_t)r * outDim + o];
          maxErrScaledOneTerm = std::max(maxErrScaledOneTerm, std::fabs(g1 - ref1) / mag1);
          maxErrScaledOneTermVsX = std::max(maxErrScaledOneTermVsX, std::fabs(g1 - ref) / mag);
        }
    }
  }

  // Invariance: row r alone against row r of launches of many rows (same model, same KS).
  long long invDiff = 0, invChecked = 0, invDiffOneTerm = 0;
  for (int inDim : {1040, 4096}) {
    const int maxRows = 64, od = 24;
    std::vector<float> x((size_t)maxRows * inDim);
    for (auto& v : x) v = (float)nd(rng);
    std::vector<uint16_t> w((size_t)od * inDim);
    for (auto& v : w) v = f2bf((float)(nd(rng) / std::sqrt((double)inDim)));
    const int KS = biSplitK(inDim, od, false);
    std::vector<std::vector<float>> alone(maxRows), alone1(maxRows);
    for (int r = 0; r < maxRows; r++) {
      std::vector<float> xr(x.begin() + (size_t)r * inDim, x.begin() + (size_t)(r + 1) * inDim);
      emulate(xr, w, 1, inDim, od, KS, RZ, alone[r]);
      emulate(xr, w, 1, inDim, od, KS, RZ, alone1[r], 1);
    }
    for (int n : {9, 17, 33, 64}) {
      std::vector<float> xs(x.begin(), x.begin() + (size_t)n * inDim), got, got1;
      emulate(xs, w, n, inDim, od, KS, RZ, got);
      emulate(xs, w, n, inDim, od, KS, RZ, got1, 1);
      for (int r = 0; r < n; r++)
        for (int o = 0; o < od; o++) {
          invChecked++;
          if (f2u(got[(size_t)r * od + o]) != f2u(alone[r][o])) invDiff++;
          if (f2u(got1[(size_t)r * od + o]) != f2u(alone1[r][o])) invDiffOneTerm++;
        }
    }
  }
  printf(
      "{\"shapes\":%d,\"maxErrScaledRn\":%.3e,\"maxErrScaledRz\":%.3e,\"maxErrRelRn\":%.3e,\"maxErrRelRz\":%.3e,"
      "\"maxErrScaledF32Sequential\":%.3e,\"maxErrRelF32Sequential\":%.3e,\"splitChecked\":%lld,\"splitBad\":%lld,\"invChecked\":%lld,\"invDiff\":%lld,"
      "\"maxErrScaledOneTerm\":%.3e,\"maxErrScaledOneTermVsX\":%.3e,\"invDiffOneTerm\":%lld}\n",
      checkedShapes, maxErrScaled[0], maxErrScaled[1], maxErrRel[0], maxErrRel[1], maxErrF32Seq, maxErrRelF32Seq, splitChecked, splitBad,
      invChecked, invDiff, maxErrScaledOneTerm, maxErrScaledOneTermVsX, invDiffOneTerm);
  return 0;
}
