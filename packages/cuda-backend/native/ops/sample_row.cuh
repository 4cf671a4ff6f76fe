// A sampled row (temperature > 0): float64 softmax, top-k / top-p / min-p cuts by radix
// selection, the draw from the counter-based uniform, with @nerva/core/sampling.ts's rule. Run
// by one thread block (BlockSpan: k_sample) or by the blocks of a thread block cluster, each
// over a slice of the vocabulary (ClusterSpan: k_sample_cluster). Included by ops/sample.cu only.
#pragma once
#include <cooperative_groups.h>

#include "common/elem.cuh"

namespace nerva::ops {

__device__ __forceinline__ uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// uniformFromSeed of @nerva/core/sampling.ts, bit for bit.
__device__ __forceinline__ double uniformFromSeed(uint32_t seed, uint32_t counter) {
  uint32_t h = mix32(seed ^ mix32(counter + 0x9e3779b9u));
  return (double)(h >> 8) / 16777216.0;
}

// The sampler's candidate order is (prob descending, index ascending). With prob >= 0 the
// float64 bit pattern orders like the value, so the composite key (probBits, ~index) orders
// candidates exactly; selections walk it one byte at a time (a radix select with masses).
//
// Masses are fixed point, 2^63 to a probability of one (massFixed): integer sums are exact in any
// order, so a bucket's mass is the same however its atomic adds interleave (float64 atomics were
// not), and the cuts' thresholds compare against it exactly. A probability's rounding to 2^-64 is
// finer than a float64 sum of the row's probabilities could be (~1e-16 at a mass near one).
constexpr double MASS_ONE = 9223372036854775808.0;  // 2^63
__device__ __forceinline__ unsigned long long massFixed(double p) { return __double2ull_rn(p * MASS_ONE); }

struct SelResult {
  int index;                       // the element found (-1: none)
  int countBefore;                 // candidates before it in the order
  unsigned long long massBefore;   // their probability mass (massFixed)
  double p;                        // its own probability
};

// The key bytes every candidate shares (those of the row's smallest and largest probability: bit
// patterns of non-negative doubles order like the values, so every candidate between them has the
// same leading bytes): a selection starts at the first byte that differs instead of binning the
// whole row into one bucket for each shared byte (a probability's top byte, its sign and the
// exponent's top seven bits, nearly always is one).
struct KeyPrefix {
  unsigned long long mask, val;
  int digit;  // the first digit a selection bins
};
__device__ __forceinline__ KeyPrefix keyPrefix(double pmin, double pmax) {
  const unsigned long long a = (unsigned long long)__double_as_longlong(pmin), x = a ^ (unsigned long long)__double_as_longlong(pmax);
  const int same = x == 0 ? 8 : __clzll((long long)x) / 8;
  const unsigned long long mask = same == 0 ? 0ull : same == 8 ? ~0ull : ~0ull << (64 - 8 * same);
  return KeyPrefix{mask, a & mask, 11 - same};
}

constexpr int SAMPLE_MAX_CLUSTER = 16;

struct SampleShared {
  // A digit's histogram, two sets: a cluster's blocks read each other's set of digit d while
  // their own next digit fills the other one (one cluster barrier a digit).
  int cnt[2][256];
  unsigned long long mass[2][256];  // massFixed sums
  int any[2][256];
  // The histogram a digit's choice reads: the set itself (one block) or the cluster's merged sum.
  int mcnt[256];
  unsigned long long mmass[256];
  int many[256];
  uint64_t hiMask, hiVal;
  uint32_t loMask, loVal;
  int countBefore;
  unsigned long long massBefore;
  int done, found, chosenIdx;
  double red[32];
  int redi[32];
  float redf[32];
  unsigned long long redu[32];
  // A cluster reduction's per-block value, two slots (as the histograms).
  double xd[2];
  int xi[2];
  float xf[2];
  unsigned long long xu[2];
};

// A masked row's disallowed ids in the float64 scratch: below every probability, so the
// selections skip them (selectKey<true>) and a min-p floor (>= 0) never keeps them.
constexpr double MASKED_OUT = -1.0;

// Bit i of a row's token mask: id i is allowed.
__device__ __forceinline__ bool maskAllows(const uint32_t* M, int i) { return (M[i >> 5] >> (i & 31)) & 1u; }

struct MaxD {
  __device__ double operator()(double a, double b) const { return fmax(a, b); }
};
struct MinD {
  __device__ double operator()(double a, double b) const { return fmin(a, b); }
};

// A float64 max or min over the block (op from init); every thread gets the result.
template <typename Op>
__device__ __forceinline__ double blockFoldD(double v, double init, Op op, SampleShared& S) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) S.red[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = init;
  for (int w = 0; w < (int)(blockDim.x >> 5); w++) t = op(t, S.red[w]);
  __syncthreads();
  return t;
}
__device__ __forceinline__ double blockMaxD(double v, SampleShared& S) { return blockFoldD(v, 0.0, MaxD(), S); }
__device__ __forceinline__ double blockMinD(double v, SampleShared& S) { return blockFoldD(v, HUGE_VAL, MinD(), S); }

