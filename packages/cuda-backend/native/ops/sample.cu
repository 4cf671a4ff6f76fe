// Sampling and the step tail: argmax, sample (block and cluster forms), ring_push,
// advance_positions.
#include <cooperative_groups.h>
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "common/cluster.cuh"
#include "ops/ops.h"
#include "ops/sample_row.cuh"

namespace nerva::ops {

__global__ void k_argmax(const float* logits, int* out, int vocab) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  __shared__ float shv[32];
  __shared__ int shi[32];
  int r = blockIdx.x;
  int idx = blockArgmax(logits + (size_t)r * vocab, vocab, shv, shi);
  if (threadIdx.x == 0) out[r] = idx;
}

// pre: the cursor is read before the dependency wait. Its only writers are earlier pushes and
// the host (stream-ordered copies, which no kernel overlaps); the launch passes pre when three or
// more kernels were issued since the last push, so that push has completed by the time this
// kernel starts (the kernel before it triggers only after its own wait, and no two consecutive
// kernels trigger at entry). Then the cursor's round trip over PCIe (pinned memory, ~1 us) runs
// while the sampling still finishes, not after it.
__global__ void k_ring_push(const int* src, int* ring, int* cursor, int rows, int capacity, int pre) {
  NERVA_TRACE_KERNEL();
  int cur = pre ? *(volatile int*)cursor : 0;
  PDL_ENTER();
  if (!pre) cur = *(volatile int*)cursor;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    int slot = (int)(((long long)cur + r) % capacity);
    ((volatile int*)ring)[slot] = src[r];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // the tokens are visible to a host peek before the cursor moves
    // (No fence after: nothing in this kernel depends on the cursor reaching the host; a later
    // push reads it after its wait, and the host's reads after a stream or event sync see it.)
    *(volatile int*)cursor = cur + rows;
  }
}

__global__ void k_advance_positions(int* positions, int* slots, const int* bt, const int* rowSeq, int rows, int blockSize,
                                    int mbps) {
  NERVA_TRACE_KERNEL();
  // Only the host (in stream order) and this kernel write what it reads (the step's other kernels
  // only read positions and slots): the next slot is computed before the dependency wait and
  // stored after it, when the step's attention has read the old ones. The next kernel is let in
  // only at exit (no early trigger), so an advance right after this one reads the new positions.
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  int p = 0, sl = 0;
  if (r < rows) {
    p = positions[r] + 1;
    sl = bt[(size_t)rowSeq[r] * mbps + p / blockSize] * blockSize + p % blockSize;
  }
  pdlWait();
  if (r >= rows) return;
  positions[r] = p;
  slots[r] = sl;
}

// blockArgmaxRange over a masked row's allowed ids (every thread gets (value, index)): the
// largest logit, the lowest id among equal ones; where no allowed id has a logit above -inf (all
// -inf or NaN) the lowest allowed id with -inf, as core's argmaxRow over the allowed ids alone
// (its first candidate stands until one is greater). Index -1: the range allows no id. The
// pairs merge by argmaxMerge as blockArgmaxRange's (-inf pairs by their lowest index).
__device__ void blockArgmaxRangeMasked(const float* L, const uint32_t* M, int begin, int end, float* shv, int* shi,
                                       float& outV, int& outI) {
  float bv = -INFINITY;
  int bi = -1;
  constexpr int U = 4;
  for (int i0 = begin + threadIdx.x; i0 < end; i0 += U * blockDim.x) {
    float v[U];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int i = i0 + u * blockDim.x;
      ok[u] = i < end && maskAllows(M, i);
      v[u] = ok[u] ? L[i] : -INFINITY;  // (a disallowed id's logit is never read)
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (!ok[u]) continue;
      if (v[u] > bv) {
        bv = v[u];
        bi = i0 + u * blockDim.x;
      } else if (bi < 0) {
        bi = i0 + u * blockDim.x;  // the thread's first allowed id, at -inf
      }
    }
  }
  blockArgmaxStage(bv, bi, shv, shi);
  const int nw = (blockDim.x + 31) >> 5;
  float v = -INFINITY;
  int idx = -1;
  for (int k = 0; k < nw; k++) argmaxMerge(v, idx, shv[k], shi[k]);
  __syncthreads();
  outV = v;
  outI = idx;
}

