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

#ifndef NERVA_HOST_ATTN_NO_CUDA
#include <cuda_runtime.h>

#include "host_channel.h"
#endif

namespace {

using Clock = std::chrono::steady_clock;

// Vectorizable inner loops: one source, compiled for AVX-512, AVX2 (+FMA) and baseline x86-64,
// chosen by the loader (ifunc). Elsewhere, plain code.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NERVA_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), optimize("O3", "fp-contract=fast")))
#else
#define NERVA_CLONES
#endif

constexpr int kMaxHd = 256;
constexpr int kLanes = 16;   // partial sums per dot product (one AVX-512 register of floats)
constexpr int kKeysAt = 16;  // keys scored before one online-softmax update
constexpr int kSplitKeys = 64;  // fewest positions per split (fewer cost more in merging than they spread)

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

// One KV row (headDim values) as floats: f32 rows are used in place, others converted into dst
// (which has room for a whole number of kLanes; its padding stays zero).
inline const float* rowOf(const void* base, size_t at, int dtype, int hd, float* dst) {
  if (dtype == HOST_ATTN_F32) return (const float*)base + at;
  const uint16_t* s = (const uint16_t*)base + at;
  if (dtype == HOST_ATTN_BF16) {
    for (int i = 0; i < hd; i++) {
      uint32_t u = (uint32_t)s[i] << 16;
      std::memcpy(dst + i, &u, 4);
    }
  } else {
    for (int i = 0; i < hd; i++) dst[i] = halfToFloat(s[i]);
  }
  return dst;
}

// q . k over hd (q padded with zeros to a whole number of kLanes, k read only to hd): kLanes
// partial sums, then a fixed pairwise tree, so the order is the same on every path.
inline float dotRow(const float* q, const float* k, int hd) {
  float part[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= hd; i += kLanes)
    for (int t = 0; t < kLanes; t++) part[t] += q[i + t] * k[i + t];
  for (int t = 0; i + t < hd; t++) part[t] += q[i + t] * k[i + t];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int t = 0; t < w; t++) part[t] += part[t + w];
  return part[0];
}

