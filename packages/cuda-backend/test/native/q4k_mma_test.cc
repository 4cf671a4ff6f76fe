// CPU emulation of k_q4k_mma (native/ops/q4k_mma.cu), the Q4_K decode GEMV on the integer tensor
// cores, without CUDA: the activations' split of each 256-element super-block (SB) into a
// power-of-two scale and four signed byte digits, the per-lane fragments of mma.sync m16n8k32
// (u8 A: rows g and g + 8, the 8 qs bytes at 8t of each 32-byte chunk, low nibbles and 16x high
// nibbles; s8 B: term (g & 3), elements 8t .. 8t + 7; C: columns 2t, 2t + 1), each sub-block's
// integer scale, the per-SB float combination with d and the mins, the quad reduction, the warps'
// partial sums across their SBs and the epilogue's sum over warps. An int mma is exact, so the
// emulation computes what the GPU computes, operation for operation, up to the float32 order
// kept here. Checks, printed as one JSON line:
//  - the split: the digits rebuild X exactly, each fits a signed byte, and |X 2^(E-30) - x| is at
//    most 2^(E-31) (half an X unit) for every activation, extremes included;
//  - no int32 overflow in the mma sums or the scale-weighted sums (tracked in 64 bits);
//  - accuracy against a double reference, |got - ref| / sum_i (|d sc q| + |dmin m|)_i |x_i| (the
//    kernel sums a weight's two parts apart, as the float GEMV did, so a weight near zero between
//    two large parts costs a cancellation float32 cannot avoid either way) over rows of random
//    blocks, at inDim 256 .. 12288 and the warp counts q4kMmaRun picks, with activations that hold
//    an outlier of 3000, a zero SB, a subnormal and a value a million times the rest, each also
//    through the fused RMSNorm (against a double norm); a sequential float32 dot product of the
//    dequantized weights, |seq - ref| / sum_i |w_i x_i|, for comparison.
// The split's limit, by construction: a value is kept to 2^-31 of its SB's largest, so an SB
// whose largest activation is more than ~2^7 times another keeps fewer of that one's bits than
// float32 would (at a million times, ~11 bits): a row's error is at most about 2^-31 max|x| times
// the SB's sum of |w|, small against sum |w x| unless the largest activation is huge and its own
// weight near zero.
// Keep in step with k_q4k_mma and q4kMmaRun.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "float_bits.h"