// One block over the whole row [0, end).
struct BlockSpan {
  int begin, end;
  __device__ double sum(double v, SampleShared& S) { return blockSum(v, S.red); }
  __device__ int sumi(int v, SampleShared& S) { return blockSum(v, S.redi); }
  __device__ float maxf(float v, SampleShared& S) { return blockMax(v, S.redf); }
  __device__ double maxd(double v, SampleShared& S) { return blockMaxD(v, S); }
  __device__ double mind(double v, SampleShared& S) { return blockMinD(v, S); }
  __device__ unsigned long long sumu(unsigned long long v, SampleShared& S) { return blockSum(v, S.redu); }
  // The digit's histogram is the block's own set.
  __device__ void merge(SampleShared& S, int set) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      S.mcnt[b] = S.cnt[set][b];
      S.mmass[b] = S.mass[set][b];
      S.many[b] = S.any[set][b];
    }
    __syncthreads();
  }
  __device__ void finish() {}
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// The C blocks of a cluster, block `rank` over its slice [begin, end) of the row. Every
// reduction combines the blocks' values in rank order, read by every block from the others'
// shared memory, so all blocks hold the same totals and take the same choices (one control flow).
// A value's slot alternates (`phase`): a block writes slot k only after every block passed the
// barrier that follows the last reads of slot k.
struct ClusterSpan {
  int begin, end, C;
  int phase;
  __device__ SampleShared* peer(SampleShared& S, int r) {
    return cooperative_groups::this_cluster().map_shared_rank(&S, (unsigned)r);
  }
  __device__ void sync() { cooperative_groups::this_cluster().sync(); }
  // The blocks' values of `slot` (each block's own, from its block reduction) folded in rank
  // order by `op` from `init`.
  template <typename T, typename Op>
  __device__ T across(T v, T (SampleShared::*slot)[2], SampleShared& S, T init, Op op) {
    const int k = phase++ & 1;
    if (threadIdx.x == 0) (S.*slot)[k] = v;
    sync();
    T t = init;
    for (int r = 0; r < C; r++) t = op(t, (peer(S, r)->*slot)[k]);
    return t;
  }
  struct Add {
    template <typename T>
    __device__ T operator()(T a, T b) const { return a + b; }
  };
  struct MaxF {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
  };
  __device__ double sum(double v, SampleShared& S) { return across(blockSum(v, S.red), &SampleShared::xd, S, 0.0, Add()); }
  __device__ int sumi(int v, SampleShared& S) { return across(blockSum(v, S.redi), &SampleShared::xi, S, 0, Add()); }
  __device__ float maxf(float v, SampleShared& S) { return across(blockMax(v, S.redf), &SampleShared::xf, S, -INFINITY, MaxF()); }
  __device__ double maxd(double v, SampleShared& S) { return across(blockMaxD(v, S), &SampleShared::xd, S, 0.0, MaxD()); }
  __device__ double mind(double v, SampleShared& S) { return across(blockMinD(v, S), &SampleShared::xd, S, HUGE_VAL, MinD()); }
  __device__ unsigned long long sumu(unsigned long long v, SampleShared& S) {
    return across(blockSum(v, S.redu), &SampleShared::xu, S, 0ull, Add());
  }
  // The digit's histogram: the blocks' sets summed in rank order; `any` from the lowest rank that
  // saw the bucket (it is read only where the bucket holds one candidate).
  __device__ void merge(SampleShared& S, int set) {
    sync();
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      int c = 0, a = -1;
      unsigned long long m = 0;
      for (int r = 0; r < C; r++) {
        const SampleShared* o = peer(S, r);
        const int rc = o->cnt[set][b];
        if (rc == 0) continue;
        c += rc;
        m += o->mass[set][b];
        if (a < 0) a = o->any[set][b];
      }
      S.mcnt[b] = c;
      S.mmass[b] = m;
      S.many[b] = a;
    }
    __syncthreads();
  }
  // No block leaves while another may still read its shared memory.
  __device__ void finish() { sync(); }
};
#endif

