// Prefill tile plan: which 64-row tiles of a many-sequence attention call run on the tensor-core
// tile kernels. Each run of rows of one sequence (a prompt chunk) that is at least 64 rows long
// is cut into tiles from its own first row, exactly as the chunk is cut when it is the call's only
// sequence (oneSeq); shorter runs (decode rows, short chunks) stay with the split-KV kernel, as
// they do alone. A row's tile then holds the same rows at the same places whatever shares the
// call, so its bits are the ones it gets alone: batch-invariant prompt steps may hold several
// prompts.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/attention/attn_common.cuh"
#include "ops/ops.h"

namespace nerva::ops {

constexpr int TP_THREADS = 1024;
constexpr int TP_WORDS = NERVA_TILE_PLAN_ROWS / 32;

// One block. Run starts as a bitmask in shared memory, then for every word the last start at or
// before it and the first start at or after it (two scans), so each row finds its run's bounds in
// O(1). Tiles are numbered by a shared counter: their order does not change any row's result.
__global__ void __launch_bounds__(TP_THREADS) k_attn_tile_plan(const int* rowSeq, int rows, int2* tiles, int* count,
                                                              unsigned char* covered) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  __shared__ unsigned starts[TP_WORDS];
  __shared__ int upTo[TP_WORDS];    // the last run start in words 0..w (-1: none)
  __shared__ int fromOn[TP_WORDS];  // the first run start in words w.. (rows: none)
  __shared__ int n;
  const int nW = (rows + 31) / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) n = 0;
  for (int w = warp; w < nW; w += TP_THREADS / 32) {
    const int r = w * 32 + lane;
    const bool s = r < rows && (r == 0 || rowSeq[r] != rowSeq[r - 1]);
    const unsigned m = __ballot_sync(0xffffffffu, s);
    if (lane == 0) starts[w] = m;
  }
  __syncthreads();
  for (int w = threadIdx.x; w < nW; w += TP_THREADS) {
    const unsigned m = starts[w];
    upTo[w] = m ? w * 32 + 31 - __clz(m) : -1;
    fromOn[w] = m ? w * 32 + __ffs(m) - 1 : rows;
  }
  __syncthreads();
  // Hillis-Steele scans over the words (max forwards, min backwards).
  for (int d = 1; d < nW; d *= 2) {
    int a[TP_WORDS / TP_THREADS + 1], b[TP_WORDS / TP_THREADS + 1];
    int k = 0;
    for (int w = threadIdx.x; w < nW; w += TP_THREADS, k++) {
      a[k] = w >= d ? max(upTo[w], upTo[w - d]) : upTo[w];
      b[k] = w + d < nW ? min(fromOn[w], fromOn[w + d]) : fromOn[w];
    }
    __syncthreads();
    k = 0;
    for (int w = threadIdx.x; w < nW; w += TP_THREADS, k++) {
      upTo[w] = a[k];
      fromOn[w] = b[k];
    }
    __syncthreads();
  }
  for (int r = threadIdx.x; r < rows; r += TP_THREADS) {
    const int w = r >> 5, bit = r & 31;
    const unsigned m = starts[w];
    const unsigned le = bit == 31 ? ~0u : (2u << bit) - 1u;  // bits 0..bit
    const unsigned atOrBefore = m & le, after = m & ~le;
    const int s = atOrBefore ? w * 32 + 31 - __clz(atOrBefore) : upTo[w - 1];  // row 0 starts a run
    const int e = after ? w * 32 + __ffs(after) - 1 : (w + 1 < nW ? fromOn[w + 1] : rows);
    const bool tiled = e - s >= PF_ROWS;
    covered[r] = tiled ? 1 : 0;
    if (tiled && (r - s) % PF_ROWS == 0) tiles[atomicAdd(&n, 1)] = make_int2(r, min(e, r + PF_ROWS));
  }
  __syncthreads();
  if (threadIdx.x == 0) *count = n;
}

int attnTilePlan(NervaExec* ex, const int* rowSeq, int rows) {
  if (rows > ex->planRows || !ex->tiles) return bad(ex, "attention: tile plan past its rows");
  LAUNCH(k_attn_tile_plan, 1, TP_THREADS, 0, rowSeq, rows, ex->tiles, ex->tileCount, ex->tileCovered);
  return NERVA_OK;
}

}  // namespace nerva::ops