namespace {

constexpr int QK = 256, QK_BYTES = 144;

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

// One SB's activations as the kernel's lanes leave them: for each sub-block and term, 32 bytes;
// the sub-block sums; the SB's scale 2^(E-30).
struct SbTerms {
  int8_t t[8][4][32];
  float sx[8];
  float xsc;
};

SbTerms splitSb(const float* x, Stats& st) {
  SbTerms o{};
  float m = 0.f;
  bool finite = true;
  for (int i = 0; i < QK; i++) {
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
  // Each sub-block's sum: a lane's 8 in order, then the quad's shuffles ((l0 + l1) + (l2 + l3)).
  for (int sub = 0; sub < 8; sub++) {
    float q[4];
    for (int l = 0; l < 4; l++) {
      float s8 = 0.f;
      for (int i = 0; i < 8; i++) s8 += x[32 * sub + 8 * l + i];
      q[l] = s8;
    }
    o.sx[sub] = (q[0] + q[1]) + (q[2] + q[3]);
  }
  o.xsc = finite ? u2f((uint32_t)(97 + E) << 23) : NAN;
  return o;
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
    for (int i = 0; i < 8; i++) B[t * 4 + (i & 3) + (i >= 4 ? 16 : 0)][g] = (int8_t)(b[lane][i / 4] >> (8 * (i & 3)));
  }
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

// One SB of 16 weight rows (row pointers at that SB) against its terms: each row's float sum as
// the quad's lane 0 leaves it.
void item(const uint8_t* const* rowsAt, const SbTerms& xt, float* y, Stats& st) {
  uint32_t hw[32][2][4], q[32][2][4][2];
  for (int lane = 0; lane < 32; lane++) {
    const int g = lane >> 2, t = lane & 3;
    for (int h = 0; h < 2; h++) {
      const uint8_t* b = rowsAt[g + 8 * h];
      memcpy(hw[lane][h], b, 16);
      for (int c = 0; c < 4; c++) memcpy(q[lane][h][c], b + 16 + 32 * c + 8 * t, 8);
    }
  }
  int lo[32][2][2] = {}, hi[32][2][2] = {};
  for (int c = 0; c < 4; c++) {
    for (int half = 0; half < 2; half++) {
      const uint32_t mask = half ? 0xF0F0F0F0u : 0x0F0F0F0Fu;
      const int sub = 2 * c + half;
      uint32_t a[32][4], b[32][2];
      for (int lane = 0; lane < 32; lane++) {
        const int g = lane >> 2, t = lane & 3;
        a[lane][0] = q[lane][0][c][0] & mask;
        a[lane][1] = q[lane][1][c][0] & mask;
        a[lane][2] = q[lane][0][c][1] & mask;
        a[lane][3] = q[lane][1][c][1] & mask;
        memcpy(&b[lane][0], &xt.t[sub][g & 3][8 * t], 4);
        memcpy(&b[lane][1], &xt.t[sub][g & 3][8 * t + 4], 4);
      }
      long long cc[32][4];
      mma(a, b, cc);
      for (int lane = 0; lane < 32; lane++)
        for (int h = 0; h < 2; h++) {
          const uint32_t w0 = hw[lane][h][1], w2 = hw[lane][h][3];
          const uint32_t sw = c < 2 ? (w0 & 0x3F3F3F3Fu) : ((w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u));
          const int s = (sw >> (8 * (sub & 3))) & 0xFF;
          int(&acc)[2] = half ? hi[lane][h] : lo[lane][h];
          acc[0] = fit((long long)acc[0] + s * (long long)fit(cc[lane][2 * h], st), st);
          acc[1] = fit((long long)acc[1] + s * (long long)fit(cc[lane][2 * h + 1], st), st);
        }
    }
  }
  float v[32][2];
  for (int lane = 0; lane < 32; lane++) {
    const int t = lane & 3;
    const float xs = xt.xsc * (t == 0 ? 4096.f : t == 1 ? 0.0625f : 0.f);
    const float sxa = xt.sx[2 * t], sxb = xt.sx[2 * t + 1];
    for (int h = 0; h < 2; h++) {
      const int Ta = fit(16LL * lo[lane][h][0] + hi[lane][h][0], st), Tb = fit(16LL * lo[lane][h][1] + hi[lane][h][1], st);
      const float f = std::fma((float)Ta, 256.f, (float)Tb);
      const uint32_t hx = hw[lane][h][0], w1 = hw[lane][h][2], w2 = hw[lane][h][3];
      const float d = h2f((uint16_t)(hx & 0xFFFF)), dmin = h2f((uint16_t)(hx >> 16));
      const uint32_t mw = t < 2 ? (w1 & 0x3F3F3F3Fu) : (((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u));
      const uint32_t mm = mw >> (16 * (t & 1));
      const float ms = std::fma((float)(mm & 0xFF), sxa, (float)((mm >> 8) & 0xFF) * sxb);
      v[lane][h] = std::fma(-dmin, ms, f * (d * xs));
    }
  }
  for (int g = 0; g < 8; g++)
    for (int h = 0; h < 2; h++) {
      const float* p = &v[4 * g][0];
      // y += shfl_xor(y, 1); y += shfl_xor(y, 2): lane 0 ends with (v0 + v1) + (v2 + v3).
      y[g + 8 * h] = (p[0 * 2 + h] + p[1 * 2 + h]) + (p[2 * 2 + h] + p[3 * 2 + h]);
    }
}

// q4kMmaRun's warp count.
int warpsFor(int sbs) {
  int ks = sbs < 16 ? sbs : 16;
  if (sbs > 16)
    for (int d = 16; d >= 8; d--)
      if (sbs % d == 0) return d;
  return ks;
}

// A random Q4_K row: random qs and scale bytes, d and dmin small positive f16 values.
void randomRow(std::mt19937& rng, uint8_t* row, int sbs) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < sbs * QK_BYTES; i++) row[i] = (uint8_t)byte(rng);
  for (int s = 0; s < sbs; s++) {
    const uint16_t d = (uint16_t)(0x1C00 + byte(rng) * 4), dm = (uint16_t)(0x1800 + byte(rng) * 4);
    memcpy(row + s * QK_BYTES, &d, 2);
    memcpy(row + s * QK_BYTES + 2, &dm, 2);
  }
}

// The dequantized weight, ggml's dequantize_row_q4_K, and each weight's two parts' magnitude
// |d sc q| + |dmin m| (the kernel sums the parts apart, so its rounding scales with them).
void dequant(const uint8_t* row, int sbs, std::vector<float>& w, std::vector<float>& parts) {
  w.assign((size_t)sbs * QK, 0.f);
  parts.assign((size_t)sbs * QK, 0.f);
  for (int s = 0; s < sbs; s++) {
    const uint8_t* b = row + s * QK_BYTES;
    uint16_t d16, dm16;
    memcpy(&d16, b, 2);
    memcpy(&dm16, b + 2, 2);
    const float d = h2f(d16), dmin = h2f(dm16);
    const uint8_t* sc = b + 4;
    const uint8_t* qs = b + 16;
    for (int j = 0; j < 8; j++) {
      int scv, m;
      if (j < 4) {
        scv = sc[j] & 63;
        m = sc[j + 4] & 63;
      } else {
        scv = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
        m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
      }
      const float d1 = d * scv, m1 = dmin * m;
      for (int l = 0; l < 32; l++) {
        const int nib = (j & 1) ? (qs[32 * (j / 2) + l] >> 4) : (qs[32 * (j / 2) + l] & 15);
        w[(size_t)s * QK + 32 * j + l] = d1 * nib - m1;
        parts[(size_t)s * QK + 32 * j + l] = std::fabs(d1 * nib) + std::fabs(m1);
      }
    }
  }
}

}  // namespace