// The ids in [begin, end) a row's mask allows (bits past `end` in its last word ignored). A
// span's begin is a multiple of 32 (ClusterSpan's slices are whole words) unless it is empty,
// at the row's limit: that block counts nothing, not the limit's partial word a second time.
template <class Span>
__device__ int maskCount(const uint32_t* M, Span& g, SampleShared& S) {
  int c = 0;
  const int w0 = g.begin >> 5, w1 = g.begin < g.end ? (g.end + 31) >> 5 : w0;
  for (int w = w0 + threadIdx.x; w < w1; w += blockDim.x) {
    uint32_t b = M[w];
    const int left = g.end - w * 32;
    if (left < 32) b &= (1u << left) - 1u;
    c += __popc(b);
  }
  return g.sumi(c, S);
}

// Keys of a selection a thread loads before it bins the first.
constexpr int SEL_UNROLL = 4;

// m += v, exactly (mod 2^64), by two 32-bit shared-memory atomics: a 64-bit atomic add on shared
// memory is a compare-and-swap loop, which contended buckets spun in. The add that wraps the low
// word carries into the high one.
__device__ __forceinline__ void massAdd(unsigned long long* m, unsigned long long v) {
  uint32_t* w = reinterpret_cast<uint32_t*>(m);
  const uint32_t lo = (uint32_t)v;
  uint32_t hi = (uint32_t)(v >> 32);
  if (lo) {
    const uint32_t old = atomicAdd(w, lo);
    if (old + lo < old) hi++;
  }
  if (hi) atomicAdd(w + 1, hi);
}