// A row's mask, read after the dependency wait (a kernel may have written it). Returns null for
// an unmasked row (no mask, index < 0); sets bad where the index names no mask `bits` holds.
__device__ __forceinline__ const uint32_t* rowMask(const uint32_t* bits, const int* index, int words, int masks, int r,
                                                   bool& bad) {
  bad = false;
  if (!index) return nullptr;
  const int k = index[r];
  if (k < 0) return nullptr;
  if (k >= masks) {
    bad = true;
    return nullptr;
  }
  return bits + (size_t)k * words;
}

// Greedy rows: the G blocks of the row each reduce one slice of the vocabulary to (max, index),
// store it in the row's scratch and count in; the last to arrive merges the G pairs (lowest index
// on ties, as blockArgmax) and re-arms the counter, so a large vocabulary is read by many SMs in
// one kernel. Returns -2 in every block but the last, else the token. M: the row's mask (null:
// unmasked), each slice by blockArgmaxRangeMasked; -1 when it allows no id.
template <bool Masked>
__device__ int greedyArrive(const float* L, int vocab, int G, const uint32_t* M, double* prob, int* counter, SampleShared& S) {
  __shared__ int lastFlag;
  int chunk = (vocab + G - 1) / G, begin = blockIdx.x * chunk, end = min(vocab, begin + chunk);
  float v;
  int idx;
  if (Masked && M)
    blockArgmaxRangeMasked(L, M, begin, end, S.redf, S.redi, v, idx);
  else
    blockArgmaxRange(L, begin, end, S.redf, S.redi, v, idx);
  float* pv = reinterpret_cast<float*>(prob);  // pairs (value, index) in the row's float64 slots
  if (threadIdx.x == 0) {
    pv[2 * blockIdx.x] = v;
    reinterpret_cast<int*>(pv)[2 * blockIdx.x + 1] = idx;
    __threadfence();  // the pair is visible before this block is counted
    int old = atomicAdd(counter, 1);
    lastFlag = old == G - 1;
    if (lastFlag) *counter = 0;
  }
  __syncthreads();
  if (!lastFlag) return -2;
  __threadfence();
  if (threadIdx.x < 32) {
    float bv = -INFINITY;
    int bi = -1;
    for (int j = threadIdx.x; j < G; j += 32)
      argmaxMerge(bv, bi, __ldcg(pv + 2 * j), __ldcg(reinterpret_cast<const int*>(pv) + 2 * j + 1));
    warpArgmax(bv, bi);
    if (threadIdx.x == 0) S.redi[0] = bi;
  }
  __syncthreads();
  int r = S.redi[0];
  return r < 0 ? (Masked && M ? -1 : 0) : r;
}