int main() {
  Stats st;
  std::mt19937 rng(2024);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int dims[] = {256, 768, 1024, 4096, 12288};
  for (int inDim : dims) {
    const int sbs = inDim / QK, ks = warpsFor(sbs), R = 48;
    std::vector<uint8_t> W((size_t)R * sbs * QK_BYTES);
    for (int r = 0; r < R; r++) randomRow(rng, &W[(size_t)r * sbs * QK_BYTES], sbs);
    for (int variant = 0; variant < 8; variant++) {
      std::vector<float> x(inDim);
      for (auto& v : x) v = nd(rng);
      if (variant % 4 >= 1) x[rng() % inDim] = 3000.f;  // an outlier
      if (variant % 4 >= 2 && sbs > 1)
        for (int i = QK; i < 2 * QK; i++) x[i] = 0.f;  // a zero SB
      if (variant % 4 == 3) {
        x[rng() % inDim] = 1e-40f;  // a subnormal
        x[rng() % inDim] = -3e6f;  // a million times the rest
      }
      // Variants 4..7: the fused RMSNorm (eps 1e-6, a norm weight around 1), as k_q4k_mma applies
      // it: the warps' sums of squares over their SBs added in warp order, then x * inv * nw.
      std::vector<double> xref(x.begin(), x.end());
      if (variant >= 4) {
        std::vector<float> nw(inDim);
        for (auto& v : nw) v = 1.f + 0.1f * nd(rng);
        float ss = 0.f;
        double ssd = 0;
        for (int w = 0; w < ks; w++) {
          float sw = 0.f;
          for (int sb = w; sb < sbs; sb += ks)
            for (int i = 0; i < QK; i++) sw += x[(size_t)sb * QK + i] * x[(size_t)sb * QK + i];
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
      std::vector<SbTerms> terms(sbs);
      for (int s = 0; s < sbs; s++) terms[s] = splitSb(&x[(size_t)s * QK], st);
      // Blocks of 16 rows (one group), the warps' SBs as the kernel assigns them.
      for (int g0 = 0; g0 < R; g0 += 16) {
        std::vector<std::vector<float>> part(ks, std::vector<float>(16, 0.f));
        for (int w = 0; w < ks; w++) {
          int si = 0;
          for (int sb = w; sb < sbs; sb += ks, si++) {
            const uint8_t* at[16];
            for (int k = 0; k < 16; k++) at[k] = &W[(size_t)(g0 + k) * sbs * QK_BYTES + (size_t)sb * QK_BYTES];
            float y[16];
            item(at, terms[sb], y, st);
            for (int k = 0; k < 16; k++) part[w][k] = si == 0 ? y[k] : part[w][k] + y[k];
          }
        }
        for (int k = 0; k < 16; k++) {
          float got = 0.f;
          for (int w = 0; w < ks; w++) got += part[w][k];
          std::vector<float> wd, parts;
          dequant(&W[(size_t)(g0 + k) * sbs * QK_BYTES], sbs, wd, parts);
          double ref = 0, mag = 0, magParts = 0;
          float seq = 0.f;
          for (int i = 0; i < inDim; i++) {
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
      }
    }
  }
  printf(
      "{\"rows\":%lld,\"splitChecked\":%lld,\"splitBad\":%lld,\"digitRangeBad\":%lld,\"overflow\":%lld,"
      "\"maxErrScaled\":%.3e,\"maxErrScaledF32Sequential\":%.3e}\n",
      st.rows, st.splitChecked, st.splitBad, st.digitRangeBad, st.overflow, st.maxErrScaled, st.maxErrScaledF32);
  return 0;
}