// mode 0: the element at rank `rank`; mode 1: first element with massBefore + p >= thr;
// mode 2: first element with massBefore + p > thr (thr and masses massFixed). Masked: entries
// below zero (a masked row's disallowed ids, MASKED_OUT) are no candidates at all, not even after
// the allowed ids of probability zero, so ranks, counts and masses are over the allowed ids alone.
// Each digit bins the span's keys from `pre` on (a thread's keys in ascending index order), then
// the choice reads the merged histogram, one warp over it: each lane eight buckets, the counts
// and masses before them by a warp scan (integers: the order of the sums does not matter; one
// thread's scan of the 256 buckets held the block at a barrier ~18 % of the kernel's time).
template <bool Masked, class Span>
__device__ SelResult selectKey(const double* prob, Span& g, int& digitSet, int mode, int rank, unsigned long long thr,
                               const KeyPrefix& pre, SampleShared& S) {
  constexpr unsigned FULL = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    S.hiMask = pre.mask;
    S.hiVal = pre.val;
    S.loMask = 0;
    S.loVal = 0;
    S.countBefore = 0;
    S.massBefore = 0;
    S.done = 0;
    S.found = 1;
    S.chosenIdx = -1;
  }
  __syncthreads();
  for (int digit = pre.digit; digit >= 0; digit--) {
    const int set = digitSet++ & 1;
    int* cnt = S.cnt[set];
    unsigned long long* mass = S.mass[set];
    int* any = S.any[set];
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      cnt[b] = 0;
      mass[b] = 0;
      any[b] = -1;
    }
    __syncthreads();
    const uint64_t hm = S.hiMask, hv = S.hiVal;
    const uint32_t lm = S.loMask, lv = S.loVal;
    // Runs of equal buckets are accumulated in registers before one add to shared memory: early
    // digits put nearly every candidate in the same bucket.
    int runB = -1, runC = 0, runI = -1;
    unsigned long long runM = 0;
    for (int i0 = g.begin + threadIdx.x; i0 < g.end; i0 += SEL_UNROLL * blockDim.x) {
      double pv[SEL_UNROLL];
#pragma unroll
      for (int u = 0; u < SEL_UNROLL; u++) {
        const int i = i0 + u * blockDim.x;
        pv[u] = i < g.end ? prob[i] : -2.0;  // (-2: past the span, never a candidate)
      }
#pragma unroll
      for (int u = 0; u < SEL_UNROLL; u++) {
        const int i = i0 + u * blockDim.x;
        const double p = pv[u];
        if (i >= g.end || (Masked && p < 0)) continue;
        const uint64_t hi = (uint64_t)__double_as_longlong(p);
        const uint32_t lo = ~(uint32_t)i;
        if ((hi & hm) != hv || (lo & lm) != lv) continue;
        const int b = digit >= 4 ? (int)((hi >> ((digit - 4) * 8)) & 0xff) : (int)((lo >> (digit * 8)) & 0xff);
        if (b != runB) {
          if (runB >= 0) {
            atomicAdd(&cnt[runB], runC);
            massAdd(&mass[runB], runM);
            any[runB] = runI;
          }
          runB = b;
          runC = 0;
          runM = 0;
        }
        runC++;
        runM += massFixed(p);
        runI = i;
      }
    }
    if (runB >= 0) {
      atomicAdd(&cnt[runB], runC);
      massAdd(&mass[runB], runM);
      any[runB] = runI;
    }
    __syncthreads();
    g.merge(S, set);
    if (threadIdx.x < 32) {
      // Lane l: buckets top .. top - 7, in the order's direction (descending).
      const int top = 255 - 8 * lane;
      int cs = 0;
      unsigned long long ms = 0;
#pragma unroll
      for (int j = 0; j < 8; j++) {
        cs += S.mcnt[top - j];
        ms += S.mmass[top - j];
      }
      int ci = cs;
      unsigned long long mi = ms;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int cy = __shfl_up_sync(FULL, ci, o);
        const unsigned long long my = __shfl_up_sync(FULL, mi, o);
        if (lane >= o) {
          ci += cy;
          mi += my;
        }
      }
      int cb = S.countBefore + (ci - cs);
      unsigned long long mb = S.massBefore + (mi - ms);
      int hitJ = -1;
      for (int j = 0; j < 8 && hitJ < 0; j++) {
        const int c = S.mcnt[top - j];
        if (c == 0) continue;
        const unsigned long long m = S.mmass[top - j];
        const bool hit = mode == 0 ? cb + c > rank : mode == 1 ? mb + m >= thr : mb + m > thr;
        if (hit) {
          hitJ = j;
        } else {
          cb += c;
          mb += m;
        }
      }
      const unsigned hits = __ballot_sync(FULL, hitJ >= 0);
      if (hits == 0) {
        if (lane == 31) {  // every bucket before "none": the totals
          S.countBefore = cb;
          S.massBefore = mb;
          S.found = 0;
          S.done = 1;
        }
      } else if (lane == __ffs(hits) - 1) {
        const int chosen = top - hitJ;
        S.countBefore = cb;
        S.massBefore = mb;
        if (digit >= 4) {
          const int sh = (digit - 4) * 8;
          S.hiMask |= (uint64_t)0xff << sh;
          S.hiVal |= (uint64_t)chosen << sh;
        } else {
          const int sh = digit * 8;
          S.loMask |= 0xffu << sh;
          S.loVal |= (uint32_t)chosen << sh;
        }
        if (S.mcnt[chosen] == 1 || digit == 0) {
          S.chosenIdx = S.many[chosen];
          S.done = 1;
        }
      }
    }
    __syncthreads();
    if (S.done) break;
  }
  SelResult res;
  res.index = S.found ? S.chosenIdx : -1;
  res.countBefore = S.countBefore;
  res.massBefore = S.massBefore;
  res.p = res.index >= 0 ? prob[res.index] : 0.0;
  __syncthreads();
  return res;
}