// The partials (m, l, acc[hdp]) of every query head (qs: numHeads rows of hdp floats,
// pre-scaled) over the positions [p0, p1]. A position's keys (and values) of all KV heads are one
// contiguous row, so a split streams through contiguous memory (per-KV-head tasks read 512-byte
// pieces 4 KiB apart and were latency-bound). Keys are taken kKeysAt at a time: their scores
// first, then one online-softmax update per head (one accumulator rescale per batch, not per
// key). Returns false when a block id is outside the cache.
NERVA_CLONES bool attendSpan(const HostAttnArgs& a, const int* table, int p0, int p1, const float* qs, int hdp, float* m,
                             float* l, float* acc, float* kf, float* vf, float* sc) {
  const int bs = a.blockSize, hd = a.headDim, KVH = a.numKvHeads, H = a.numHeads, G = H / KVH;
  const size_t width = (size_t)KVH * hd;
  for (int b = p0 / bs; b <= p1 / bs; b++) {
    const int e = table[b];
    if (e < 0) continue;  // not in this cache
    if (e >= a.numBlocks) return false;
    const int lo = std::max(p0, b * bs), hi = std::min(p1, b * bs + bs - 1);
    for (int c0 = lo; c0 <= hi; c0 += kKeysAt) {
      const int n = std::min(kKeysAt, hi - c0 + 1);
      const size_t at0 = ((size_t)e * bs + (size_t)(c0 - b * bs)) * width;
      for (int x = 0; x < n; x++) {
        const float* kr = rowOf(a.k, at0 + (size_t)x * width, a.kvDtype, (int)width, kf);
        for (int g = 0; g < KVH; g++)
          for (int j = 0; j < G; j++) {
            const int h = g * G + j;
            sc[(size_t)h * kKeysAt + x] = dotRow(qs + (size_t)h * hdp, kr + (size_t)g * hd, hd);
          }
      }
      for (int h = 0; h < H; h++) {
        float* sh = sc + (size_t)h * kKeysAt;
        float mx = m[h];
        for (int x = 0; x < n; x++) mx = std::max(mx, sh[x]);
        const float c = m[h] == -INFINITY ? 0.f : std::exp(m[h] - mx);
        float sum = 0.f;
        for (int x = 0; x < n; x++) {
          sh[x] = std::exp(sh[x] - mx);
          sum += sh[x];
        }
        l[h] = l[h] * c + sum;
        m[h] = mx;
        if (c != 1.f) {
          float* ah = acc + (size_t)h * hdp;
          for (int i = 0; i < hd; i++) ah[i] *= c;
        }
      }
      for (int x = 0; x < n; x++) {
        const float* vr = rowOf(a.v, at0 + (size_t)x * width, a.kvDtype, (int)width, vf);
        for (int g = 0; g < KVH; g++)
          for (int j = 0; j < G; j++) {
            const int h = g * G + j;
            const float w = sc[(size_t)h * kKeysAt + x];
            const float* vg = vr + (size_t)g * hd;
            float* ah = acc + (size_t)h * hdp;
            for (int i = 0; i < hd; i++) ah[i] += w * vg[i];
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

  // Floats of one thread's scratch: q and accumulators of every head, a converted key and value
  // row, m, l, and the scores of a batch; a multiple of 16 (64 bytes) so threads share no lines.
  static size_t threadFloats(int H, int KVH, int hd) {
    const size_t n = 2 * (size_t)H * padHd(hd) + 2 * ((size_t)KVH * hd + kLanes) + 2 * (size_t)H + (size_t)H * kKeysAt;
    return (n + 15) / 16 * 16;
  }

  // Per-thread scratch for `threads` threads: sized under the hold that runs the call.
  void reserveLocked(int rows, int H, int KVH, int hd, int threads) {
    if (rows <= 0 || H <= 0 || KVH <= 0 || hd <= 0) return;
    part_.reserve((size_t)rows * H * (size_t)splitsFor(rows) * (padHd(hd) + 2));
    nsplit_.reserve((size_t)rows);
    lo_.reserve((size_t)rows);
    bad_.reserve((size_t)rows);
    threadScratch_.reserve(threadFloats(H, KVH, hd) * (size_t)std::max(1, threads));
  }

  void plan(const HostAttnArgs& a, int threads) {
    const int rows = a.rows, KVH = a.numKvHeads, bs = a.blockSize;
    reserveLocked(rows, a.numHeads, KVH, a.headDim, threads);
    a_ = &a;
    S_ = splitsFor(rows);
    stride_ = threadFloats(a.numHeads, KVH, a.headDim);
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
    n_[0] = rows * S_;
    n_[1] = rows * a.numHeads;
  }

  float* partAt(int r, int h, int s) const {
    return part_.p + (((size_t)r * a_->numHeads + h) * S_ + s) * (size_t)(hdp_ + 2);
  }

  void task(int i, float* scratch) {
    const HostAttnArgs& a = *a_;
    const int H = a.numHeads, KVH = a.numKvHeads, hd = a.headDim, hdp = hdp_;
    const int s = i % S_, r = i / S_;
    const int ns = nsplit_.p[r];
    if (s >= ns || bad_.p[r].load(std::memory_order_relaxed)) return;
    const int lo = lo_.p[r], len = a.positions[r] - lo + 1;
    const int chunk = (len + ns - 1) / ns;
    const int p0 = lo + s * chunk, p1 = std::min(a.positions[r], p0 + chunk - 1);
    float* qs = scratch;
    float* acc = qs + (size_t)H * hdp;
    float* kf = acc + (size_t)H * hdp;
    float* vf = kf + (size_t)KVH * hd + kLanes;
    float* m = vf + (size_t)KVH * hd + kLanes;
    float* l = m + H;
    float* sc = l + H;  // H x kKeysAt scores
    for (int h = 0; h < H; h++) {
      const float* qr = a.q + (size_t)r * H * hd + (size_t)h * hd;
      float* d = qs + (size_t)h * hdp;
      for (int t = 0; t < hd; t++) d[t] = qr[t] * a.scale;
      for (int t = hd; t < hdp; t++) d[t] = 0.f;
      std::memset(acc + (size_t)h * hdp, 0, sizeof(float) * hdp);
      m[h] = -INFINITY;
      l[h] = 0.f;
    }
    const int* table = a.tables + (size_t)a.rowSeq[r] * a.maxBlocksPerSeq;
    if (!attendSpan(a, table, p0, p1, qs, hdp, m, l, acc, kf, vf, sc)) {
      bad_.p[r].store(1, std::memory_order_relaxed);
      return;
    }
    for (int h = 0; h < H; h++) {
      float* d = partAt(r, h, s);
      d[0] = m[h];
      d[1] = l[h];
      std::memcpy(d + 2, acc + (size_t)h * hdp, sizeof(float) * hd);
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

  const HostAttnArgs* a_ = nullptr;
  int S_ = 1, hdp_ = 0, n_[2] = {0, 0};
  size_t stride_ = 0;
  uint64_t keys_ = 0;
  Scratch<float> part_, threadScratch_;
  Scratch<int> nsplit_, lo_;
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

void nerva_host_attention_channel_fn(void* p) { hostAttnHostFn(p); }

int nerva_host_attention_enqueue(CUstream_st* s, const HostAttnArgs* a, const HostAttnStage* st) {
  if (!a || !st || nerva_host_attention_validate(*a) || !st->outDst || (a->lse && !st->lseDst)) return (int)cudaErrorInvalidValue;
  if (a->rows <= 0) return 0;
  const size_t qw = (size_t)a->numHeads * a->headDim;
  const size_t nTables = (size_t)a->numSeqs * a->maxBlocksPerSeq;
  if (st->channel) {
    if (!st->qDev || !st->intsDev || !st->outHostDev || (a->lse && !st->lseHostDev)) return (int)cudaErrorInvalidValue;
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
  cudaError_t e = cudaMemcpy2DAsync(const_cast<float*>(a->q), qw * sizeof(float), st->qSrc + st->qOffset, (size_t)st->qStride * sizeof(float),
                                    qw * sizeof(float), (size_t)a->rows, cudaMemcpyDefault, s);
  if (e == cudaSuccess) e = cudaMemcpyAsync(const_cast<int*>(a->tables), st->tablesSrc, nTables * sizeof(int), cudaMemcpyDefault, s);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(const_cast<int*>(a->rowSeq), st->rowSeqSrc, (size_t)a->rows * sizeof(int), cudaMemcpyDefault, s);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(const_cast<int*>(a->positions), st->positionsSrc, (size_t)a->rows * sizeof(int), cudaMemcpyDefault, s);
  if (e == cudaSuccess) e = cudaLaunchHostFunc(s, hostAttnHostFn, const_cast<HostAttnArgs*>(a));
  if (e == cudaSuccess) e = cudaMemcpyAsync(st->outDst, a->out, qw * a->rows * sizeof(float), cudaMemcpyDefault, s);
  if (e == cudaSuccess && a->lse)
    e = cudaMemcpyAsync(st->lseDst, a->lse, (size_t)a->rows * a->numHeads * sizeof(float), cudaMemcpyDefault, s);
  return (int)e;
}
#endif