// Grid (G, rows): one float64 scratch row per row. A greedy row (temperature <= 0) is split over
// the G blocks (greedyArrive); a sampled row runs in its block 0 alone, the others exit.
// `counters` (one per row, zero, left zero) may be null only when G == 1. Rows are `vocab` apart;
// only ids below `limit` (<= vocab) are candidates: a checkpoint's embedding rows past its
// tokenizer's ids are never sampled, whatever their logits. maskIndex (null: no row masked):
// row r with maskIndex[r] >= 0 samples among the ids bits' mask maskIndex[r] (of `masks`, `words`
// apart) allows (rowMask); out[r] = -1 where that mask allows none, or names no mask of `bits`.
// Masked: the launch has a mask (a row's index tested once); k_sample<false>, every launch
// without one, is the unmasked sampler alone (its registers and code as before masks).
template <bool Masked>
__global__ void __launch_bounds__(1024) k_sample(const float* logits, const float* params, int* rng, int* out, int vocab,
                                                 int limit, double* probScratch, size_t probStride, int rowBase,
                                                 int* counters, const uint32_t* maskBits, const int* maskIndex,
                                                 int maskWords, int masks) {
  NERVA_TRACE_KERNEL();
  __shared__ SampleShared S;
  int r = rowBase + blockIdx.y, G = gridDim.x;
  const float* L = logits + (size_t)r * vocab;
  double* prob = probScratch + (size_t)blockIdx.y * probStride;
  // The parameters are read before the dependency wait (only the host writes them, in stream
  // order). The seeds after it: the sample launch just before this one may still be moving the
  // counter (back-to-back draws).
  float temp = params[(size_t)r * 4], topK = params[(size_t)r * 4 + 1], topP = params[(size_t)r * 4 + 2],
        minP = params[(size_t)r * 4 + 3];
  PDL_ENTER();
  uint32_t seed = (uint32_t)rng[(size_t)r * 2], counter = (uint32_t)rng[(size_t)r * 2 + 1];
  bool maskBad = false;
  const uint32_t* M = Masked ? rowMask(maskBits, maskIndex, maskWords, masks, r, maskBad) : nullptr;
  int result;
  if (Masked && maskBad) {
    if (blockIdx.x != 0) return;
    result = -1;
  } else if (!(temp > 0.f)) {
    if (G == 1) {
      if (Masked && M) {
        float v;
        blockArgmaxRangeMasked(L, M, 0, limit, S.redf, S.redi, v, result);
      } else {
        result = blockArgmax(L, limit, S.redf, S.redi);
      }
    } else {
      result = greedyArrive<Masked>(L, limit, G, M, prob, counters + blockIdx.y, S);
      if (result == -2) return;
    }
  } else {
    if (blockIdx.x != 0) return;
    BlockSpan g{0, limit};
    result = Masked && M ? sampleRow<true>(L, prob, g, limit, M, temp, topK, topP, minP, seed, counter, S)
                         : sampleRow<false>(L, prob, g, limit, nullptr, temp, topK, topP, minP, seed, counter, S);
  }
  if (threadIdx.x == 0) {
    out[r] = result;
    rng[(size_t)r * 2 + 1] = (int)(counter + 1u);
  }
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // (k_sample_cluster's alone, sm_90+)
// blockArgmaxRange over float4s: L + begin 16-byte aligned, begin % 4 == 0. U float4s a thread in
// flight at once (a cluster block's ~19 K logits in one round trip), taken in index order, so the
// result is blockArgmaxRange's (strictly greater wins; lowest index among equal maxima).
__device__ __forceinline__ void blockArgmaxRange4(const float* L, int begin, int end, float* shv, int* shi, float& outV, int& outI) {
  constexpr int U = 8;
  float bv = -INFINITY;
  int bi = -1;
  const int n4 = (end - begin + 3) >> 2;
  const float4* L4 = reinterpret_cast<const float4*>(L + begin);
  for (int j0 = threadIdx.x; j0 < n4; j0 += U * blockDim.x) {
    float4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int j = j0 + u * blockDim.x;
      v[u] = j < n4 ? L4[j] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int i = begin + 4 * (j0 + u * blockDim.x);
      const float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int c = 0; c < 4; c++)
        if (i + c < end && e[c] > bv) {
          bv = e[c];
          bi = i + c;
        }
    }
  }
  blockArgmaxStage(bv, bi, shv, shi);
  const int lane = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  // The block's warps merged by one warp (lane k holds warp k's pair), not a thread's loop.
  float v = -INFINITY;
  int idx = -1;
  if (lane < nw) {
    v = shv[lane];
    idx = shi[lane];
  }
  warpArgmax(v, idx);
  outV = v;
  outI = idx;
}
#endif

// A decode step's tail (op sample's push and advance) for a grid of one row, in block 0 after
// the merge: ring[cursor % capacity] = the token, cursor + 1, then the row's next position and
// KV slot. `pre`: the cursor and the row's position, block table entry and next slot are read
// before the dependency wait (the caller saw three or more kernels since the last that wrote
// them: see NervaExec::sinceRingPush), as k_ring_push and k_advance_positions do.
struct SampleTail {
  int* ring = nullptr;  // null: no push
  int* cursor = nullptr;
  int capacity = 1;
  int* positions = nullptr;  // null: no advance
  int* slots = nullptr;
  const int* bt = nullptr;
  const int* rowSeq = nullptr;
  int blockSize = 1;
  int mbps = 1;
  int pre = 0;
};

