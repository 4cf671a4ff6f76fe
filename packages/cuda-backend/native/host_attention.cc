// Host attention over pinned-host KV pages (see host_attention.h).
#include "host_attention.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#ifdef __linux__
#include <pthread.h>
#include <sched.h>
#endif

#ifndef NERVA_HOST_ATTN_NO_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

// Vectorizable inner loops: one source, compiled for AVX-512, AVX2 (+FMA) and baseline x86-64,
// chosen by the loader (ifunc). Elsewhere, plain code.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NERVA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), optimize("O3")))
#else
#define NERVA_CLONES
#endif

constexpr int kMaxHd = 256;
constexpr int kLanes = 16;   // partial sums per dot product (one AVX-512 register of floats)
constexpr int kHeadsAt = 8;  // query heads of a group handled per pass over the keys
constexpr int kSplitKeys = 256;  // positions per split (fewer cost more in merging than they spread)

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

int envInt(const char* name, int dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return end && *end == 0 ? (int)x : dflt;
}

int defaultThreads() {
  int n = envInt("NERVA_HOST_THREADS", 0);
  if (n > 0) return n > 256 ? 256 : n;
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
  if (n <= 0) n = (int)std::thread::hardware_concurrency();
  if (n <= 0) n = 1;
  return n > 256 ? 256 : n;
}

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

// One KV row (headDim values) as floats; dst has room for a whole number of kLanes.
NERVA_CLONES void loadRow(const void* base, size_t at, int dtype, int hd, float* dst) {
  if (dtype == HOST_ATTN_F32) {
    std::memcpy(dst, (const float*)base + at, sizeof(float) * hd);
  } else if (dtype == HOST_ATTN_BF16) {
    const uint16_t* s = (const uint16_t*)base + at;
    for (int i = 0; i < hd; i++) {
      uint32_t u = (uint32_t)s[i] << 16;
      std::memcpy(dst + i, &u, 4);
    }
  } else {
    const uint16_t* s = (const uint16_t*)base + at;
    for (int i = 0; i < hd; i++) dst[i] = halfToFloat(s[i]);
  }
}

// The partials (m, l, acc[hdp]) of J query heads (qs: J rows of hdp floats, pre-scaled) over
// the positions [p0, p1] of one KV head; keys and values are read once for the J heads.
// Returns false when a block id is outside the cache.
NERVA_CLONES bool attendSpan(const HostAttnArgs& a, const int* table, int kvh, int p0, int p1, const float* qs, int J,
                             int hdp, float* m, float* l, float* acc, float* kf, float* vf) {
  const int bs = a.blockSize, hd = a.headDim;
  const size_t width = (size_t)a.numKvHeads * hd;
  for (int b = p0 / bs; b <= p1 / bs; b++) {
    const int e = table[b];
    if (e < 0) continue;  // not in this cache
    if (e >= a.numBlocks) return false;
    const int lo = std::max(p0, b * bs), hi = std::min(p1, b * bs + bs - 1);
    for (int p = lo; p <= hi; p++) {
      const size_t at = ((size_t)e * bs + (size_t)(p - b * bs)) * width + (size_t)kvh * hd;
      loadRow(a.k, at, a.kvDtype, hd, kf);
      loadRow(a.v, at, a.kvDtype, hd, vf);
      for (int j = 0; j < J; j++) {
        const float* qj = qs + (size_t)j * hdp;
        float part[kLanes] = {};
        for (int i = 0; i < hdp; i += kLanes)
          for (int t = 0; t < kLanes; t++) part[t] += qj[i + t] * kf[i + t];
        float s = 0.f;
        for (int t = 0; t < kLanes; t++) s += part[t];
        float* aj = acc + (size_t)j * hdp;
        if (s > m[j]) {
          const float c = m[j] == -INFINITY ? 0.f : std::exp(m[j] - s);
          l[j] = l[j] * c + 1.f;
          for (int i = 0; i < hdp; i++) aj[i] = aj[i] * c + vf[i];
          m[j] = s;
        } else {
          const float w = std::exp(s - m[j]);
          l[j] += w;
          for (int i = 0; i < hdp; i++) aj[i] += w * vf[i];
        }
      }
    }
  }
  return true;
}

