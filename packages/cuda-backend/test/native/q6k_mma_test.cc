// CPU emulation of k_q6k_mma (native/ops/q6k_mma.cu), the Q6_K decode GEMV on the integer tensor
// cores, without CUDA: the activations' split (kmmaSplitRow<16>: a power-of-two scale, four signed
// byte digits, 16-element sub-block sums), the ring's copy of the 14 aligned 16-byte granules that
// cover a row's 2-byte-aligned block and the lanes' funnel-shifted reads from it (lds8), the
// per-lane fragments of mma.sync m16n8k32 (u8 A: q = ql nibble | qh bits << 4 of elements
// 8t .. 8t + 7 of each 32-element chunk, rows g and g + 8; s8 B: column g = term g & 3 of half
// g >> 2, zero on lanes whose elements lie in the other half; C: columns 2t, 2t + 1), the int8
// sub-block scales, the per-SB float combination with d and the -32 offset, the quad reduction,
// the warps' partial sums across their SBs and the epilogue's sum over warps. An int mma is exact,
// so this computes what the GPU computes, up to the float32 order kept here. Checks, one JSON line:
//  - the split: the digits rebuild X exactly, each fits a signed byte, |X 2^(E-30) - x| <= 2^(E-31);
//  - every B column holds its term in its own half and zero in the other (from the fragments);
//  - no int32 overflow in the mma sums or the scale-weighted sums (tracked in 64 bits);
//  - the bytes the lanes read (ql, qh, scales, d) are the block's, at every 2-byte offset;
//  - accuracy against a double reference, |got - ref| / sum_i |d sc_i| (|q_i| + 32) |x_i| (the
//    kernel sums q x and the 32 x apart), over rows of random blocks (scales over the whole int8
//    range, d of both signs) at inDim 256 .. 12288 and the warp counts q6kMmaRun picks, with
//    activations holding an outlier, a zero SB, a subnormal and a value a million times the rest,
//    each also through the fused RMSNorm; a sequential float32 dot for comparison.
// Keep in step with k_q6k_mma and q6kMmaRun.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kmma_emul.h"

