// The quantized GEMVs' shared epilogue (k_qgemv and k_q4k_mma): once every warp has stored its
// partial sums, output j of the block sums them over the KS warps, then bias, GLU, accumulate and
// bf16 numerics' rounding (k_gemv_generic's order). GLU: slot 2j holds the gate's partial, 2j + 1
// the up row's. Output o lands at out[r * ldo + oOff + o]. pre.has: thread j's first output
// accumulates into pre.v, the value its kernel read before the dependency wait (qgemvPre).
#pragma once
#include "common/elem.cuh"

namespace nerva::ops {

// Fuse::accPre: `out` was last written two or more kernels back, so a kernel may read the values
// its epilogue accumulates into before its dependency wait: thread j's first output (j < n).
struct QPre {
  bool has;
  float v;
};
__device__ __forceinline__ QPre qgemvPre(bool on, int n, const float* out, int r, int ldo, int oOff, int o0) {
  const bool has = on && (int)threadIdx.x < n;
  return {has, has ? __ldcg(out + (size_t)r * ldo + oOff + o0 + threadIdx.x) : 0.f};
}

// QUAD: each partial is four floats (a quad's lanes), added as (a + b) + (c + d), the order of
// the xor-1 then xor-2 shuffles that summed them before.
template <bool GLU, bool QUAD = false>
__device__ __forceinline__ void qgemvEpilogue(const float* part, int ks, int stride, int n, int o0, const void* bias, int bdt,
                                              int acc, int bfa, float* out, int r, int ldo, int oOff,
                                              QPre pre = {false, 0.f}) {
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const int o = o0 + j;
    auto at = [&](int i) {
      if (!QUAD) return part[i];
      const float4 q = reinterpret_cast<const float4*>(part)[i];
      return (q.x + q.y) + (q.z + q.w);
    };
    float g = 0.f, u = 0.f;
    for (int k = 0; k < ks; k++) {
      g += at(k * stride + (GLU ? 2 * j : j));
      if (GLU) u += at(k * stride + 2 * j + 1);
    }
    float yv = bfr(g + (bias ? ldf(bias, bdt, oOff + o) : 0.f), bfa);
    if (GLU) yv = bfr(bfr(yv / (1.f + expf(-yv)), bfa) * bfr(u, bfa), bfa);
    float* dst = out + (size_t)r * ldo + oOff + o;
    *dst = acc ? bfr((pre.has && j == (int)threadIdx.x ? pre.v : *dst) + yv, bfa) : yv;
  }
}

}  // namespace nerva::ops