// Grow-only 64-byte-aligned scratch.
template <class T>
struct Scratch {
  T* p = nullptr;
  size_t cap = 0;
  void reserve(size_t n) {
    if (n <= cap) return;
    size_t bytes = ((n * sizeof(T)) + 63) & ~(size_t)63;
    void* q = std::aligned_alloc(64, bytes);
    if (!q) throw std::bad_alloc();
    std::free(p);
    p = (T*)q;
    cap = bytes / sizeof(T);
  }
};

struct alignas(64) Counter {
  std::atomic<int> v{0};
};

class Pool {
 public:
  Pool() { start(defaultThreads()); }

  void configure(int threads) {
    std::lock_guard<std::mutex> call(callMu_);
    stopWorkers();
    start(threads > 0 ? std::min(threads, 256) : defaultThreads());
  }

  int threads() const { return nthreads_.load(std::memory_order_relaxed); }

  void reserve(int rows, int H, int KVH, int hd) {
    std::lock_guard<std::mutex> call(callMu_);
    reserveLocked(rows, H, KVH, hd);
  }

  void run(const HostAttnArgs& a) {
    std::lock_guard<std::mutex> call(callMu_);
    Clock::time_point t0 = Clock::now();
    plan(a);
    if (workers_.empty()) {
      work();
    } else {
      for (int p = 0; p < 2; p++) {
        next_[p].v.store(0, std::memory_order_relaxed);
        done_[p].v.store(0, std::memory_order_relaxed);
      }
      finished_.v.store(0, std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> lk(mu_);
        gen_.fetch_add(1, std::memory_order_release);
      }
      cv_.notify_all();
      work();
      const int nw = (int)workers_.size();
      waitUntil([&] { return finished_.v.load(std::memory_order_acquire) == nw; });
    }
    if (a.counters) {
      a.counters->calls++;
      a.counters->ns += (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      a.counters->keys += keys_;
      for (int r = 0; r < a.rows; r++) a.counters->badBlocks += bad_.p[r].load(std::memory_order_relaxed) ? 1 : 0;
    }
  }

 private:
  // Most splits per (row, KV head): up to 2048 tasks a call, at most 64 per (row, KV head). A
  // split covers at least kSplitKeys positions. Neither depends on the thread count, so neither
  // does the result (each partial is summed by one thread in position order).
  static int splitsFor(int rows, int KVH) {
    const long long s = 2048LL / ((long long)rows * KVH);
    return (int)std::max(1LL, std::min(64LL, s));
  }

  static size_t padHd(int hd) { return ((size_t)hd + kLanes - 1) / kLanes * kLanes; }

  void reserveLocked(int rows, int H, int KVH, int hd) {
    if (rows <= 0 || H <= 0 || KVH <= 0 || hd <= 0) return;
    const size_t S = (size_t)splitsFor(rows, KVH);
    part_.reserve((size_t)rows * H * S * (padHd(hd) + 2));
    nsplit_.reserve((size_t)rows);
    lo_.reserve((size_t)rows);
    bad_.reserve((size_t)rows);
    // Per-thread scratch for q heads, accumulators and one key and value row.
    const size_t per = (size_t)(2 * kHeadsAt + 2) * kMaxHd + 2 * kHeadsAt;
    threadScratch_.reserve(per * (size_t)std::max(1, nthreads_.load()));
  }

  void plan(const HostAttnArgs& a) {
    const int rows = a.rows, KVH = a.numKvHeads, bs = a.blockSize;
    reserveLocked(rows, a.numHeads, KVH, a.headDim);
    a_ = &a;
    S_ = splitsFor(rows, KVH);
    hdp_ = (int)padHd(a.headDim);
    keys_ = 0;
    for (int r = 0; r < rows; r++) {
      const int seq = a.rowSeq[r], pos = a.positions[r];
      const bool ok = seq >= 0 && seq < a.numSeqs && pos >= 0 && (long long)pos < (long long)a.maxBlocksPerSeq * bs;
      new (&bad_.p[r]) std::atomic<int>(ok ? 0 : 1);
      const int lo = a.window > 0 ? std::max(0, pos - a.window + 1) : 0;
      lo_.p[r] = lo;
      const int len = ok ? pos - lo + 1 : 0;
      nsplit_.p[r] = len <= 0 ? 0 : std::min(S_, (len + kSplitKeys - 1) / kSplitKeys);
      keys_ += (uint64_t)len * KVH;
    }
    n_[0] = rows * KVH * S_;
    n_[1] = rows * a.numHeads;
  }

  float* partAt(int r, int h, int s) const {
    return part_.p + (((size_t)r * a_->numHeads + h) * S_ + s) * (size_t)(hdp_ + 2);
  }

  void task(int i, float* scratch) {
    const HostAttnArgs& a = *a_;
    const int KVH = a.numKvHeads, G = a.numHeads / KVH, hd = a.headDim, hdp = hdp_;
    const int s = i % S_, g = (i / S_) % KVH, r = i / (S_ * KVH);
    const int ns = nsplit_.p[r];
    if (s >= ns || bad_.p[r].load(std::memory_order_relaxed)) return;
    const int lo = lo_.p[r], len = a.positions[r] - lo + 1;
    const int chunk = (len + ns - 1) / ns;
    const int p0 = lo + s * chunk, p1 = std::min(a.positions[r], p0 + chunk - 1);
    float* qs = scratch;
    float* acc = qs + (size_t)kHeadsAt * kMaxHd;
    float* kf = acc + (size_t)kHeadsAt * kMaxHd;
    float* vf = kf + kMaxHd;
    float* m = vf + kMaxHd;
    float* l = m + kHeadsAt;
    std::memset(kf, 0, sizeof(float) * hdp);  // the padding past headDim stays zero
    std::memset(vf, 0, sizeof(float) * hdp);
    const int* table = a.tables + (size_t)a.rowSeq[r] * a.maxBlocksPerSeq;
    for (int j0 = 0; j0 < G; j0 += kHeadsAt) {
      const int J = std::min(kHeadsAt, G - j0);
      for (int j = 0; j < J; j++) {
        const float* qr = a.q + (size_t)r * a.numHeads * hd + (size_t)(g * G + j0 + j) * hd;
        float* d = qs + (size_t)j * hdp;
        for (int t = 0; t < hd; t++) d[t] = qr[t] * a.scale;
        for (int t = hd; t < hdp; t++) d[t] = 0.f;
        std::memset(acc + (size_t)j * hdp, 0, sizeof(float) * hdp);
        m[j] = -INFINITY;
        l[j] = 0.f;
      }
      if (!attendSpan(a, table, g, p0, p1, qs, J, hdp, m, l, acc, kf, vf)) {
        bad_.p[r].store(1, std::memory_order_relaxed);
        return;
      }
      for (int j = 0; j < J; j++) {
        float* d = partAt(r, g * G + j0 + j, s);
        d[0] = m[j];
        d[1] = l[j];
        std::memcpy(d + 2, acc + (size_t)j * hdp, sizeof(float) * hd);
      }
    }
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

  void work(int self = 0) {
    float* scratch = threadScratch_.p + (size_t)self * ((size_t)(2 * kHeadsAt + 2) * kMaxHd + 2 * kHeadsAt);
    const bool single = workers_.empty();
    for (int p = 0; p < 2; p++) {
      const int n = n_[p];
      if (single) {
        for (int i = 0; i < n; i++) p == 0 ? task(i, scratch) : merge(i);
        continue;
      }
      for (;;) {
        const int i = next_[p].v.fetch_add(1, std::memory_order_relaxed);
        if (i >= n) break;
        p == 0 ? task(i, scratch) : merge(i);
        done_[p].v.fetch_add(1, std::memory_order_release);
      }
      // Counts finished tasks, not threads: a worker that wakes late joins the running phase.
      if (p == 0) waitUntil([&] { return done_[0].v.load(std::memory_order_acquire) >= n; });
    }
  }

  template <class F>
  static void waitUntil(F ready) {
    for (unsigned spins = 0; !ready(); spins++) {
      if (spins < 4096) cpuRelax();
      else std::this_thread::yield();
    }
  }

  void start(int threads) {
    nthreads_ = threads;
    spinNs_ = (int64_t)envInt("NERVA_HOST_SPIN_US", 100) * 1000;
    stop_.store(false);
    const uint64_t gen = gen_.load();
    for (int i = 1; i < threads; i++) workers_.emplace_back([this, i, gen] { workerMain(i, gen); });
  }

  void stopWorkers() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_.store(true);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  void workerMain(int self, uint64_t seen) {
    for (;;) {
      Clock::time_point t0 = Clock::now();
      for (unsigned spins = 0; gen_.load(std::memory_order_acquire) == seen && !stop_.load(std::memory_order_relaxed); spins++) {
        cpuRelax();
        if ((spins & 255) == 255 && std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count() > spinNs_) {
          std::unique_lock<std::mutex> lk(mu_);
          cv_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen || stop_.load(); });
          break;
        }
      }
      if (stop_.load()) return;
      seen = gen_.load(std::memory_order_acquire);
      work(self);
      finished_.v.fetch_add(1, std::memory_order_release);
    }
  }

