// Attention under bf16 numerics (transformers' eager bf16 path).
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/attention/attn_common.cuh"
#include "ops/ops.h"

namespace nerva::ops {

// bf16 numerics: attention as transformers' eager path computes it on bf16 tensors. The score
// matmul and the scaled score are rounded, the softmax is float32, the probabilities are
// rounded before they weight the values, and the output is rounded. A probability needs the
// row's final max and sum, so one block per (head, row) makes two passes over the keys: the max
// and sum of exponentials (online within each warp), then each score again to weight the values.
// Each warp has EAGER_KB keys (and values) in flight, so a pass pays one memory round trip per
// EAGER_WARPS * EAGER_KB keys.
constexpr int EAGER_WARPS = 16;
constexpr int EAGER_KB = 4;
template <typename KT>
__global__ void __launch_bounds__(32 * EAGER_WARPS) k_attn_eager(const float* q, const KT* kc, const KT* vc, const int* bt,
                                                                 const int* rowSeq, const int* positions, float* out,
                                                                 int H, int KVH, int hd, int bs, int mbps, int qStride,
                                                                 int qOff, float scale, int rowBase, int window) {
  PDL_ENTER();
  __shared__ float wm[EAGER_WARPS], wl[EAGER_WARPS];
  __shared__ float part[EAGER_WARPS][32 * ATT_MAX_EPL];
  int h = blockIdx.x, r = rowBase + blockIdx.y;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = positions[r] + 1;
  int lo = window > 0 ? max(0, n - window) : 0;  // a sliding window's first key
  const int* tb = bt + (size_t)rowSeq[r] * mbps;
  size_t width = (size_t)KVH * hd, head = (size_t)(h / (H / KVH)) * hd;
  const float* qr = q + (size_t)r * qStride + qOff + (size_t)h * hd;
  float qv[ATT_MAX_EPL];
#pragma unroll
  for (int e = 0; e < ATT_MAX_EPL; e++) qv[e] = lane + 32 * e < hd ? qr[lane + 32 * e] : 0.f;
  constexpr int STEP = EAGER_WARPS * EAGER_KB;
  // Keys p0 + b * EAGER_WARPS (b < EAGER_KB): their rows, and the rounded scaled scores.
  auto scores = [&](int p0, size_t* base, bool* ok, float* sc, float (*vv)[ATT_MAX_EPL]) {
    float kv[EAGER_KB][ATT_MAX_EPL];
#pragma unroll
    for (int b = 0; b < EAGER_KB; b++) {
      int p = p0 + b * EAGER_WARPS;
      ok[b] = p < n;
      base[b] = ok[b] ? ((size_t)tb[p / bs] * bs + p % bs) * width + head : 0;
#pragma unroll
      for (int e = 0; e < ATT_MAX_EPL; e++) {
        bool in = ok[b] && lane + 32 * e < hd;
        kv[b][e] = in ? ldk<KT>(kc, base[b] + lane + 32 * e) : 0.f;
        if (vv) vv[b][e] = in ? ldk<KT>(vc, base[b] + lane + 32 * e) : 0.f;
      }
    }
#pragma unroll
    for (int b = 0; b < EAGER_KB; b++) {
      float d = 0.f;
#pragma unroll
      for (int e = 0; e < ATT_MAX_EPL; e++) d += qv[e] * kv[b][e];
      sc[b] = d;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int b = 0; b < EAGER_KB; b++) sc[b] += __shfl_xor_sync(0xffffffffu, sc[b], o);
#pragma unroll
    for (int b = 0; b < EAGER_KB; b++) sc[b] = rbf(rbf(sc[b]) * scale);
  };
  float m = -INFINITY, l = 0.f;
  for (int p0 = lo + warp; p0 < n; p0 += STEP) {
    size_t base[EAGER_KB];
    bool ok[EAGER_KB];
    float sc[EAGER_KB];
    scores(p0, base, ok, sc, nullptr);
#pragma unroll
    for (int b = 0; b < EAGER_KB; b++) {
      if (!ok[b]) continue;
      if (sc[b] > m) {
        l = l * expf(m - sc[b]) + 1.f;
        m = sc[b];
      } else {
        l += expf(sc[b] - m);
      }
    }
  }
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
  __syncthreads();
  float M = -INFINITY, L = 0.f;
  for (int w = 0; w < EAGER_WARPS; w++) M = fmaxf(M, wm[w]);
  for (int w = 0; w < EAGER_WARPS; w++)
    if (wl[w] > 0.f) L += wl[w] * expf(wm[w] - M);
  float a[ATT_MAX_EPL];
#pragma unroll
  for (int e = 0; e < ATT_MAX_EPL; e++) a[e] = 0.f;
  for (int p0 = lo + warp; p0 < n; p0 += STEP) {
    size_t base[EAGER_KB];
    bool ok[EAGER_KB];
    float sc[EAGER_KB], vv[EAGER_KB][ATT_MAX_EPL];
    scores(p0, base, ok, sc, vv);
#pragma unroll
    for (int b = 0; b < EAGER_KB; b++) {
      float pr = ok[b] ? rbf(expf(sc[b] - M) / L) : 0.f;
#pragma unroll
      for (int e = 0; e < ATT_MAX_EPL; e++) a[e] += pr * vv[b][e];
    }
  }
#pragma unroll
  for (int e = 0; e < ATT_MAX_EPL; e++)
    if (lane + 32 * e < hd) part[warp][lane + 32 * e] = a[e];
  __syncthreads();
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float t = 0.f;
    for (int w = 0; w < EAGER_WARPS; w++) t += part[w][i];
    out[(size_t)r * H * hd + (size_t)h * hd + i] = rbf(t);
  }
}


int attnEager(NervaExec* ex, const float* qPtr, Buf kc, Buf vc, float* outPtr, Buf bt, Buf rowSeq, Buf pos, int rows, int H,
              int KVH, int hd, int bs, int mbps, int qStride, int qOff, float scale, int window) {
  for (int r0 = 0; r0 < rows; r0 += 65535) {
    dim3 grid((unsigned)H, (unsigned)std::min(65535, rows - r0));
    const int *btp = (const int*)bt.p, *rsp = (const int*)rowSeq.p, *pp = (const int*)pos.p;
    switch (kc.dt) {
      case NV_F32:
        LAUNCH(k_attn_eager<float>, grid, 32 * EAGER_WARPS, 0, qPtr, (const float*)kc.p, (const float*)vc.p, btp, rsp, pp,
               outPtr, H, KVH, hd, bs, mbps, qStride, qOff, scale, r0, window);
        break;
      case NV_BF16:
        LAUNCH(k_attn_eager<uint16_t>, grid, 32 * EAGER_WARPS, 0, qPtr, (const uint16_t*)kc.p, (const uint16_t*)vc.p, btp,
               rsp, pp, outPtr, H, KVH, hd, bs, mbps, qStride, qOff, scale, r0, window);
        break;
      case NV_F16:
        LAUNCH(k_attn_eager<__half>, grid, 32 * EAGER_WARPS, 0, qPtr, (const __half*)kc.p, (const __half*)vc.p, btp, rsp, pp,
               outPtr, H, KVH, hd, bs, mbps, qStride, qOff, scale, r0, window);
        break;
      default: return bad(ex, "attention: unsupported cache dtype");
    }
  }
  return NERVA_OK;
}

}  // namespace nerva::ops