// A sampled row over the span: softmax in float64 into `prob` (the span's slice), then top-k,
// top-p and min-p by radix selection, and the draw from the counter-based uniform. Every block of
// the span returns the token. Masked (M, the row's mask): core's sampleRowMasked, i.e. the same
// rule over the allowed ids alone. Their max, softmax and masses leave the others out
// (MASKED_OUT in `prob`), every cut and the fallback candidate count allowed ids only, so a
// disallowed id is never returned; -1 when the mask allows no id below the row's limit. Unmasked
// rows run the template without any of it. The last-kept candidate's selection runs only where
// a cut needs its mass or the draw falls past every kept candidate (rounding), as its fallback.
template <bool Masked, class Span>
__device__ int sampleRow(const float* L, double* prob, Span& g, int limit, const uint32_t* M, float temp, float topK,
                         float topP, float minP, uint32_t seed, uint32_t counter, SampleShared& S) {
  double u = uniformFromSeed(seed, counter);
  int digitSet = 0;
  long long ids = limit;  // the candidates: the row's ids, or a masked row's allowed ones
  if (Masked) {
    ids = maskCount(M, g, S);
    if (ids == 0) {
      g.finish();
      return -1;
    }
  }
  float mx = -INFINITY;
  for (int i = g.begin + threadIdx.x; i < g.end; i += blockDim.x)
    if (!Masked || maskAllows(M, i)) mx = fmaxf(mx, L[i]);
  mx = g.maxf(mx, S);
  double t = (double)temp, sum = 0;
  for (int i = g.begin + threadIdx.x; i < g.end; i += blockDim.x) {
    if (Masked && !maskAllows(M, i)) {
      prob[i] = MASKED_OUT;
      continue;
    }
    double e = exp(((double)L[i] - (double)mx) / t);
    prob[i] = e;
    sum += e;
  }
  sum = g.sum(sum, S);
  double pmax = 0, pmin = HUGE_VAL;
  unsigned long long total = 0;
  for (int i = g.begin + threadIdx.x; i < g.end; i += blockDim.x) {
    double p = prob[i];
    if (Masked && p < 0) continue;
    p /= sum;
    prob[i] = p;
    pmax = fmax(pmax, p);
    pmin = fmin(pmin, p);
    total += massFixed(p);
  }
  total = g.sumu(total, S);
  pmax = g.maxd(pmax, S);
  pmin = g.mind(pmin, S);
  const KeyPrefix pre = keyPrefix(pmin, pmax);
  long long n = ids;
  if (topK > 0.f && (double)topK < (double)n) n = (long long)ceil((double)topK);
  if (topP < 1.f) {
    const unsigned long long thrP = __double2ull_rd((double)topP * MASS_ONE);
    SelResult sp = selectKey<Masked>(prob, g, digitSet, 1, 0, thrP, pre, S);
    long long k = sp.index >= 0 ? (long long)sp.countBefore + 1 : ids;
    if (k > n) k = n;
    n = k < 1 ? 1 : k;
  }
  if (minP > 0.f) {
    double floorP = (double)minP * pmax;
    int c = 0;
    // (MASKED_OUT is below any floor: minP > 0 and pmax > 0 where an id is allowed.)
    for (int i = g.begin + threadIdx.x; i < g.end; i += blockDim.x) c += prob[i] >= floorP ? 1 : 0;
    c = g.sumi(c, S);
    long long k = c < 1 ? 1 : c;
    if (k < n) n = k;
  }
  SelResult lastKept{-1, 0, 0ull, 0.0};
  const bool cut = n != ids;
  if (cut) lastKept = selectKey<Masked>(prob, g, digitSet, 0, (int)(n - 1), 0ull, pre, S);
  const unsigned long long kept = cut ? lastKept.massBefore + massFixed(lastKept.p) : total;
  // u * kept: u is k / 2^24 (uniformFromSeed), so the product is exact in 88 bits, then floored.
  const unsigned long long k24 = (unsigned long long)(u * 16777216.0);
  const unsigned long long thr = (__umul64hi(kept, k24) << 40) | ((kept * k24) >> 24);
  SelResult pick = selectKey<Masked>(prob, g, digitSet, 2, 0, thr, pre, S);
  int result;
  if (pick.index >= 0 && pick.countBefore < n) {
    result = pick.index;
  } else {
    if (!cut) lastKept = selectKey<Masked>(prob, g, digitSet, 0, (int)(n - 1), 0ull, pre, S);
    result = lastKept.index;
  }
  g.finish();
  return result;
}

}  // namespace nerva::ops