namespace {

constexpr int QK_BYTES = 210, ROWB = 224;

// lds8: 8 bytes at p (2-byte aligned within the slot) from the aligned words around it.
void lds8(const uint8_t* slot, int p, uint32_t out[2]) {
  uint32_t w[3];
  const int q = p & ~3, s = (p & 2) * 8;
  memcpy(w, slot + q, 12);
  for (int i = 0; i < 2; i++) out[i] = s ? (w[i] >> s) | (w[i + 1] << (32 - s)) : w[i];
}

uint32_t q6(int qd, uint32_t l, uint32_t h) {
  const uint32_t lo = ((qd >> 1) ? l >> 4 : l) & 0x0F0F0F0Fu;
  const uint32_t hi = (qd == 0 ? h << 4 : qd == 1 ? h << 2 : qd == 2 ? h : h >> 2) & 0x30303030u;
  return lo | hi;
}

uint32_t perm(uint32_t x, uint32_t y, uint32_t sel) {  // __byte_perm
  const uint64_t v = (uint64_t)y << 32 | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; i++) r |= (uint32_t)((v >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}

// One SB of 16 weight rows against its terms; rowsAt: each row's block, whose address mod 16 is
// offs[k] (the ring copies the 14 granules from the aligned address below it).
void item(const uint8_t* const* rowsAt, const int* offs, const SbTerms& xt, float* y, Stats& st, long long& bytesBad,
          long long& halfBad) {
  std::vector<uint8_t> slot(16 * ROWB + 16, 0xAB);  // + the next slot's first bytes a read may touch
  for (int k = 0; k < 16; k++) memcpy(&slot[k * ROWB], rowsAt[k] - offs[k], ROWB);
  uint32_t l0[32][2][2][2], l1[32][2][2][2], hb[32][2][2][2], scw[32][2][2];
  float d[32][2];
  for (int lane = 0; lane < 32; lane++) {
    const int g = lane >> 2, t = lane & 3;
    for (int h = 0; h < 2; h++) {
      const int p = (g + 8 * h) * ROWB + offs[g + 8 * h];
      const uint8_t* b = rowsAt[g + 8 * h];
      for (int m = 0; m < 2; m++) {
        lds8(slot.data(), p + 64 * m + 8 * t, l0[lane][h][m]);
        lds8(slot.data(), p + 64 * m + 32 + 8 * t, l1[lane][h][m]);
        lds8(slot.data(), p + 128 + 32 * m + 8 * t, hb[lane][h][m]);
        if (memcmp(l0[lane][h][m], b + 64 * m + 8 * t, 8) || memcmp(l1[lane][h][m], b + 64 * m + 32 + 8 * t, 8) ||
            memcmp(hb[lane][h][m], b + 128 + 32 * m + 8 * t, 8))
          bytesBad++;
      }
      uint32_t s0[2], s1[2];
      lds8(slot.data(), p + 192, s0);
      lds8(slot.data(), p + 200, s1);
      const uint32_t sel = (t >> 1) ? 0x7531u : 0x6420u;
      scw[lane][h][0] = perm(s0[0], s0[1], sel);
      scw[lane][h][1] = perm(s1[0], s1[1], sel);
      for (int c = 0; c < 8; c++)
        if ((int8_t)(scw[lane][h][c >> 2] >> (8 * (c & 3))) != (int8_t)b[192 + 2 * c + (t >> 1)]) bytesBad++;
      uint16_t dh;
      memcpy(&dh, &slot[p + 208], 2);
      d[lane][h] = h2f(dh);
      if (memcmp(&dh, b + 208, 2)) bytesBad++;
    }
  }
  long long T[32][2][2] = {};
  for (int c = 0; c < 8; c++) {
    const int m = c >> 2, qd = c & 3;
    uint32_t a[32][4], bf[32][2];
    for (int lane = 0; lane < 32; lane++) {
      const int g = lane >> 2, t = lane & 3;
      uint32_t A[2][2];
      for (int h = 0; h < 2; h++)
        for (int j = 0; j < 2; j++) A[h][j] = q6(qd, (qd & 1) ? l1[lane][h][m][j] : l0[lane][h][m][j], hb[lane][h][m][j]);
      a[lane][0] = A[0][0];
      a[lane][1] = A[1][0];
      a[lane][2] = A[0][1];
      a[lane][3] = A[1][1];
      const bool live = (t >> 1) == (g >> 2);
      memcpy(&bf[lane][0], &xt.t[c][g & 3][8 * t], 4);
      memcpy(&bf[lane][1], &xt.t[c][g & 3][8 * t + 4], 4);
      if (!live) bf[lane][0] = bf[lane][1] = 0;
    }
    // B as the mma sees it: column j must hold term j & 3 in half j >> 2 and zero elsewhere.
    int8_t B[32][8];
    mmaB(bf, B);
    for (int k = 0; k < 32; k++)
      for (int j = 0; j < 8; j++) {
        const int e = kmmaElem(k);  // the chunk element at mma k (both operands' lane layout)
        const int8_t want = (e >> 4) == (j >> 2) ? xt.t[c][j & 3][e] : 0;
        if (B[k][j] != want) halfBad++;
      }
    long long cc[32][4];
    mma(a, bf, cc);
    for (int lane = 0; lane < 32; lane++) {
      for (int h = 0; h < 2; h++) {
        const int s = (int8_t)(scw[lane][h][c >> 2] >> (8 * (c & 3)));
        T[lane][h][0] = fit(T[lane][h][0] + s * (long long)fit(cc[lane][2 * h], st), st);
        T[lane][h][1] = fit(T[lane][h][1] + s * (long long)fit(cc[lane][2 * h + 1], st), st);
      }
    }
  }
  float v[32][2];
  for (int lane = 0; lane < 32; lane++) {
    const int t = lane & 3;
    const float xs = xt.xsc * ((t & 1) ? 1.f : 65536.f);
    for (int h = 0; h < 2; h++) {
      const float f = std::fma((float)(int)T[lane][h][0], 256.f, (float)(int)T[lane][h][1]);
      float ms = 0.f;
      for (int i = 0; i < 4; i++) {
        const int c = 2 * i + (t & 1);
        ms = std::fma((float)(int8_t)(scw[lane][h][c >> 2] >> (8 * (c & 3))), xt.sx16[2 * c + (t >> 1)], ms);
      }
      v[lane][h] = d[lane][h] * std::fma(-32.f, ms, f * xs);
    }
  }
  for (int g = 0; g < 8; g++)
    for (int h = 0; h < 2; h++) {
      const float* p = &v[4 * g][0];
      y[g + 8 * h] = (p[0 * 2 + h] + p[1 * 2 + h]) + (p[2 * 2 + h] + p[3 * 2 + h]);
    }
}

// A random Q6_K row: random ql, qh and scale bytes (int8, the whole range), d of either sign.
void randomRow(std::mt19937& rng, uint8_t* row, int sbs) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < sbs * QK_BYTES; i++) row[i] = (uint8_t)byte(rng);
  for (int s = 0; s < sbs; s++) {
    const uint16_t dh = (uint16_t)(0x1C00 + byte(rng) * 4 + (byte(rng) & 1 ? 0x8000 : 0));
    memcpy(row + s * QK_BYTES + 208, &dh, 2);
  }
}