  std::mutex callMu_, mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<bool> stop_{false};
  Counter next_[2], done_[2], finished_;
  std::vector<std::thread> workers_;
  std::atomic<int> nthreads_{1};
  int64_t spinNs_ = 100000;
  const HostAttnArgs* a_ = nullptr;
  int S_ = 1, hdp_ = 0, n_[2] = {0, 0};
  uint64_t keys_ = 0;
  Scratch<float> part_, threadScratch_;
  Scratch<int> nsplit_, lo_;
  Scratch<std::atomic<int>> bad_;
};

std::atomic<Pool*> gPool{nullptr};
std::mutex gPoolMu;

Pool& pool() {
  Pool* p = gPool.load(std::memory_order_acquire);
  if (p) return *p;
  std::lock_guard<std::mutex> lk(gPoolMu);
  p = gPool.load(std::memory_order_relaxed);
  if (!p) {
    p = new Pool();
    gPool.store(p, std::memory_order_release);
  }
  return *p;
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
  pool().reserve(rows, numHeads, numKvHeads, headDim);
}

void nerva_host_attention(const HostAttnArgs& a) {
  if (a.rows <= 0) return;
  pool().run(a);
}

void nerva_host_attention_configure(int threads) { pool().configure(threads); }
int nerva_host_attention_threads() { return pool().threads(); }

