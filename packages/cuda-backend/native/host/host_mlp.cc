// Host MLP: see host_mlp.h for the math, the threading and the environment variables.
#include "host_mlp.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "host_pool.h"
#include "isa.h"

#if NERVA_HOST_X86
#include <immintrin.h>
#endif

#ifndef NERVA_HOST_MLP_NO_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;
using nerva_host::bf16ToF32;

// ---------------------------------------------------------------------------------------------
// Dot kernels: out[n * R + r] = sum_k bf16(w[n][k]) * X[r * ldx + k] for n < N weight rows and
// r < R activation rows, f32 accumulation. Each weight vector is converted once and used for all R
// rows, and each activation vector is loaded once for all N weight rows: the N*R accumulators are
// independent chains (FMA latency hidden) and the activations (up to 8 rows of H or c floats, more
// than L1 holds) are read N times less often. A kernel handles R <= 8; larger counts take several
// passes of 8.

typedef void (*DotFn)(const uint16_t* const* w, int K, const float* X, size_t ldx, float* out);

template <int N, int R>
void dotScalar(const uint16_t* const* w, int K, const float* X, size_t ldx, float* out) {
  float acc[N][R];
  for (int n = 0; n < N; n++)
    for (int r = 0; r < R; r++) acc[n][r] = 0.f;
  for (int k = 0; k < K; k++)
    for (int n = 0; n < N; n++) {
      float wk = bf16ToF32(w[n][k]);
      for (int r = 0; r < R; r++) acc[n][r] += wk * X[r * ldx + k];
    }
  for (int n = 0; n < N; n++)
    for (int r = 0; r < R; r++) out[n * R + r] = acc[n][r];
}

#if NERVA_HOST_X86
// GCC 12's intrinsic headers self-initialize "undefined" vectors (`__m512i __Y = __Y;`), which
// -Wall reports as uninitialized once inlined here: a known false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

NERVA_AVX2 inline __m256 bf16x8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128((const __m128i*)p);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

NERVA_AVX2 inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int N, int R>
NERVA_AVX2 void dotAvx2(const uint16_t* const* w, int K, const float* X, size_t ldx, float* out) {
  __m256 acc[N][R];
  const uint16_t* wp[N];
#pragma GCC unroll 8
  for (int n = 0; n < N; n++) {
    wp[n] = w[n];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[n][r] = _mm256_setzero_ps();
  }
  int k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[N];
#pragma GCC unroll 8
    for (int n = 0; n < N; n++) wv[n] = bf16x8(wp[n] + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      __m256 xv = _mm256_loadu_ps(X + r * ldx + k);
#pragma GCC unroll 8
      for (int n = 0; n < N; n++) acc[n][r] = _mm256_fmadd_ps(wv[n], xv, acc[n][r]);
    }
  }
#pragma GCC unroll 8
  for (int n = 0; n < N; n++)
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      float t = hsum256(acc[n][r]);
      for (int kk = k; kk < K; kk++) t += bf16ToF32(wp[n][kk]) * X[r * ldx + kk];
      out[n * R + r] = t;
    }
}