// ggml's dequantize_row_q6_K, and each weight's two parts' magnitude |d sc| (|q| + 32).
void dequant(const uint8_t* row, int sbs, std::vector<float>& w, std::vector<float>& parts) {
  w.assign((size_t)sbs * KMMA_QK, 0.f);
  parts.assign((size_t)sbs * KMMA_QK, 0.f);
  for (int s = 0; s < sbs; s++) {
    const uint8_t* b = row + s * QK_BYTES;
    uint16_t dh;
    memcpy(&dh, b + 208, 2);
    const float d = h2f(dh);
    for (int n = 0; n < 2; n++)
      for (int l = 0; l < 32; l++)
        for (int qd = 0; qd < 4; qd++) {
          const uint8_t lb = b[64 * n + 32 * (qd & 1) + l], hbyte = b[128 + 32 * n + l];
          const int q = (((qd >> 1) ? lb >> 4 : lb & 15) | (((hbyte >> (2 * qd)) & 3) << 4));
          const int sc = (int8_t)b[192 + 8 * n + 2 * qd + l / 16];
          const size_t i = (size_t)s * KMMA_QK + 128 * n + 32 * qd + l;
          w[i] = d * (float)sc * (float)(q - 32);
          parts[i] = std::fabs(d * (float)sc) * (float)(q + 32);
        }
  }
}

}  // namespace

int main() {
  Stats st;
  long long bytesBad = 0, halfBad = 0;
  std::mt19937 rng(2025);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int dims[] = {256, 768, 1024, 4096, 12288};
  for (int inDim : dims) {
    const int sbs = inDim / KMMA_QK, ks = kmmaWarpsEmul(sbs), R = 48;
    const size_t rowBytes = (size_t)sbs * QK_BYTES;
    // The rows at a random even offset into a 16-aligned buffer (+ 16 either side for the granules).
    const int base = 2 * (int)(rng() % 8);
    std::vector<uint8_t> buf(16 + base + R * rowBytes + 32);
    uint8_t* W = buf.data() + 16 + base;
    for (int r = 0; r < R; r++) randomRow(rng, W + r * rowBytes, sbs);
    for (int variant = 0; variant < 8; variant++) {
      std::vector<float> x(inDim);
      std::vector<double> xref;
      makeActivations(rng, variant, ks, x, xref);
      std::vector<SbTerms> terms(sbs);
      for (int s = 0; s < sbs; s++) terms[s] = splitSb(&x[(size_t)s * KMMA_QK], st);
      for (int g0 = 0; g0 < R; g0 += 16) {
        std::vector<std::vector<float>> part(ks, std::vector<float>(16, 0.f));
        for (int w = 0; w < ks; w++) {
          int si = 0;
          for (int sb = w; sb < sbs; sb += ks, si++) {
            const uint8_t* at[16];
            int offs[16];
            for (int k = 0; k < 16; k++) {
              at[k] = W + (g0 + k) * rowBytes + (size_t)sb * QK_BYTES;
              offs[k] = (int)((at[k] - buf.data()) & 15);
            }
            float y[16];
            item(at, offs, terms[sb], y, st, bytesBad, halfBad);
            for (int k = 0; k < 16; k++) part[w][k] = si == 0 ? y[k] : part[w][k] + y[k];
          }
        }
        for (int k = 0; k < 16; k++) {
          float got = 0.f;
          for (int w = 0; w < ks; w++) got += part[w][k];
          std::vector<float> wd, parts;
          dequant(W + (g0 + k) * rowBytes, sbs, wd, parts);
          score(got, wd, parts, x, xref, st);
        }
      }
    }
  }
  printf(
      "{\"rows\":%lld,\"splitChecked\":%lld,\"splitBad\":%lld,\"digitRangeBad\":%lld,\"overflow\":%lld,\"bytesBad\":%lld,"
      "\"halfBad\":%lld,\"maxErrScaled\":%.3e,\"maxErrScaledF32Sequential\":%.3e}\n",
      st.rows, st.splitChecked, st.splitBad, st.digitRangeBad, st.overflow, bytesBad, halfBad, st.maxErrScaled, st.maxErrScaledF32);
  return 0;
}
