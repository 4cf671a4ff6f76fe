// Host attention over pinned-host KV pages (see host_attention.h).
#include "host_attention.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "host_pool.h"
#include "isa.h"

#ifndef NERVA_HOST_ATTN_NO_CUDA
#include <cuda_runtime.h>

#include "host_channel.h"
#endif

namespace {

using Clock = std::chrono::steady_clock;
using nerva_host::bf16ToF32;
using nerva_host::hsum;
using nerva_host::Scratch;
using nerva_host::vload;
using nerva_host::vmax;
using nerva_host::vsplat;
using nerva_host::vstore;
using nerva_host::Vec;


constexpr int kMaxHd = 256;
constexpr int kLanes = 16;   // the widest vector (floats): head rows and head counts are padded to a multiple
constexpr int kKeysAt = 16;  // keys scored before one online-softmax update
constexpr int kSplitKeys = 32;  // fewest cached positions per split (fewer cost more in merging than they spread)
constexpr int kHeadsAt = 4;  // query heads of one KV head taken together (a K/V piece is loaded once for them)

float halfToFloat(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        man <<= 1;
        e++;
      } while (!(man & 0x400));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Element i of a KV buffer as a float.
template <int DT>
NERVA_INLINE float kvAt(const void* base, size_t i) {
  if (DT == HOST_ATTN_F32) return ((const float*)base)[i];
  if (DT == HOST_ATTN_BF16) return bf16ToF32(((const uint16_t*)base)[i]);
  return halfToFloat(((const uint16_t*)base)[i]);
}

// exp(x) for x <= 0 (Cephes expf: x = n ln2 + r, |r| <= ln2/2, a polynomial in r, times 2^n):
// within 1 ulp (checked over [-100, 0], with and without FMA); 0 below ln(FLT_MIN) (the dropped
// subnormals are < 1.2e-38); NaN stays NaN. No calls or tables, so it vectorizes: a batch's
// weights take a few vector instructions, not a libm call per (head, key).
constexpr float kExpLo = -87.33654f, kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer, kept in the low bits
NERVA_INLINE float expPoly(float r) {
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.f;
}
NERVA_INLINE float expNeg(float x) {
  const bool under = x < kExpLo;
  if (under) x = kExpLo;
  const float t = x * kLog2e + kRound, n = t - kRound;
  const float r = x - n * kLn2Hi - n * kLn2Lo;
  uint32_t bits;
  std::memcpy(&bits, &t, 4);
  bits = (bits << 23) + (127u << 23);  // 2^n (the low bits of t are n, two's complement)
  float s;
  std::memcpy(&s, &bits, 4);
  return under ? 0.f : expPoly(r) * s;
}

// The sums of a, b, c and d into out[0..3]. With 16 lanes one transposing tree (13 shuffles and
// adds for the four, not four horizontal sums of 8 each: they competed with the FMAs).
template <int L>
NERVA_INLINE void hsum4(const NERVA_F& a, const NERVA_F& b, const NERVA_F& c, const NERVA_F& d, float* out) {
  if constexpr (L == 16) {
#if defined(__clang__) || __GNUC__ >= 12
#define NERVA_SHUF(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
#else
#define NERVA_SHUF(x, y, ...) __builtin_shuffle(x, y, NERVA_I{__VA_ARGS__})
#endif
    typedef NERVA_F F;
    const F ab = NERVA_SHUF(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                 NERVA_SHUF(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    const F cd = NERVA_SHUF(c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                 NERVA_SHUF(c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    F t = NERVA_SHUF(ab, cd, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
          NERVA_SHUF(ab, cd, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    t += NERVA_SHUF(t, t, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    t += NERVA_SHUF(t, t, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    t = NERVA_SHUF(t, t, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
#undef NERVA_SHUF
    std::memcpy(out, &t, 16);
  } else {
    out[0] = hsum<L>(a);
    out[1] = hsum<L>(b);
    out[2] = hsum<L>(c);
    out[3] = hsum<L>(d);
  }
}
template <int L>
NERVA_INLINE NERVA_F vexpNeg(const NERVA_F& x0) {
  typedef NERVA_F F;
  typedef NERVA_I I;
  const I under = x0 < kExpLo;
  const F x = vmax<L>(x0, vsplat<L>(kExpLo));
  const F t = x * kLog2e + kRound, n = t - kRound;
  const F r = x - n * kLn2Hi - n * kLn2Lo;
  F p = vsplat<L>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const F y = (p * r * r + r + 1.f) * (F)(((I)t << 23) + (127 << 23));
  return (F)(~under & (I)y);
}
// L KV elements at i as floats. bf16: the high half of an f32. f16: the exponent rebiased in the
// integer unit, subnormals renormalized by one float subtraction, inf/NaN kept (branch-free).
template <int DT, int L>
NERVA_INLINE NERVA_F loadKv(const void* base, size_t i) {
  typedef NERVA_F F;
  typedef NERVA_I I;
  if (DT == HOST_ATTN_F32) return vload<L>((const float*)base + i);
  typename Vec<L>::H h;
  std::memcpy(&h, (const uint16_t*)base + i, sizeof h);
  const I u = __builtin_convertvector(h, I);
  if (DT == HOST_ATTN_BF16) return (F)(u << 16);
  const I em = (u & 0x7fff) << 13, e = em & (0x1f << 23);
  I o = em + ((127 - 15) << 23);
  o += (e == (0x1f << 23)) & ((128 - 16) << 23);                     // inf, NaN: exponent 255
  const I sub = (I)((F)(o + (1 << 23)) - (F)(I{} + (113 << 23)));  // 0, subnormal
  const I isSub = e == 0;
  o = (isSub & sub) | (~isSub & o);
  return (F)(o | ((u & 0x8000) << 16));
}
// 2L KV elements at i as two vectors: f32 and f16 in order; bf16 the even elements, then the odd
// ones (each 32-bit lane holds an even and an odd one: a shift or a mask, no widening shuffle).
template <int DT, int L>
NERVA_INLINE void loadKv2(const void* base, size_t i, NERVA_F& lo, NERVA_F& hi) {
  typedef NERVA_F F;
  if (DT == HOST_ATTN_BF16) {
    NERVA_I x;
    std::memcpy(&x, (const uint16_t*)base + i, sizeof x);
    lo = (F)(x << 16);
    hi = (F)(x & (int32_t)0xffff0000u);
  } else {
    lo = loadKv<DT, L>(base, i);
    hi = loadKv<DT, L>(base, i + L);
  }
}

// The first n (< L) KV elements at i, the rest zero: the end of a head whose headDim is not a
// multiple of L (reading on would pass the buffer's end).
template <int DT, int L>
NERVA_INLINE NERVA_F loadKvPart(const void* base, size_t i, int n) {
  float t[L] = {};
  for (int j = 0; j < n; j++) t[j] = kvAt<DT>(base, i + j);
  return vload<L>(t);
}

// Scores of KX keys (the KV head's pieces of their rows at at[y]) against NJ query heads (q: rows
// of hdp floats in loadKv2's order, zero past hd), into out[y * os + j]. Each K piece is converted
// once for the NJ heads; with KX > 1 each q piece is loaded once for KX keys (with AVX-512, L1
// loads, not FMAs, were the limit with one key; it has the registers for 4).
template <int DT, int L, int NJ, int KX>
NERVA_INLINE void scoreKeys(const void* k, const size_t* at, const float* q, int hdp, int hd, float* out, size_t os) {
  typedef NERVA_F F;
  F acc[KX][NJ];
  NERVA_UNROLL for (int y = 0; y < KX; y++) NERVA_UNROLL for (int j = 0; j < NJ; j++) acc[y][j] = vsplat<L>(0.f);
  int i = 0;
  for (; i + 2 * L <= hd; i += 2 * L) {
    F ql[NJ], qh[NJ];
    NERVA_UNROLL for (int j = 0; j < NJ; j++) {
      F x0 = vload<L>(q + (size_t)j * hdp + i), x1 = vload<L>(q + (size_t)j * hdp + i + L);
#if defined(__GNUC__)
      // Kept in registers: GCC would fold them into each FMA again, one load per key.
      if constexpr (KX > 1) __asm__("" : "+v"(x0), "+v"(x1));
#endif
      ql[j] = x0;
      qh[j] = x1;
    }
    NERVA_UNROLL for (int y = 0; y < KX; y++) {
      F lo, hi;
      loadKv2<DT, L>(k, at[y] + i, lo, hi);
      NERVA_UNROLL for (int j = 0; j < NJ; j++) acc[y][j] = qh[j] * hi + (ql[j] * lo + acc[y][j]);
    }
  }
  for (; i < hd; i += L) {
    NERVA_UNROLL for (int y = 0; y < KX; y++) {
      const F kv = i + L <= hd ? loadKv<DT, L>(k, at[y] + i) : loadKvPart<DT, L>(k, at[y] + i, hd - i);
      NERVA_UNROLL for (int j = 0; j < NJ; j++) acc[y][j] = vload<L>(q + (size_t)j * hdp + i) * kv + acc[y][j];
    }
  }
  NERVA_UNROLL for (int y = 0; y < KX; y++) {
    if (NJ == 4) {
      hsum4<L>(acc[y][0], acc[y][NJ > 1 ? 1 : 0], acc[y][NJ > 2 ? 2 : 0], acc[y][NJ - 1], out + y * os);
    } else {
      NERVA_UNROLL for (int j = 0; j < NJ; j++) out[y * os + j] = hsum<L>(acc[y][j]);
    }
  }
}

// acc[j] += sum over the n keys of w[x * ws + j] * V piece of key x (rows at off[x] + seg), for
// NJ query heads of one KV head: per 2L columns the accumulators stay in registers over the keys
// (one load and store per batch, not per key) and each V piece is converted once.
template <int DT, int L, int NJ>
NERVA_INLINE void accumulate(const void* v, const size_t* off, int n, size_t seg, const float* w, int ws, float* acc,
                             int hdp, int hd) {
  typedef NERVA_F F;
  int i = 0;
  for (; i + 2 * L <= hd; i += 2 * L) {
    F sl[NJ], sh[NJ];
    NERVA_UNROLL for (int j = 0; j < NJ; j++) {
      sl[j] = vload<L>(acc + (size_t)j * hdp + i);
      sh[j] = vload<L>(acc + (size_t)j * hdp + i + L);
    }
    for (int x = 0; x < n; x++) {
      F lo, hi;
      loadKv2<DT, L>(v, off[x] + seg + i, lo, hi);
      NERVA_UNROLL for (int j = 0; j < NJ; j++) {
        const float wj = w[(size_t)x * ws + j];  // scalar * vector: an embedded broadcast
        sl[j] = wj * lo + sl[j];
        sh[j] = wj * hi + sh[j];
      }
    }
    NERVA_UNROLL for (int j = 0; j < NJ; j++) {
      vstore<L>(acc + (size_t)j * hdp + i, sl[j]);
      vstore<L>(acc + (size_t)j * hdp + i + L, sh[j]);
    }
  }
  for (; i < hd; i += L) {
    F s[NJ];
    NERVA_UNROLL for (int j = 0; j < NJ; j++) s[j] = vload<L>(acc + (size_t)j * hdp + i);
    for (int x = 0; x < n; x++) {
      const F vv = i + L <= hd ? loadKv<DT, L>(v, off[x] + seg + i) : loadKvPart<DT, L>(v, off[x] + seg + i, hd - i);
      NERVA_UNROLL for (int j = 0; j < NJ; j++) s[j] = w[(size_t)x * ws + j] * vv + s[j];
    }
    NERVA_UNROLL for (int j = 0; j < NJ; j++) vstore<L>(acc + (size_t)j * hdp + i, s[j]);
  }
}

// Prefetches the next batch's K and V rows a few lines at a time, spread over this batch's work
// (a burst of hundreds of prefetches stalls on the miss buffers).
struct Prefetcher {
  const char* rows[2 * kKeysAt];
  int nrows = 0, row = 0;
  size_t bytes = 0, o = 0;
  void reset(const void* k, const void* v, const size_t* off, int n, size_t eb, size_t rowBytes) {
    nrows = 2 * n;
    row = 0;
    o = 0;
    bytes = rowBytes;
    for (int x = 0; x < n; x++) {
      rows[x] = (const char*)k + off[x] * eb;
      rows[n + x] = (const char*)v + off[x] * eb;
    }
  }
  NERVA_INLINE void step(int lines) {
#if defined(__GNUC__)
    for (; lines > 0 && row < nrows; lines--) {
      __builtin_prefetch(rows[row] + o, 0, 1);  // into L2 (L1 is for q and the accumulators)
      o += 64;
      if (o >= bytes) {
        o = 0;
        row++;
      }
    }
#else
    (void)lines;
#endif
  }
};

// The scores of KX keys against every head: sc[x * Hp + h].
template <int DT, int L, int KX>
NERVA_INLINE void scoreRows(const HostAttnArgs& a, const size_t* off, const float* qs, int hdp, float* sc, int Hp,
                            Prefetcher& pf, int pfLines) {
  const int hd = a.headDim, KVH = a.numKvHeads, G = a.numHeads / KVH;
  for (int g = 0; g < KVH; g++) {
    pf.step(pfLines);
    size_t at[KX];
    NERVA_UNROLL for (int y = 0; y < KX; y++) at[y] = off[y] + (size_t)g * hd;
    for (int j = 0; j < G; j += kHeadsAt) {
      const int h = g * G + j;
      const float* q = qs + (size_t)h * hdp;
      float* s = sc + h;
      switch (std::min(kHeadsAt, G - j)) {
        case 4: scoreKeys<DT, L, 4, KX>(a.k, at, q, hdp, hd, s, Hp); break;
        case 3: scoreKeys<DT, L, 3, KX>(a.k, at, q, hdp, hd, s, Hp); break;
        case 2: scoreKeys<DT, L, 2, KX>(a.k, at, q, hdp, hd, s, Hp); break;
        default: scoreKeys<DT, L, 1, KX>(a.k, at, q, hdp, hd, s, Hp); break;
      }
    }
  }
}

// The next batch of up to kKeysAt positions of [p, p1] present in this cache (their row offsets
// into off), advancing p. -1 when a block id is outside the cache.
NERVA_INLINE int gather(const HostAttnArgs& a, const int* table, int& p, int p1, size_t width, size_t* off) {
  const int bs = a.blockSize;
  int n = 0;
  while (p <= p1 && n < kKeysAt) {
    const int b = p / bs, e = table[b], end = std::min(p1, b * bs + bs - 1);
    if (e < 0) {  // not in this cache
      p = end + 1;
      continue;
    }
    if (e >= a.numBlocks) return -1;
    for (; p <= end && n < kKeysAt; p++) off[n++] = ((size_t)e * bs + (size_t)(p - b * bs)) * width;
  }
  return n;
}

// Per-thread scratch layout (floats): q and acc (H rows of hdp each), the scores of a batch
// (kKeysAt rows of Hp = H rounded up to kLanes, so a softmax step covers kLanes heads), m, l and
// the rescale factors (Hp each).
constexpr size_t padTo(size_t n, size_t m) { return (n + m - 1) / m * m; }
inline size_t scratchFloats(int H, int hd) {
  const size_t Hp = padTo((size_t)H, kLanes);
  return 2 * (size_t)H * padTo((size_t)hd, kLanes) + Hp * kKeysAt + 3 * Hp;
}

// The online softmax over the batches of [p0, p1], into m, l (Hp each) and acc (H rows of hdp):
// per batch of up to kKeysAt keys, the scores sc[x][h] (KX keys at a time), one update per head
// (new max, weights exp(s - max) in place of the scores, one rescale of the old sum and
// accumulator, not one per key), then the weighted values. While a batch computes, the next
// one's rows are prefetched into L2. False when a block id is outside the cache.
template <int DT, int L, int KX>
NERVA_INLINE bool attendSpanT(const HostAttnArgs& a, const int* table, int p0, int p1, const float* qs, float* acc,
                              float* sc, float* m, float* l, float* cs) {
  const int hd = a.headDim, hdp = (int)padTo((size_t)hd, kLanes), KVH = a.numKvHeads, H = a.numHeads, G = H / KVH;
  const int Hp = (int)padTo((size_t)H, kLanes);
  const size_t width = (size_t)KVH * hd, eb = DT == HOST_ATTN_F32 ? 4 : 2, rowBytes = width * eb;
  size_t offs[2][kKeysAt];
  Prefetcher pf;
  int p = p0, cur = 0;
  int n = gather(a, table, p, p1, width, offs[0]);
  while (n > 0) {
    const size_t* off = offs[cur];
    const int nn = gather(a, table, p, p1, width, offs[cur ^ 1]);
    if (nn < 0) return false;
    // The next batch's K and V rows, spread over the (n / KX + n % KX) * KVH score steps and the
    // KVH value steps of this one.
    pf.reset(a.k, a.v, offs[cur ^ 1], nn, eb, rowBytes);
    const int steps = (n / KX + n % KX) * KVH + KVH;
    const int pfLines = (int)((2 * (size_t)nn * rowBytes / 64 + steps - 1) / steps);
    int x = 0;
    for (; x + KX <= n; x += KX) scoreRows<DT, L, KX>(a, off + x, qs, hdp, sc + (size_t)x * Hp, Hp, pf, pfLines);
    for (; x < n; x++) scoreRows<DT, L, 1>(a, off + x, qs, hdp, sc + (size_t)x * Hp, Hp, pf, pfLines);
    typedef NERVA_F F;
    for (int h = 0; h < Hp; h += L) {
      const F mo = vload<L>(m + h);
      F mx = mo;
      for (x = 0; x < n; x++) mx = vmax<L>(mx, vload<L>(sc + (size_t)x * Hp + h));
      const F c = vexpNeg<L>(mo - mx);  // 0 for the first batch (m = -inf), 1 while the max holds
      F sum = vsplat<L>(0.f);
      for (x = 0; x < n; x++) {
        const F w = vexpNeg<L>(vload<L>(sc + (size_t)x * Hp + h) - mx);
        vstore<L>(sc + (size_t)x * Hp + h, w);
        sum += w;
      }
      vstore<L>(l + h, vload<L>(l + h) * c + sum);
      vstore<L>(m + h, mx);
      vstore<L>(cs + h, c);
    }
    for (int h = 0; h < H; h++)
      if (cs[h] != 1.f) {
        float* ah = acc + (size_t)h * hdp;
        for (int i = 0; i < hdp; i += L) vstore<L>(ah + i, cs[h] * vload<L>(ah + i));
      }
    for (int g = 0; g < KVH; g++) {
      pf.step(pfLines);
      for (int j = 0; j < G; j += kHeadsAt) {
        const int h = g * G + j;
        float* ah = acc + (size_t)h * hdp;
        const size_t seg = (size_t)g * hd;
        switch (std::min(kHeadsAt, G - j)) {
          case 4: accumulate<DT, L, 4>(a.v, off, n, seg, sc + h, Hp, ah, hdp, hd); break;
          case 3: accumulate<DT, L, 3>(a.v, off, n, seg, sc + h, Hp, ah, hdp, hd); break;
          case 2: accumulate<DT, L, 2>(a.v, off, n, seg, sc + h, Hp, ah, hdp, hd); break;
          default: accumulate<DT, L, 1>(a.v, off, n, seg, sc + h, Hp, ah, hdp, hd); break;
        }
      }
    }
    n = nn;
    cur ^= 1;
  }
  return n == 0;
}

// The partials of row r over its positions [p0, p1]: for each query head h, (m, l, acc[hd]) at
// part + h * partStride. A position's keys (and values) of all KV heads are one contiguous row, so
// a split streams through contiguous memory (per-KV-head tasks read 512-byte pieces 4 KiB apart
// and were latency-bound). scratch: scratchFloats(H, hd). False when a block id is outside the
// cache.
template <int L, int KX>
NERVA_INLINE bool spanPartialsT(const HostAttnArgs& a, int r, int p0, int p1, float* scratch, float* part, size_t partStride) {
  const int H = a.numHeads, hd = a.headDim, hdp = (int)padTo((size_t)hd, kLanes), hd2L = hd / (2 * L) * (2 * L);
  const int Hp = (int)padTo((size_t)H, kLanes);
  const bool split = a.kvDtype == HOST_ATTN_BF16;  // loadKv2's order within whole 2L
  const int* table = a.tables + (size_t)a.rowSeq[r] * a.maxBlocksPerSeq;
  {
    // The first batch's rows (no batch before it prefetched them) are requested before q is laid
    // out, which hides part of their latency.
    size_t off[kKeysAt];
    int p = p0;
    const int n = gather(a, table, p, p1, (size_t)a.numKvHeads * hd, off);
    const size_t eb = a.kvDtype == HOST_ATTN_F32 ? 4 : 2;
    Prefetcher pf;
    if (n > 0) {
      pf.reset(a.k, a.v, off, n, eb, (size_t)a.numKvHeads * hd * eb);
      pf.step(1 << 30);
    }
  }
  float* qs = scratch;                // H rows of hdp: q * scale, loadKv2's order, zero past hd
  float* acc = qs + (size_t)H * hdp;  // H rows of hdp
  float* sc = acc + (size_t)H * hdp;  // kKeysAt rows of Hp: scores, then weights
  float* m = sc + (size_t)kKeysAt * Hp;
  float* l = m + Hp;
  float* cs = l + Hp;
  for (int h = 0; h < H; h++) {
    const float* qr = a.q + ((size_t)r * H + h) * hd;
    float* d = qs + (size_t)h * hdp;
    if (split) {
      for (int c = 0; c < hd2L; c += 2 * L)
        for (int t = 0; t < L; t++) {
          d[c + t] = qr[c + 2 * t] * a.scale;
          d[c + L + t] = qr[c + 2 * t + 1] * a.scale;
        }
    } else {
      for (int t = 0; t < hd2L; t++) d[t] = qr[t] * a.scale;
    }
    for (int t = hd2L; t < hd; t++) d[t] = qr[t] * a.scale;
    for (int t = hd; t < hdp; t++) d[t] = 0.f;
    for (int t = 0; t < hdp; t++) acc[(size_t)h * hdp + t] = 0.f;
  }
  for (int t = 0; t < kKeysAt * Hp; t++) sc[t] = 0.f;  // padding heads H..Hp: finite, unused
  for (int h = 0; h < Hp; h++) {
    m[h] = -INFINITY;
    l[h] = 0.f;
  }
  bool ok;
  switch (a.kvDtype) {
    case HOST_ATTN_BF16: ok = attendSpanT<HOST_ATTN_BF16, L, KX>(a, table, p0, p1, qs, acc, sc, m, l, cs); break;
    case HOST_ATTN_F16: ok = attendSpanT<HOST_ATTN_F16, L, KX>(a, table, p0, p1, qs, acc, sc, m, l, cs); break;
    default: ok = attendSpanT<HOST_ATTN_F32, L, KX>(a, table, p0, p1, qs, acc, sc, m, l, cs); break;
  }
  if (!ok) return false;
  for (int h = 0; h < H; h++) {
    const float* ah = acc + (size_t)h * hdp;
    float* d = part + (size_t)h * partStride;
    d[0] = m[h];
    d[1] = l[h];
    if (split) {
      for (int c = 0; c < hd2L; c += 2 * L)
        for (int t = 0; t < L; t++) {
          d[2 + c + 2 * t] = ah[c + t];
          d[2 + c + 2 * t + 1] = ah[c + L + t];
        }
    } else {
      for (int t = 0; t < hd2L; t++) d[2 + t] = ah[t];
    }
    for (int t = hd2L; t < hd; t++) d[2 + t] = ah[t];
  }
  return true;
}

constexpr int kBaseLanes = 4;  // the baseline: 16-byte vectors (SSE2 on x86-64)
typedef bool (*SpanFn)(const HostAttnArgs& a, int r, int p0, int p1, float* scratch, float* part, size_t partStride);
NERVA_BASE bool spanBase(const HostAttnArgs& a, int r, int p0, int p1, float* scratch, float* part, size_t partStride) {
  return spanPartialsT<kBaseLanes, 1>(a, r, p0, p1, scratch, part, partStride);
}
#if NERVA_X86_TARGETS
NERVA_V3 bool spanV3(const HostAttnArgs& a, int r, int p0, int p1, float* scratch, float* part, size_t partStride) {
  return spanPartialsT<8, 1>(a, r, p0, p1, scratch, part, partStride);
}
NERVA_V4 bool spanV4(const HostAttnArgs& a, int r, int p0, int p1, float* scratch, float* part, size_t partStride) {
  return spanPartialsT<16, 4>(a, r, p0, p1, scratch, part, partStride);
}
#endif

// The entry point of the ISA layer's path (isa.h; every thread uses the same one, so results do
// not depend on the thread count).
SpanFn pickSpanFn() {
#if NERVA_X86_TARGETS
  const int isa = nerva_host_isa_best();
  if (isa >= HOST_ISA_AVX512) return spanV4;
  if (isa >= HOST_ISA_AVX2) return spanV3;
#endif
  return spanBase;
}
SpanFn spanFn() {
  static const SpanFn f = pickSpanFn();
  return f;
}

// The module's state: scratch and the current call's plan. The threads are the shared host
// pool's (host_pool.h); its hold (HostPoolCall) also guards this.
class Attn {
 public:
  void reserve(int rows, int H, int KVH, int hd) {
    HostPoolCall call;
    reserveLocked(rows, H, KVH, hd, call.threads());
  }

  void run(const HostAttnArgs& a) {
    HostPoolCall call;
    Clock::time_point t0 = Clock::now();
    plan(a, call.threads());
    // Phase 0: the partials of (row, split) tasks; phase 1: the merge of each (row, head).
    HostPoolJob job;
    job.fn = [](void* self, int phase, int i, int thread) {
      Attn& m = *static_cast<Attn*>(self);
      if (phase == 0) m.task(i, m.threadScratch_.p + (size_t)thread * m.stride_);
      else m.merge(i);
    };
    job.ctx = this;
    job.phases = 2;
    job.tasks[0] = n_[0];
    job.tasks[1] = n_[1];
    call.run(job);
    if (a.counters) {
      a.counters->calls++;
      a.counters->ns += (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      a.counters->keys += keys_;
      for (int r = 0; r < a.rows; r++) a.counters->badBlocks += bad_.p[r].load(std::memory_order_relaxed) ? 1 : 0;
    }
  }

 private:
  // Most splits per row: up to 256 tasks a call, at most 64 per row; a split covers at least
  // kSplitKeys positions. Neither depends on the thread count, so neither does the result (each
  // partial is summed by one thread in position order, the merge is in split order).
  static int splitsFor(int rows) { return (int)std::max(1, std::min(64, 256 / std::max(1, rows))); }

  static size_t padHd(int hd) { return ((size_t)hd + kLanes - 1) / kLanes * kLanes; }

  // Floats of one thread's scratch (scratchFloats), a multiple of 16 (64 bytes) so threads share
  // no lines.
  static size_t threadFloats(int H, int hd) { return padTo(scratchFloats(H, hd), 16); }

  // Per-thread scratch for `threads` threads: sized under the hold that runs the call.
  void reserveLocked(int rows, int H, int KVH, int hd, int threads) {
    if (rows <= 0 || H <= 0 || KVH <= 0 || hd <= 0) return;
    part_.reserve((size_t)rows * H * (size_t)splitsFor(rows) * (padHd(hd) + 2));
    nsplit_.reserve((size_t)rows);
    splitLo_.reserve((size_t)rows * (size_t)splitsFor(rows));
    bad_.reserve((size_t)rows);
    threadScratch_.reserve(threadFloats(H, hd) * (size_t)std::max(1, threads));
  }

  void plan(const HostAttnArgs& a, int threads) {
    const int rows = a.rows, KVH = a.numKvHeads, bs = a.blockSize;
    reserveLocked(rows, a.numHeads, KVH, a.headDim, threads);
    a_ = &a;
    S_ = splitsFor(rows);
    stride_ = threadFloats(a.numHeads, a.headDim);
    hdp_ = (int)padHd(a.headDim);
    keys_ = 0;
    for (int r = 0; r < rows; r++) {
      const int seq = a.rowSeq[r], pos = a.positions[r];
      const bool ok = seq >= 0 && seq < a.numSeqs && pos >= 0 && (long long)pos < (long long)a.maxBlocksPerSeq * bs;
      new (&bad_.p[r]) std::atomic<int>(ok ? 0 : 1);
      const int lo = a.window > 0 ? std::max(0, pos - a.window + 1) : 0;
      const int len = ok ? pos - lo + 1 : 0;
      keys_ += (uint64_t)len * KVH;
      // Splits share out the blocks this table holds (tiered KV: the warm ones, often 3/4 of the
      // row or less), not the positions: a split over blocks held elsewhere would be an empty
      // task, and the tasks that remain would spread unevenly over the threads. Split s starts
      // at held block floor(s * nb / ns); the first also takes the positions before it.
      int nb = 0;
      const int* table = ok ? a.tables + (size_t)seq * a.maxBlocksPerSeq : nullptr;
      if (len > 0)
        for (int b = lo / bs; b <= pos / bs; b++) nb += table[b] >= 0 ? 1 : 0;
      const int ns = nb == 0 ? 0 : std::min({S_, nb, (int)(((long long)nb * bs + kSplitKeys - 1) / kSplitKeys)});
      nsplit_.p[r] = ns;
      int* sl = splitLo_.p + (size_t)r * S_;
      for (int b = lo / bs, k = 0, s = 0; ns > 0 && b <= pos / bs && s < ns; b++) {
        if (table[b] < 0) continue;
        if (k == (int)((long long)s * nb / ns)) {
          sl[s] = s == 0 ? lo : std::max(lo, b * bs);
          s++;
        }
        k++;
      }
    }
    n_[0] = rows * S_;
    n_[1] = rows * a.numHeads;
  }

  float* partAt(int r, int h, int s) const {
    return part_.p + (((size_t)r * a_->numHeads + h) * S_ + s) * (size_t)(hdp_ + 2);
  }

  void task(int i, float* scratch) {
    const HostAttnArgs& a = *a_;
    const int s = i % S_, r = i / S_;
    const int ns = nsplit_.p[r];
    if (s >= ns || bad_.p[r].load(std::memory_order_relaxed)) return;
    const int* sl = splitLo_.p + (size_t)r * S_;
    const int p0 = sl[s], p1 = s + 1 < ns ? sl[s + 1] - 1 : a.positions[r];
    if (!spanFn()(a, r, p0, p1, scratch, partAt(r, 0, s), (size_t)S_ * (hdp_ + 2)))
      bad_.p[r].store(1, std::memory_order_relaxed);
  }

  void merge(int i) {
    const HostAttnArgs& a = *a_;
    const int H = a.numHeads, hd = a.headDim, r = i / H, h = i % H;
    float* o = a.out + (size_t)r * H * hd + (size_t)h * hd;
    if (bad_.p[r].load(std::memory_order_relaxed)) {
      for (int t = 0; t < hd; t++) o[t] = NAN;
      if (a.lse) a.lse[(size_t)r * H + h] = NAN;
      return;
    }
    const int ns = nsplit_.p[r];
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) {
      const float* p = partAt(r, h, s);
      if (p[1] > 0.f) M = std::max(M, p[0]);
    }
    float L = 0.f;
    for (int t = 0; t < hd; t++) o[t] = 0.f;
    if (M != -INFINITY) {
      for (int s = 0; s < ns; s++) {
        const float* p = partAt(r, h, s);
        if (!(p[1] > 0.f)) continue;
        const float w = std::exp(p[0] - M);
        L += p[1] * w;
        for (int t = 0; t < hd; t++) o[t] += p[2 + t] * w;
      }
      for (int t = 0; t < hd; t++) o[t] /= L;
    }
    if (a.lse) a.lse[(size_t)r * H + h] = L > 0.f ? M + std::log(L) : -INFINITY;
  }

  const HostAttnArgs* a_ = nullptr;
  int S_ = 1, hdp_ = 0, n_[2] = {0, 0};
  size_t stride_ = 0;
  uint64_t keys_ = 0;
  Scratch<float> part_, threadScratch_;
  Scratch<int> nsplit_, splitLo_;
  Scratch<std::atomic<int>> bad_;
};

// Created on first use, never destroyed (like the pool).
Attn& attn() {
  static Attn* m = new Attn();
  return *m;
}

}  // namespace

const char* nerva_host_attention_validate(const HostAttnArgs& a) {
  if (a.rows < 0) return "rows must be >= 0";
  if (a.numHeads < 1 || a.numKvHeads < 1 || a.numHeads % a.numKvHeads != 0) return "numHeads must be a positive multiple of numKvHeads";
  if (a.headDim < 1 || a.headDim > kMaxHd) return "headDim must be in 1..256";
  if (a.blockSize < 1 || a.maxBlocksPerSeq < 1) return "blockSize and maxBlocksPerSeq must be >= 1";
  if (a.numSeqs < 0 || a.numBlocks < 0) return "numSeqs and numBlocks must be >= 0";
  if (a.window < 0) return "window must be >= 0";
  if (!std::isfinite(a.scale)) return "scale must be finite";
  if (a.kvDtype < HOST_ATTN_F32 || a.kvDtype > HOST_ATTN_F16) return "the KV cache dtype must be f32, bf16 or f16";
  if (a.rows > 0 && (!a.k || !a.v || !a.q || !a.tables || !a.rowSeq || !a.positions || !a.out)) return "a buffer is null";
  return nullptr;
}

void nerva_host_attention_reserve(int rows, int numHeads, int numKvHeads, int headDim) {
  attn().reserve(rows, numHeads, numKvHeads, headDim);
}

void nerva_host_attention(const HostAttnArgs& a) {
  if (a.rows <= 0) return;
  attn().run(a);
}

void nerva_host_attention_configure(int threads) { nerva_host_pool_configure(threads, -1); }
int nerva_host_attention_threads() { return nerva_host_pool_threads(); }

#ifndef NERVA_HOST_ATTN_NO_CUDA
void nerva_host_attention_channel_fn(void* p) {
  const HostAttnArgs& a = *static_cast<const HostAttnArgs*>(p);
  try {
    nerva_host_attention(a);
  } catch (...) {
    // Only a scratch allocation can throw (reserve avoids it): poison the output so it shows.
    for (size_t i = 0; i < (size_t)a.rows * a.numHeads * a.headDim; i++) a.out[i] = std::nanf("");
  }
}

int nerva_host_attention_enqueue(CUstream_st* s, const HostAttnArgs* a, const HostAttnStage* st) {
  if (!a || !st || nerva_host_attention_validate(*a) || !st->outDst || (a->lse && !st->lseDst)) return (int)cudaErrorInvalidValue;
  if (a->rows <= 0) return 0;
  if (!st->channel || !st->qDev || !st->intsDev || !st->outHostDev || (a->lse && !st->lseHostDev)) return (int)cudaErrorInvalidValue;
  const size_t qw = (size_t)a->numHeads * a->headDim;
  const size_t nTables = (size_t)a->numSeqs * a->maxBlocksPerSeq;
  HostChannelCopy in[4], out[2];
  in[0] = {st->qDev, st->qSrc + st->qOffset, (uint32_t)qw, (uint32_t)a->rows, (uint32_t)qw, (uint32_t)st->qStride};
  in[1] = {st->intsDev, st->tablesSrc, (uint32_t)nTables, 1, 0, 0};
  in[2] = {st->intsDev + nTables, st->rowSeqSrc, (uint32_t)a->rows, 1, 0, 0};
  in[3] = {st->intsDev + nTables + a->rows, st->positionsSrc, (uint32_t)a->rows, 1, 0, 0};
  out[0] = {st->outDst, st->outHostDev, (uint32_t)(qw * a->rows), 1, 0, 0};
  int nOut = 1;
  if (a->lse) out[nOut++] = {st->lseDst, st->lseHostDev, (uint32_t)((size_t)a->rows * a->numHeads), 1, 0, 0};
  return nerva_host_channel_enqueue(s, st->channel, in, 4, out, nOut);
}
#endif
