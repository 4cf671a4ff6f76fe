// Mixture of experts: routing (softmax, top-k) and the expert MLP.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/ops.h"

namespace nerva::ops {

// ---------------------------------------------------------------- MoE

// One warp per row: float32 softmax over experts, top-k by repeated argmax (ties: lower index).
__global__ void k_moe_route(const float* logits, int* topIds, float* topW, int rows, int E, int K, int normalize, int bfa) {
  PDL_ENTER();
  extern __shared__ float smem[];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int r = blockIdx.x * (blockDim.x >> 5) + warp;
  if (r >= rows) return;
  float* p = smem + (size_t)warp * E;
  const float* L = logits + (size_t)r * E;
  float mx = -INFINITY;
  for (int i = lane; i < E; i += 32) mx = fmaxf(mx, L[i]);
  mx = warpMax(mx);
  float sum = 0.f;
  for (int i = lane; i < E; i += 32) {
    float e = expf(L[i] - mx);
    p[i] = e;
    sum += e;
  }
  sum = warpSum(sum);
  for (int i = lane; i < E; i += 32) p[i] /= sum;
  __syncwarp();
  float tot = 0.f;
  for (int k = 0; k < K; k++) {
    float bv = -INFINITY;
    int bi = -1;
    for (int i = lane; i < E; i += 32)
      if (p[i] >= 0.f && (bi < 0 || p[i] > bv)) {
        bv = p[i];
        bi = i;
      }
    warpArgmax(bv, bi);
    if (lane == 0) {
      topIds[(size_t)r * K + k] = bi;
      topW[(size_t)r * K + k] = bv;
      p[bi] = -1.f;  // taken
    }
    tot += bv;
    __syncwarp();
  }
  __syncwarp();
  if (lane < K) {
    float w = topW[(size_t)r * K + lane];
    topW[(size_t)r * K + lane] = bfr(normalize ? w / tot : w, bfa);
  }
}

// h[(r,k), j] = silu(gate_e[j] . x[r]) * (up_e[j] . x[r]); one warp per j.
__global__ void k_moe_gate_up(const float* x, const int* topIds, const void* gateUp, int wdt, float* h, int hidden,
                              int inter, int K, int rowBase, int bfa) {
  PDL_ENTER();
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int j = blockIdx.x * 4 + warp;
  int rk = blockIdx.y;  // local (row, k)
  if (j >= inter) return;
  int r = rowBase + rk / K, k = rk % K;
  size_t e = (size_t)topIds[(size_t)r * K + k];
  const float* xr = x + (size_t)r * hidden;
  size_t g0 = (e * 2 * inter + j) * hidden, u0 = (e * 2 * inter + inter + j) * hidden;
  float g = 0.f, u = 0.f;
  for (int i = lane; i < hidden; i += 32) {
    float xv = xr[i];
    g += xv * ldf(gateUp, wdt, g0 + i);
    u += xv * ldf(gateUp, wdt, u0 + i);
  }
  g = warpSum(g);
  u = warpSum(u);
  if (lane == 0) {
    g = bfr(g, bfa);
    h[(size_t)rk * inter + j] = bfr(bfr(g / (1.f + expf(-g)), bfa) * bfr(u, bfa), bfa);
  }
}

// out[r, o] = sum_k w[r,k] * down_e[o] . h[(r,k)]; one warp per o.
__global__ void k_moe_down(const float* h, const int* topIds, const float* topW, const void* down, int wdt, float* out,
                           int hidden, int inter, int K, int rowBase, int bfa) {
  PDL_ENTER();
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int o = blockIdx.x * 4 + warp;
  int rl = blockIdx.y, r = rowBase + rl;
  if (o >= hidden) return;
  const int* ids = topIds + (size_t)r * K;
  auto expertDot = [&](int k) {
    size_t e = (size_t)ids[k];
    const float* hr = h + ((size_t)rl * K + k) * inter;
    size_t d0 = (e * hidden + o) * inter;
    float a = 0.f;
    for (int i = lane; i < inter; i += 32) a += hr[i] * ldf(down, wdt, d0 + i);
    return warpSum(a);
  };
  float tot = 0.f;
  if (!bfa) {
    for (int k = 0; k < K; k++) tot += topW[(size_t)r * K + k] * expertDot(k);
  } else {
    // transformers adds each expert's weighted output into a bf16 sum, in ascending expert id.
    int last = -1;
    for (int t = 0; t < K; t++) {
      int kb = -1;
      for (int k = 0; k < K; k++)
        if (ids[k] > last && (kb < 0 || ids[k] < ids[kb])) kb = k;
      if (kb < 0) break;
      last = ids[kb];
      tot = rbf(tot + rbf(rbf(expertDot(kb)) * topW[(size_t)r * K + kb]));
    }
  }
  if (lane == 0) out[(size_t)r * hidden + o] = tot;
}

int opMoeMlp(NervaExec* ex, Args& A) {
  Buf x = buf(A), ids = buf(A), tw = buf(A), gu = buf(A), down = buf(A), out = buf(A);
  int rows = A.num(), hidden = A.num(), inter = A.num(), K = A.num();
  if (!A.ok) return bad(ex, "moe_mlp: argument count");
  if (gu.dt != down.dt) return bad(ex, "moe_mlp: gateUp and down dtypes differ");
  if (rows <= 0) return NERVA_OK;
  size_t perRow = (size_t)K * inter * sizeof(float);
  int rowChunk = (int)std::min<size_t>((size_t)rows, ex->wsBytes / perRow);
  if (rowChunk < 1) return bad(ex, "moe_mlp: workspace too small");
  rowChunk = std::min(rowChunk, 65535 / std::max(1, K));
  float* h = (float*)ex->ws;
  for (int r0 = 0; r0 < rows; r0 += rowChunk) {
    int nr = std::min(rowChunk, rows - r0);
    LAUNCH(k_moe_gate_up, dim3((inter + 3) / 4, nr * K), 128, 0, (const float*)x.p, (const int*)ids.p, gu.p, gu.dt, h,
           hidden, inter, K, r0, ex->bf16act ? 1 : 0);
    LAUNCH(k_moe_down, dim3((hidden + 3) / 4, nr), 128, 0, h, (const int*)ids.p, (const float*)tw.p, down.p, down.dt,
           (float*)out.p, hidden, inter, K, r0, ex->bf16act ? 1 : 0);
  }
  return NERVA_OK;
}

int opMoeRoute(NervaExec* ex, Args& A) {
  Buf logits = buf(A), ids = buf(A), tw = buf(A);
  int rows = A.num(), E = A.num(), K = A.num(), norm = A.num();
  if (!A.ok) return bad(ex, "moe_route: argument count");
  if (K > 32 || K > E) return bad(ex, "moe_route: topK must be <= 32 and <= numExperts");
  if ((size_t)E * 4 * sizeof(float) > 48 * 1024) return bad(ex, "moe_route: too many experts (max 3072)");
  if (rows <= 0) return NERVA_OK;
  LAUNCH(k_moe_route, (rows + 3) / 4, 128, (size_t)E * 4 * sizeof(float), (const float*)logits.p, (int*)ids.p,
         (float*)tw.p, rows, E, K, norm, ex->bf16act ? 1 : 0);
  return NERVA_OK;
}

}  // namespace nerva::ops