NERVA_AVX512 inline __m512 bf16x16(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256((const __m256i*)p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

NERVA_AVX512 inline __m512 bf16x16Masked(const uint16_t* p, __mmask16 m) {
  __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int N, int R>
NERVA_AVX512 void dotAvx512(const uint16_t* const* w, int K, const float* X, size_t ldx, float* out) {
  __m512 acc[N][R];
  const uint16_t* wp[N];
#pragma GCC unroll 8
  for (int n = 0; n < N; n++) {
    wp[n] = w[n];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[n][r] = _mm512_setzero_ps();
  }
  int k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[N];
#pragma GCC unroll 8
    for (int n = 0; n < N; n++) wv[n] = bf16x16(wp[n] + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      __m512 xv = _mm512_loadu_ps(X + r * ldx + k);
#pragma GCC unroll 8
      for (int n = 0; n < N; n++) acc[n][r] = _mm512_fmadd_ps(wv[n], xv, acc[n][r]);
    }
  }
  if (k < K) {  // the tail: masked loads (masked-off lanes are not read)
    __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
    __m512 wv[N];
#pragma GCC unroll 8
    for (int n = 0; n < N; n++) wv[n] = bf16x16Masked(wp[n] + k, m);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      __m512 xv = _mm512_maskz_loadu_ps(m, X + r * ldx + k);
#pragma GCC unroll 8
      for (int n = 0; n < N; n++) acc[n][r] = _mm512_fmadd_ps(wv[n], xv, acc[n][r]);
    }
  }
#pragma GCC unroll 8
  for (int n = 0; n < N; n++)
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) out[n * R + r] = _mm512_reduce_add_ps(acc[n][r]);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // NERVA_HOST_X86

// Kernel tables [N = 1, 2, 4][R = 1..8], and the weight-row count N each ISA uses for R rows:
// N * R accumulators + N weight vectors + 1 activation vector fit the registers (AVX2: 16 ymm,
// AVX-512: 32 zmm; the scalar path relies on the compiler).
struct Kernels {
  DotFn f[3][9];
  int n[9];
};

#define NERVA_ROW(fn, N) \
  { nullptr, fn<N, 1>, fn<N, 2>, fn<N, 3>, fn<N, 4>, fn<N, 5>, fn<N, 6>, fn<N, 7>, fn<N, 8> }
const Kernels kScalar = {{NERVA_ROW(dotScalar, 1), NERVA_ROW(dotScalar, 2), NERVA_ROW(dotScalar, 4)},
                         {0, 2, 2, 2, 2, 2, 2, 2, 2}};
#if NERVA_HOST_X86
const Kernels kAvx2 = {{NERVA_ROW(dotAvx2, 1), NERVA_ROW(dotAvx2, 2), NERVA_ROW(dotAvx2, 4)},
                       {0, 4, 4, 2, 2, 2, 2, 1, 1}};
const Kernels kAvx512 = {{NERVA_ROW(dotAvx512, 1), NERVA_ROW(dotAvx512, 2), NERVA_ROW(dotAvx512, 4)},
                         {0, 4, 4, 4, 4, 4, 4, 2, 2}};
#endif
#undef NERVA_ROW

inline DotFn kernel(const Kernels* k, int N, int R) { return k->f[N == 4 ? 2 : N == 2 ? 1 : 0][R]; }

const Kernels* kernelsFor(int isa) {
#if NERVA_HOST_X86
  if (isa == HOST_ISA_AVX512) return &kAvx512;
  if (isa == HOST_ISA_AVX2) return &kAvx2;
#endif
  (void)isa;
  return &kScalar;
}

using Scratch = nerva_host::Scratch<float>;

inline size_t padded(int n) { return ((size_t)n + 15) & ~(size_t)15; }

// One call's plan. Phase 0: RMSNorm, a chunk per row. Phase 1: gate/up + silu*mul, chunks of
// `per[1]` intermediate channels. Phase 2: down, chunks of `per[2]` output rows of H.
struct Job {
  const HostMlpArgs* a = nullptr;
  const Kernels* tab = nullptr;
  float* xn = nullptr;  // [rows, ldx]
  size_t ldx = 0;
  float* act = nullptr;  // [rows, lda]
  size_t lda = 0;
  int n[3] = {0, 0, 0};    // chunks per phase
  int per[3] = {1, 1, 1};  // items per chunk
};

// The module's state: scratch, the current call's plan, the vector path and the counters. The
// threads are the shared host pool's (host_pool.h); its hold (HostPoolCall) also guards this.
class Mlp {
 public:
  Mlp() : isa_(nerva_host_isa_best()) {}

  int setIsa(int isa) {
    if (isa < HOST_ISA_SCALAR || isa > HOST_ISA_AVX512 || !nerva_host_isa_supported(isa)) return -1;
    HostPoolCall call;  // waits for a running call
    isa_ = isa;
    return isa;
  }

  void reserve(int rows, int hidden, int inter) {
    HostPoolCall call;
    reserveLocked(rows, hidden, inter);
  }

  HostMlpStats stats() {
    HostMlpStats s;
    // No hold: stats must not wait for a running call.
    s.calls = calls_.load(std::memory_order_relaxed);
    s.ns = ns_.load(std::memory_order_relaxed);
    s.threads = nerva_host_pool_threads();
    s.isa = isa_.load(std::memory_order_relaxed);
    s.pinned = nerva_host_pool_pinned();
    return s;
  }

  void run(const HostMlpArgs& a) {
    HostPoolCall call;
    Clock::time_point t0 = Clock::now();
    const int rows = a.rows, H = a.hidden, c = a.inter;
    if (c == 0) {
      std::memset(a.y, 0, sizeof(float) * (size_t)rows * H);
    } else {
      reserveLocked(rows, H, c);
      plan(a, call.threads());
      HostPoolJob job;
      job.fn = [](void* self, int phase, int i, int) { static_cast<Mlp*>(self)->chunkWork(phase, i); };
      job.ctx = this;
      job.phases = 3;
      for (int p = 0; p < 3; p++) job.tasks[p] = job_.n[p];
      call.run(job);
    }
    uint64_t ns = (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    calls_.fetch_add(1, std::memory_order_relaxed);
    ns_.fetch_add(ns, std::memory_order_relaxed);
    if (a.counters) {
      a.counters->calls++;
      a.counters->ns += ns;
    }
  }

 private:
  void reserveLocked(int rows, int hidden, int inter) {
    if (rows <= 0) return;
    xn_.reserve((size_t)rows * padded(hidden));
    act_.reserve((size_t)rows * padded(inter > 0 ? inter : 1));
  }

  void plan(const HostMlpArgs& a, int T) {
    const int rows = a.rows, H = a.hidden, c = a.inter;
    Job& j = job_;
    j.a = &a;
    j.tab = kernelsFor(isa_);
    j.ldx = padded(H);
    j.xn = xn_.p;
    j.lda = padded(c);
    j.act = act_.p;
    // Chunks of about 128 KiB of weights, and at least ~8 chunks per thread where the sizes allow
    // (dynamic balance against a slow or descheduled thread).
    const size_t target = 128 * 1024;
    auto chunk = [&](int items, size_t bytesPerItem) {
      size_t per = target / (bytesPerItem ? bytesPerItem : 1);
      size_t fair = ((size_t)items + 8 * (size_t)T - 1) / (8 * (size_t)T);
      if (per > fair) per = fair;
      if (per < 1) per = 1;
      return (int)per;
    };
    j.per[0] = 1;
    j.n[0] = rows;
    j.per[1] = chunk(c, (size_t)4 * H);
    j.n[1] = (c + j.per[1] - 1) / j.per[1];
    j.per[2] = chunk(H, (size_t)2 * c);
    j.n[2] = (H + j.per[2] - 1) / j.per[2];
  }

  void chunkWork(int phase, int i) {
    const Job& j = job_;
    const HostMlpArgs& a = *j.a;
    const int rows = a.rows, H = a.hidden, c = a.inter;
    if (phase == 0) {
      const float* x = a.x + (size_t)i * H;
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int k = 0;
      for (; k + 4 <= H; k += 4) {
        s0 += (double)x[k] * x[k];
        s1 += (double)x[k + 1] * x[k + 1];
        s2 += (double)x[k + 2] * x[k + 2];
        s3 += (double)x[k + 3] * x[k + 3];
      }
      for (; k < H; k++) s0 += (double)x[k] * x[k];
      float inv = (float)(1.0 / std::sqrt((s0 + s1 + s2 + s3) / H + (double)a.eps));
      float* xn = j.xn + (size_t)i * j.ldx;
      for (k = 0; k < H; k++) xn[k] = x[k] * inv * a.normW[k];
      return;
    }
    const Kernels* kt = j.tab;
    float out[4 * 8];
    const uint16_t* w[4];
    if (phase == 1) {
      // Weight rows in groups of N: N/2 channels' gate rows then their up rows (N = 1: a
      // channel's gate row, then its up row).
      const int j0 = i * j.per[1], j1 = j0 + j.per[1] < c ? j0 + j.per[1] : c;
      for (int r0 = 0; r0 < rows; r0 += 8) {
        const int R = rows - r0 < 8 ? rows - r0 : 8;
        const float* X = j.xn + (size_t)r0 * j.ldx;
        float* act = j.act + (size_t)r0 * j.lda;
        const int N = kt->n[R];
        for (int ch = j0; ch < j1;) {
          const int G = N == 1 ? 1 : (j1 - ch >= N / 2 ? N / 2 : 1);
          for (int q = 0; q < G; q++) {
            w[q] = a.gateUp + (size_t)(ch + q) * H;
            w[G + q] = a.gateUp + ((size_t)c + ch + q) * H;
          }
          if (N == 1) {
            kernel(kt, 1, R)(w, H, X, j.ldx, out);
            kernel(kt, 1, R)(w + 1, H, X, j.ldx, out + R);
          } else {
            kernel(kt, 2 * G, R)(w, H, X, j.ldx, out);
          }
          for (int q = 0; q < G; q++)
            for (int r = 0; r < R; r++) {
              const float g = out[q * R + r], u = out[(G + q) * R + r];
              act[(size_t)r * j.lda + ch + q] = g / (1.0f + std::exp(-g)) * u;
            }
          ch += G;
        }
      }
      return;
    }
    // Phase 2: down rows h in groups of N.
    const int h0 = i * j.per[2], h1 = h0 + j.per[2] < H ? h0 + j.per[2] : H;
    for (int r0 = 0; r0 < rows; r0 += 8) {
      const int R = rows - r0 < 8 ? rows - r0 : 8;
      const float* X = j.act + (size_t)r0 * j.lda;
      float* y = a.y + (size_t)r0 * H;
      const int N = kt->n[R];
      for (int h = h0; h < h1;) {
        const int G = h1 - h >= N ? N : h1 - h >= 2 && N >= 2 ? 2 : 1;
        for (int q = 0; q < G; q++) w[q] = a.down + (size_t)(h + q) * c;
        kernel(kt, G, R)(w, c, X, j.lda, out);
        for (int q = 0; q < G; q++)
          for (int r = 0; r < R; r++) y[(size_t)r * H + h + q] = out[q * R + r];
        h += G;
      }
    }
  }

  Job job_;
  Scratch xn_, act_;
  std::atomic<int> isa_{HOST_ISA_SCALAR};  // written under the hold, read by stats() without it
  std::atomic<uint64_t> calls_{0}, ns_{0};
};

// Created on first use, never destroyed (like the pool).
Mlp& mlp() {
  static Mlp* m = new Mlp();
  return *m;
}

}  // namespace

const char* nerva_host_mlp_validate(const HostMlpArgs& a) {
  if (a.rows < 1) return "rows must be >= 1";
  if (a.hidden < 1) return "hidden must be >= 1";
  if (a.inter < 0) return "inter must be >= 0";
  if (!(a.eps >= 0.f) || !std::isfinite(a.eps)) return "eps must be finite and >= 0";
  if (!a.y) return "y is null";
  if (a.inter > 0 && (!a.x || !a.normW || !a.gateUp || !a.down)) return "x, normW, gateUp and down must be non-null when inter > 0";
  return nullptr;
}

void nerva_host_mlp(const HostMlpArgs& a) {
  if (nerva_host_mlp_validate(a)) return;
  mlp().run(a);
}

void nerva_host_mlp_reserve(int rows, int hidden, int inter) { mlp().reserve(rows, hidden, inter); }

HostMlpStats nerva_host_mlp_stats() { return mlp().stats(); }

int nerva_host_mlp_set_isa(int isa) { return mlp().setIsa(isa); }

void nerva_host_mlp_configure(int threads, int pin) { nerva_host_pool_configure(threads, pin); }

#ifndef NERVA_HOST_MLP_NO_CUDA
namespace {
void CUDART_CB hostMlpHostFn(void* p) {
  const HostMlpArgs& a = *static_cast<const HostMlpArgs*>(p);
  try {
    nerva_host_mlp(a);
  } catch (...) {
    // Only a failed scratch allocation can throw (nerva_host_mlp_reserve avoids it): poison y so
    // the failure shows instead of stale values.
    if (a.y && a.rows > 0 && a.hidden > 0)
      for (size_t i = 0; i < (size_t)a.rows * a.hidden; i++) a.y[i] = std::nanf("");
  }
}
}  // namespace

int nerva_host_mlp_enqueue(CUstream_st* s, const HostMlpArgs* a) {
  if (!a || nerva_host_mlp_validate(*a)) return (int)cudaErrorInvalidValue;
  return (int)cudaLaunchHostFunc(s, hostMlpHostFn, const_cast<HostMlpArgs*>(a));
}

bool nerva_host_mlp_resolve(HostMlpArgs* a, const double v[9], const HostMlpArena& arena, char* why, size_t whyLen) {
  static const char* const names[9] = {"rows", "hidden", "inter", "eps", "x", "normW", "gateUp", "down", "y"};
  for (int i = 0; i < 3; i++)
    if (!(v[i] >= (i == 2 ? 0 : 1) && v[i] <= 2147483647.0 && v[i] == std::floor(v[i]))) {
      std::snprintf(why, whyLen, "%s must be an integer >= %d", names[i], i == 2 ? 0 : 1);
      return false;
    }
  a->rows = (int)v[0];
  a->hidden = (int)v[1];
  a->inter = (int)v[2];
  a->eps = (float)v[3];
  const size_t rh = (size_t)a->rows * a->hidden, ch = (size_t)a->inter * a->hidden;
  const size_t bytes[5] = {rh * 4, (size_t)a->hidden * 4, 2 * ch * 2, ch * 2, rh * 4};
  void* ptr[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  for (int i = 0; i < 5; i++) {
    const char* name = names[4 + i];
    double d = v[4 + i];
    if (d == 0) continue;
    if (!(d > 0 && d < 9007199254740992.0 && d == std::floor(d))) {
      std::snprintf(why, whyLen, "%s is not an address", name);
      return false;
    }
    char* p = (char*)(uintptr_t)d;
    bool inArena = false;
    for (char* base : {arena.dev, arena.host}) {
      if (!base || p < base || p >= base + arena.bytes) continue;
      if (bytes[i] > (size_t)(base + arena.bytes - p)) {
        std::snprintf(why, whyLen, "%s runs past the pinned arena", name);
        return false;
      }
      p = arena.host + (p - base);
      inArena = true;
      break;
    }
    if (!inArena) {
      cudaPointerAttributes at{};
      if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        cudaGetLastError();
      } else if (at.type == cudaMemoryTypeDevice) {
        std::snprintf(why, whyLen, "%s is device memory; the host MLP reads and writes host memory", name);
        return false;
      }
    }
    ptr[i] = p;
  }
  a->x = (const float*)ptr[0];
  a->normW = (const float*)ptr[1];
  a->gateUp = (const uint16_t*)ptr[2];
  a->down = (const uint16_t*)ptr[3];
  a->y = (float*)ptr[4];
  if (const char* bad = nerva_host_mlp_validate(*a)) {
    std::snprintf(why, whyLen, "%s", bad);
    return false;
  }
  return true;
}
#endif
