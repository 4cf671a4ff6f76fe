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
struct SelResult {
  int index;           // the element found (-1: none)
  int countBefore;     // candidates before it in the order
  double massBefore;   // their probability mass
  double p;            // its own probability
};

constexpr int SAMPLE_MAX_CLUSTER = 16;

struct SampleShared {
  // A digit's histogram, two sets: a cluster's blocks read each other's set of digit d while
  // their own next digit fills the other one (one cluster barrier a digit).
  int cnt[2][256];
  double mass[2][256];
  int any[2][256];
  // The histogram a digit's choice reads: the set itself (one block) or the cluster's merged sum.
  int mcnt[256];
  double mmass[256];
  int many[256];
  uint64_t hiMask, hiVal;
  uint32_t loMask, loVal;
  int countBefore;
  double massBefore;
  int done, found, chosenIdx;
  double red[32];
  int redi[32];
  float redf[32];
  // A cluster reduction's per-block value, two slots (as the histograms).
  double xd[2];
  int xi[2];
  float xf[2];
};

// A masked row's disallowed ids in the float64 scratch: below every probability, so the
// selections skip them (selectKey<true>) and a min-p floor (>= 0) never keeps them.
constexpr double MASKED_OUT = -1.0;

// Bit i of a row's token mask: id i is allowed.
__device__ __forceinline__ bool maskAllows(const uint32_t* M, int i) { return (M[i >> 5] >> (i & 31)) & 1u; }

__device__ __forceinline__ double blockMaxD(double v, SampleShared& S) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) S.red[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = 0;
  for (int w = 0; w < (int)(blockDim.x >> 5); w++) t = fmax(t, S.red[w]);
  __syncthreads();
  return t;
}

// One block over the whole row [0, end).
struct BlockSpan {
  int begin, end;
  __device__ double sum(double v, SampleShared& S) { return blockSum(v, S.red); }
  __device__ int sumi(int v, SampleShared& S) { return blockSum(v, S.redi); }
  __device__ float maxf(float v, SampleShared& S) { return blockMax(v, S.redf); }
  __device__ double maxd(double v, SampleShared& S) { return blockMaxD(v, S); }
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
  struct MaxD {
    __device__ double operator()(double a, double b) const { return fmax(a, b); }
  };
  __device__ double sum(double v, SampleShared& S) { return across(blockSum(v, S.red), &SampleShared::xd, S, 0.0, Add()); }
  __device__ int sumi(int v, SampleShared& S) { return across(blockSum(v, S.redi), &SampleShared::xi, S, 0, Add()); }
  __device__ float maxf(float v, SampleShared& S) { return across(blockMax(v, S.redf), &SampleShared::xf, S, -INFINITY, MaxF()); }
  __device__ double maxd(double v, SampleShared& S) { return across(blockMaxD(v, S), &SampleShared::xd, S, 0.0, MaxD()); }
  // The digit's histogram: the blocks' sets summed in rank order; `any` from the lowest rank that
  // saw the bucket (it is read only where the bucket holds one candidate).
  __device__ void merge(SampleShared& S, int set) {
    sync();
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      int c = 0, a = -1;
      double m = 0;
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

// mode 0: the element at rank `rank`; mode 1: first element with massBefore + p >= thr;
// mode 2: first element with massBefore + p > thr. Masked: entries below zero (a masked row's
// disallowed ids, MASKED_OUT) are no candidates at all, not even after the allowed ids of
// probability zero, so ranks, counts and masses are over the allowed ids alone. Each digit
// bins the span's keys (a thread's keys in ascending index order), then the choice reads the
// merged histogram.
template <bool Masked, class Span>
__device__ SelResult selectKey(const double* prob, Span& g, int& digitSet, int mode, int rank, double thr, SampleShared& S) {
  if (threadIdx.x == 0) {
    S.hiMask = 0;
    S.hiVal = 0;
    S.loMask = 0;
    S.loVal = 0;
    S.countBefore = 0;
    S.massBefore = 0;
    S.done = 0;
    S.found = 1;
    S.chosenIdx = -1;
  }
  __syncthreads();
  for (int digit = 11; digit >= 0; digit--) {
    const int set = digitSet++ & 1;
    int* cnt = S.cnt[set];
    double* mass = S.mass[set];
    int* any = S.any[set];
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      cnt[b] = 0;
      mass[b] = 0;
      any[b] = -1;
    }
    __syncthreads();
    const uint64_t hm = S.hiMask, hv = S.hiVal;
    const uint32_t lm = S.loMask, lv = S.loVal;
    // Runs of equal buckets are accumulated in registers before one shared atomic: early digits
    // (sign/exponent bytes) put nearly every candidate in the same bucket.
    int runB = -1, runC = 0, runI = -1;
    double runM = 0;
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
            atomicAdd(&mass[runB], runM);
            any[runB] = runI;
          }
          runB = b;
          runC = 0;
          runM = 0;
        }
        runC++;
        runM += p;
        runI = i;
      }
    }
    if (runB >= 0) {
      atomicAdd(&cnt[runB], runC);
      atomicAdd(&mass[runB], runM);
      any[runB] = runI;
    }
    __syncthreads();
    g.merge(S, set);
    if (threadIdx.x == 0) {
      int chosen = -1;
      for (int b = 255; b >= 0; b--) {
        if (S.mcnt[b] == 0) continue;
        bool hit = mode == 0   ? S.countBefore + S.mcnt[b] > rank
                   : mode == 1 ? S.massBefore + S.mmass[b] >= thr
                               : S.massBefore + S.mmass[b] > thr;
        if (hit) {
          chosen = b;
          break;
        }
        S.countBefore += S.mcnt[b];
        S.massBefore += S.mmass[b];
      }
      if (chosen < 0) {
        S.found = 0;
        S.done = 1;
      } else {
        if (digit >= 4) {
          int sh = (digit - 4) * 8;
          S.hiMask |= (uint64_t)0xff << sh;
          S.hiVal |= (uint64_t)chosen << sh;
        } else {
          int sh = digit * 8;
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
  double pmax = 0, total = 0;
  for (int i = g.begin + threadIdx.x; i < g.end; i += blockDim.x) {
    double p = prob[i];
    if (Masked && p < 0) continue;
    p /= sum;
    prob[i] = p;
    pmax = fmax(pmax, p);
    total += p;
  }
  total = g.sum(total, S);
  pmax = g.maxd(pmax, S);
  long long n = ids;
  if (topK > 0.f && (double)topK < (double)n) n = (long long)ceil((double)topK);
  if (topP < 1.f) {
    SelResult sp = selectKey<Masked>(prob, g, digitSet, 1, 0, (double)topP, S);
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
  SelResult lastKept{-1, 0, 0.0, 0.0};
  const bool cut = n != ids;
  if (cut) lastKept = selectKey<Masked>(prob, g, digitSet, 0, (int)(n - 1), 0, S);
  double kept = cut ? lastKept.massBefore + lastKept.p : total;
  SelResult pick = selectKey<Masked>(prob, g, digitSet, 2, 0, u * kept, S);
  int result;
  if (pick.index >= 0 && pick.countBefore < n) {
    result = pick.index;
  } else {
    if (!cut) lastKept = selectKey<Masked>(prob, g, digitSet, 0, (int)(n - 1), 0, S);
    result = lastKept.index;
  }
  g.finish();
  return result;
}

}  // namespace nerva::ops
