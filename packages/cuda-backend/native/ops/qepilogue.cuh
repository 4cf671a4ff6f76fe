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
// (tid: the thread within the block, or within the group of warps that runs the epilogue.)
__device__ __forceinline__ QPre qgemvPre(bool on, int n, const float* out, int r, int ldo, int oOff, int o0, unsigned tid) {
  const bool has = on && (int)tid < n;
  return {has, has ? __ldcg(out + (size_t)r * ldo + oOff + o0 + tid) : 0.f};
}
__device__ __forceinline__ QPre qgemvPre(bool on, int n, const float* out, int r, int ldo, int oOff, int o0) {
  return qgemvPre(on, n, out, r, ldo, oOff, o0, threadIdx.x);
}

// (tid, nthreads: the thread and the threads of the block, or of the group of warps whose partial
// sums these are.)
template <bool GLU>
__device__ __forceinline__ void qgemvEpilogue(const float* part, int ks, int stride, int n, int o0, const void* bias, int bdt,
                                              int acc, int bfa, float* out, int r, int ldo, int oOff, QPre pre, unsigned tid,
                                              unsigned nthreads) {
  for (int j = tid; j < n; j += nthreads) {
    const int o = o0 + j;
    float g = 0.f, u = 0.f;
    for (int k = 0; k < ks; k++) {
      g += part[k * stride + (GLU ? 2 * j : j)];
      if (GLU) u += part[k * stride + 2 * j + 1];
    }
    float yv = bfr(g + (bias ? ldf(bias, bdt, oOff + o) : 0.f), bfa);
    if (GLU) yv = bfr(bfr(yv / (1.f + expf(-yv)), bfa) * bfr(u, bfa), bfa);
    float* dst = out + (size_t)r * ldo + oOff + o;
    *dst = acc ? bfr((pre.has && j == (int)tid ? pre.v : *dst) + yv, bfa) : yv;
  }
}
template <bool GLU>
__device__ __forceinline__ void qgemvEpilogue(const float* part, int ks, int stride, int n, int o0, const void* bias, int bdt,
                                              int acc, int bfa, float* out, int r, int ldo, int oOff,
                                              QPre pre = {false, 0.f}) {
  qgemvEpilogue<GLU>(part, ks, stride, n, o0, bias, bdt, acc, bfa, out, r, ldo, oOff, pre, threadIdx.x, blockDim.x);
}

}  // namespace nerva::ops