#ifndef NERVA_HOST_ATTN_NO_CUDA
namespace {
void CUDART_CB hostAttnHostFn(void* p) {
  const HostAttnArgs& a = *static_cast<const HostAttnArgs*>(p);
  try {
    nerva_host_attention(a);
  } catch (...) {
    // Only a scratch allocation can throw (reserve avoids it): poison the output so it shows.
    for (size_t i = 0; i < (size_t)a.rows * a.numHeads * a.headDim; i++) a.out[i] = std::nanf("");
  }
}
}  // namespace

int nerva_host_attention_enqueue(CUstream_st* s, const HostAttnArgs* a, const HostAttnStage* st) {
  if (!a || !st || nerva_host_attention_validate(*a)) return (int)cudaErrorInvalidValue;
  if (a->rows <= 0) return 0;
  const size_t qw = (size_t)a->numHeads * a->headDim * sizeof(float);
  cudaError_t e = cudaMemcpy2DAsync(const_cast<float*>(a->q), qw, st->qSrc + st->qOffset, (size_t)st->qStride * sizeof(float), qw,
                                    (size_t)a->rows, cudaMemcpyDefault, s);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(const_cast<int*>(a->tables), st->tablesSrc, (size_t)a->numSeqs * a->maxBlocksPerSeq * sizeof(int),
                        cudaMemcpyDefault, s);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(const_cast<int*>(a->rowSeq), st->rowSeqSrc, (size_t)a->rows * sizeof(int), cudaMemcpyDefault, s);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(const_cast<int*>(a->positions), st->positionsSrc, (size_t)a->rows * sizeof(int), cudaMemcpyDefault, s);
  if (e == cudaSuccess) e = cudaLaunchHostFunc(s, hostAttnHostFn, const_cast<HostAttnArgs*>(a));
  return (int)e;
}
#endif