struct SampleTailState {
  int cur = 0, pos = 0, slot = 0;
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // k_sample_cluster's only (clusters: sm_90)
__device__ __forceinline__ void sampleTailRead(const SampleTail& T, SampleTailState& s) {
  if (T.ring) s.cur = *(volatile int*)T.cursor;
  if (T.positions) {
    s.pos = T.positions[0] + 1;
    s.slot = T.bt[(size_t)T.rowSeq[0] * T.mbps + s.pos / T.blockSize] * T.blockSize + s.pos % T.blockSize;
  }
}

__device__ __forceinline__ void sampleTailWrite(const SampleTail& T, const SampleTailState& s, int token) {
  if (T.ring) {
    ((volatile int*)T.ring)[(int)((long long)s.cur % T.capacity)] = token;
    __threadfence_system();  // the token is visible to a host peek before the cursor moves
    *(volatile int*)T.cursor = s.cur + 1;
  }
  if (T.positions) {
    T.positions[0] = s.pos;
    T.slots[0] = s.slot;
  }
}
#endif

// Threads a block of k_sample_cluster: 512, two blocks an SM, so that 32 rows' clusters of 8 run
// as one wave (at 1024 threads, one block an SM by registers, they ran in two).
constexpr int SAMPLE_CLUSTER_THREADS = 512;

// k_sample with the G blocks of a row as one thread block cluster (grid (G, rows), cluster
// (G, 1)): a greedy row's blocks push their (max, index) into block 0's shared memory (st.async,
// counted by block 0's transaction barrier), instead of a fence, an atomic count and the last
// block's reads back from L2 (the step's end is a chain of such round trips after the LM head).
// A sampled row runs over every block of the cluster, each a slice of the vocabulary, the
// histograms and sums of its selections merged through the blocks' shared memory (sampleRow with
// a ClusterSpan: in one block it was a serial scan of the row a dozen times, ~0.8 ms at a vocab
// of 151,936 on an H200). The caller checked: vocab % 4 == 0 and the logits 16-byte aligned (each block's slice
// starts on a float4; one past `limit` reads at most 3 logits short of the next multiple of 4,
// within the row). Only ids below `limit` are candidates, and masked rows (Masked, maskIndex)
// are sampled, as in k_sample; a masked greedy row's blocks reduce their slices by
// blockArgmaxRangeMasked (any alignment).
template <bool Masked>
__global__ void __launch_bounds__(SAMPLE_CLUSTER_THREADS, 2) k_sample_cluster(const float* logits, const float* params, int* rng, int* out,
                                                         int vocab, int limit, double* probScratch, size_t probStride,
                                                         int rowBase, SampleTail tail, const uint32_t* maskBits,
                                                         const int* maskIndex, int maskWords, int masks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters need sm_90: never launched there (sampleClusterSize)
#else
  namespace cg = cooperative_groups;
  NERVA_TRACE_KERNEL();
  __shared__ SampleShared S;
  __shared__ float pairV[SAMPLE_MAX_CLUSTER];
  __shared__ int pairI[SAMPLE_MAX_CLUSTER];
  cg::cluster_group cl = cg::this_cluster();
  const int C = (int)cl.num_blocks(), rank = (int)cl.block_rank();
  const int r = rowBase + blockIdx.y;
  const float* L = logits + (size_t)r * vocab;
  double* prob = probScratch + (size_t)blockIdx.y * probStride;
  const float temp = params[(size_t)r * 4], topK = params[(size_t)r * 4 + 1], topP = params[(size_t)r * 4 + 2],
              minP = params[(size_t)r * 4 + 3];
  SampleTailState ts;
  if (tail.pre && rank == 0 && threadIdx.x == 0) sampleTailRead(tail, ts);
  PDL_ENTER();
  if (!tail.pre && rank == 0 && threadIdx.x == 0) sampleTailRead(tail, ts);
  const uint32_t seed = (uint32_t)rng[(size_t)r * 2], counter = (uint32_t)rng[(size_t)r * 2 + 1];
  // (The same for every block of the cluster, which is one row: all of them take the same path.)
  bool maskBad = false;
  const uint32_t* M = Masked ? rowMask(maskBits, maskIndex, maskWords, masks, r, maskBad) : nullptr;
  int result;
  if (Masked && maskBad) {
    if (rank != 0) return;
    result = -1;
  } else if (!(temp > 0.f)) {
    const int chunk = (((limit + C - 1) / C) + 3) & ~3;
    const int begin = min(limit, rank * chunk), end = min(limit, begin + chunk);
    // The pairs travel by st.async into block 0, counted by its transaction barrier (as the
    // cluster attention's partials, ops/attention/decode_short.cu): no cluster barrier, whose release
    // is a GPU-scope fence, and the other blocks exit once their pair is sent.
    __shared__ __align__(8) unsigned long long txBar;
    const unsigned bar = saShared(&txBar);
    if (rank == 0 && threadIdx.x == 0) saTxInit(bar, (unsigned)(C * 2 * sizeof(float)));
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    float v;
    int idx;
    if (Masked && M)
      blockArgmaxRangeMasked(L, M, begin, end, S.redf, S.redi, v, idx);
    else
      blockArgmaxRange4(L, begin, end, S.redf, S.redi, v, idx);
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // block 0's barrier is initialized
    if (threadIdx.x == 0) {
      const unsigned rb = saMapa(bar, 0);
      saStAsync(saMapa(saShared(&pairV[rank]), 0), v, rb);
      saStAsync(saMapa(saShared(&pairI[rank]), 0), __int_as_float(idx), rb);
    }
    if (rank != 0 || threadIdx.x >= 32) return;
    saTxWait(bar);
    float bv = -INFINITY;
    int bi = -1;
    if ((int)threadIdx.x < C) {
      bv = pairV[threadIdx.x];
      bi = pairI[threadIdx.x];
    }
    warpArgmax(bv, bi);
    result = bi < 0 ? (Masked && M ? -1 : 0) : bi;
  } else {
    // A sampled row over the cluster, each block a slice of whole mask words (sampleRow's
    // ClusterSpan); the token is block 0's to write.
    const int chunk = (((limit + C - 1) / C) + 31) & ~31;
    const int begin = min(limit, rank * chunk);
    ClusterSpan g{begin, min(limit, begin + chunk), C, 0};
    result = Masked && M ? sampleRow<true>(L, prob, g, limit, M, temp, topK, topP, minP, seed, counter, S)
                         : sampleRow<false>(L, prob, g, limit, nullptr, temp, topK, topP, minP, seed, counter, S);
    if (rank != 0) return;
  }
  if (threadIdx.x == 0) {
    out[r] = result;
    rng[(size_t)r * 2 + 1] = (int)(counter + 1u);
    sampleTailWrite(tail, ts, result);
  }
#endif
}

// Blocks a cluster of k_sample_cluster (4 and 16 measured no faster than 8).
constexpr int SAMPLE_CLUSTER = 8;

// SAMPLE_CLUSTER, or 0 where clusters of that size cannot run (before sm_90): k_sample's blocks
// with a last-arriving merge then. Asked once per process.
int sampleClusterSize() {
  static int v = -1;
  if (v >= 0) return v;
  int c = SAMPLE_CLUSTER;
  {
    ClusterLaunch L(dim3((unsigned)c, 1, 1), SAMPLE_CLUSTER_THREADS, 0, c, nullptr, false);
    int clusters = 0;
    // (k_sample_cluster<true> has the same launch shape and bounds: what holds for one holds for both.)
    const auto big = cudaFuncAttributeNonPortableClusterSizeAllowed;
    if ((c > 8 && (allowKernelAttribute(k_sample_cluster<false>, big, 1) != cudaSuccess ||
                   allowKernelAttribute(k_sample_cluster<true>, big, 1) != cudaSuccess)) ||
        cudaOccupancyMaxActiveClusters(&clusters, k_sample_cluster<false>, &L.cfg) != cudaSuccess) {
      cudaGetLastError();
      clusters = 0;
    }
    if (clusters <= 0) c = 0;
  }
  v = c;
  return v;
}

int launchRingPush(NervaExec* ex, const int* src, int* ring, int* cursor, int rows, int cap) {
  const int pre = ex->sinceRingPush >= 3 ? 1 : 0;
  LAUNCH(k_ring_push, 1, std::min(1024, ((rows + 31) / 32) * 32), 0, src, ring, cursor, rows, cap, pre);
  ex->sinceRingPush = 0;
  return NERVA_OK;
}

int launchAdvance(NervaExec* ex, int* pos, int* slots, const int* bt, const int* rowSeq, int rows, int bs, int mbps) {
  LAUNCH(k_advance_positions, (rows + 127) / 128, 128, 0, pos, slots, bt, rowSeq, rows, bs, mbps);
  ex->sinceRingPush = 0;
  return NERVA_OK;
}

// Op sample, then (where given) its push (op ring_push of out) and advance (op
// advance_positions): in k_sample_cluster's block 0 for one greedy-or-sampled row on the cluster
// path (a decode step's tail in one kernel), else as those ops' kernels after it.
int opSample(NervaExec* ex, Args& A) {
  Buf logits = buf(A), params = buf(A), rng = buf(A), out = buf(A);
  int rows = A.num(), vocab = A.num(), limit = A.num();
  const int hasPush = A.num();
  Buf ring{}, cursor{};
  int cap = 1;
  if (hasPush) {
    ring = buf(A);
    cursor = buf(A);
    cap = A.num();
  }
  const int hasAdvance = A.num();
  Buf pos{}, slots{}, bt{}, rowSeq{};
  int bs = 1, mbps = 1;
  if (hasAdvance) {
    pos = buf(A);
    slots = buf(A);
    bt = buf(A);
    rowSeq = buf(A);
    bs = A.num();
    mbps = A.num();
  }
  // mask (src/abi/sample.ts): a flag, then bits, index, words and masks (how many words-long masks
  // bits holds: a row's index past them is sampled as -1, never read out of bounds).
  const int hasMask = A.num();
  Buf mbits{}, mindex{};
  int words = 1, masks = 0;
  if (hasMask) {
    mbits = buf(A);
    mindex = buf(A);
    words = A.num();
    masks = A.num();
  }
  if (!A.ok) return bad(ex, "sample: argument count");
  if (hasMask && (words < 1 || (long long)words * 32 < limit || masks < 0))
    return bad(ex, "sample: mask words must cover limit's ids and masks be non-negative");
  const uint32_t* maskBits = hasMask ? (const uint32_t*)mbits.p : nullptr;
  const int* maskIndex = hasMask ? (const int*)mindex.p : nullptr;
  if (limit < 1 || limit > vocab) return bad(ex, "sample: limit must be in [1, vocab]");
  if (hasPush && cap <= 0) return bad(ex, "sample: push capacity must be positive");
  if (hasAdvance && (bs <= 0 || mbps <= 0)) return bad(ex, "sample: advance blockSize and maxBlocksPerSeq must be positive");
  if (rows <= 0) return NERVA_OK;
  size_t perRow = align256((size_t)vocab * sizeof(double));
  int rowChunk = (int)std::min<size_t>((size_t)rows, ex->wsBytes / perRow);
  if (rowChunk < 1) return bad(ex, "sample: workspace too small for one row of float64 probabilities");
  rowChunk = std::min(rowChunk, 65535);
  // Greedy rows split the vocabulary over G blocks of ~4096 logits (4 per thread) when the
  // re-armed counters cover the rows; a single block over 151,936 logits was a serial tail.
  int G = std::min(128, std::max(1, (limit + 4095) / 4096));
  // Greedy rows as one cluster a row where clusters run (sampleClusterSize).
  const int C = vocab % 4 == 0 && ((uintptr_t)logits.p & 15) == 0 ? sampleClusterSize() : 0;
  // One row on the cluster path: the tail runs in the sampling kernel.
  const bool fold = C > 0 && rows == 1 && (hasPush || hasAdvance);
  SampleTail tail;
  if (fold) {
    if (hasPush) {
      tail.ring = (int*)ring.p;
      tail.cursor = (int*)cursor.p;
      tail.capacity = cap;
    }
    if (hasAdvance) {
      tail.positions = (int*)pos.p;
      tail.slots = (int*)slots.p;
      tail.bt = (const int*)bt.p;
      tail.rowSeq = (const int*)rowSeq.p;
      tail.blockSize = bs;
      tail.mbps = mbps;
    }
    tail.pre = ex->sinceRingPush >= 3 ? 1 : 0;
  }
  for (int r0 = 0; r0 < rows; r0 += rowChunk) {
    int nr = std::min(rowChunk, rows - r0);
    if (C > 0) {
      ClusterLaunch L(dim3((unsigned)C, (unsigned)nr, 1), SAMPLE_CLUSTER_THREADS, 0, C, ex->stream, ex->pdl);
      cudaError_t e = cudaLaunchKernelEx(&L.cfg, hasMask ? k_sample_cluster<true> : k_sample_cluster<false>,
                                         (const float*)logits.p, (const float*)params.p, (int*)rng.p, (int*)out.p, vocab,
                                         limit, (double*)ex->ws, perRow / sizeof(double), r0, tail, maskBits, maskIndex,
                                         words, masks);
      int rc = check(ex, "k_sample_cluster", e);
      if (rc) return rc;
      if (ex->sinceRingPush < (1u << 20)) ex->sinceRingPush++;
      continue;
    }
    int g = ex->counters && (size_t)nr <= ex->counterCount ? G : 1;
    LAUNCH(hasMask ? k_sample<true> : k_sample<false>, dim3(g, nr), 1024, 0, (const float*)logits.p,
           (const float*)params.p, (int*)rng.p, (int*)out.p, vocab, limit, (double*)ex->ws, perRow / sizeof(double), r0,
           g > 1 ? ex->counters : (int*)nullptr, maskBits, maskIndex, words, masks);
  }
  if (fold) {
    ex->sinceRingPush = 0;
    return NERVA_OK;
  }
  if (hasPush) {
    int rc = launchRingPush(ex, (const int*)out.p, (int*)ring.p, (int*)cursor.p, rows, cap);
    if (rc) return rc;
  }
  if (hasAdvance) return launchAdvance(ex, (int*)pos.p, (int*)slots.p, (const int*)bt.p, (const int*)rowSeq.p, rows, bs, mbps);
  return NERVA_OK;
}

int opArgmax(NervaExec* ex, Args& A) {
  Buf logits = buf(A), out = buf(A);
  int rows = A.num(), vocab = A.num();
  if (!A.ok) return bad(ex, "argmax: argument count");
  if (rows <= 0) return NERVA_OK;
  LAUNCH(k_argmax, rows, 1024, 0, (const float*)logits.p, (int*)out.p, vocab);
  return NERVA_OK;
}

int opRingPush(NervaExec* ex, Args& A) {
  Buf src = buf(A), ring = buf(A), cursor = buf(A);
  int rows = A.num(), cap = A.num();
  if (!A.ok) return bad(ex, "ring_push: argument count");
  if (cap <= 0) return bad(ex, "ring_push: capacity must be positive");
  if (rows <= 0) return NERVA_OK;
  return launchRingPush(ex, (const int*)src.p, (int*)ring.p, (int*)cursor.p, rows, cap);
}

int opAdvancePositions(NervaExec* ex, Args& A) {
  Buf pos = buf(A), slots = buf(A), bt = buf(A), rowSeq = buf(A);
  int rows = A.num(), bs = A.num(), mbps = A.num();
  if (!A.ok) return bad(ex, "advance_positions: argument count");
  if (rows <= 0) return NERVA_OK;
  return launchAdvance(ex, (int*)pos.p, (int*)slots.p, (const int*)bt.p, (const int*)rowSeq.p, rows, bs, mbps);
}

}  // namespace nerva::ops
