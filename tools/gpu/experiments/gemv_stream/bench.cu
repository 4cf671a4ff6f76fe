// gate_up and the other batch-1 bf16 GEMV shapes, alone: the engine's k_gemv_bf16 against forms
// of the same per-output arithmetic (same bits) that stream differently:
//   PERSIST: one wave of blocks, each staging the norm once and taking 16-output tiles
//            blockIdx.x, + gridDim.x, ...; PREF: each warp's next group of weight chunks
//            (across outputs) in flight while it multiplies the current one; P: chunks of a
//            weight row in flight a lane.
// Weights rotate over copies totalling >= 1 GiB (every launch reads memory, not L2); a CUDA graph
// of launches timed by events; copy bandwidth measured in the same process.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>
#include "common/elem.cuh"
#include "ops/ops.h"

namespace nerva::ops {
#include "gemv_part.cuh"
}
using namespace nerva::ops;
using namespace nerva;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

template <int P, bool NORM, bool GLU, bool PERSIST, bool PREF>
__global__ void __launch_bounds__(512, 1) kStream(const float* __restrict__ x, const uint16_t* __restrict__ w, float* __restrict__ out,
                                                  int inDim, int outDim, const float* __restrict__ nw, float eps) {
  constexpr int NO = GLU ? 2 : 1;
  constexpr int NW = 16;
  __shared__ float ssw[NW];
  __shared__ float invs;
  extern __shared__ float4 xs[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n8 = inDim >> 3, n4 = inDim >> 2;
  const int G = (n8 + P * 32 - 1) / (P * 32);
  const int tiles = (outDim + NW - 1) / NW;
  auto outputOf = [&](int i) -> int {  // the warp's i-th output (outDim or more: none)
    const int tile = PERSIST ? blockIdx.x + i * gridDim.x : (i == 0 ? blockIdx.x : tiles);
    return tile < tiles ? tile * NW + warp : outDim;
  };
  auto load = [&](uint4 (&q)[P][NO], int o, int g) {
    const uint4* w0 = reinterpret_cast<const uint4*>(w + (size_t)o * inDim);
    const uint4* w1 = reinterpret_cast<const uint4*>(w + (size_t)(o + outDim) * inDim);
#pragma unroll
    for (int u = 0; u < P; u++) {
      const int k = g * P * 32 + u * 32 + lane;
      if (k < n8) {
        q[u][0] = __ldcs(w0 + k);
        if (GLU) q[u][NO - 1] = __ldcs(w1 + k);
      }
    }
  };
  float acc[NO];
#pragma unroll
  for (int n = 0; n < NO; n++) acc[n] = 0.f;
  auto fma = [&](const uint4 (&q)[P][NO], int g) {
#pragma unroll
    for (int u = 0; u < P; u++) {
      const int k8 = g * P * 32 + u * 32 + lane;
      if (k8 < n8) {
        float4 a, b;
        if (NORM) {
          a = xs[k8];
          b = xs[n8 + k8];
        } else {
          const float4* xr = reinterpret_cast<const float4*>(x) + k8 * 2;
          a = __ldg(xr);
          b = __ldg(xr + 1);
        }
        float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int n = 0; n < NO; n++) acc[n] += dot8bf16(q[u][n], xv);
      }
    }
  };
  auto finish = [&](int o) {
    const float v0 = warpSum(acc[0]);
    const float v1 = GLU ? warpSum(acc[NO - 1]) : 0.f;
    if (lane == 0) {
      float y = v0 + 0.f;
      if (GLU) y = (y / (1.f + expf(-y))) * v1;
      out[o] = y;
    }
#pragma unroll
    for (int n = 0; n < NO; n++) acc[n] = 0.f;
  };
  uint4 qa[P][NO], qb[P][NO];
  int o = outputOf(0);
  // A warp without outputs still joins the norm's barriers.
  if (o < outDim) load(qa, o, 0);
  if (NORM) {
    float ss = 0.f;
    for (int j = threadIdx.x; j < n4; j += blockDim.x) {
      float4 v = reinterpret_cast<const float4*>(x)[j];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      xs[(j & 1) * n8 + (j >> 1)] = v;
    }
    ss = warpSum(ss);
    if (lane == 0) ssw[warp] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = 0.f;
      for (int j = 0; j < NW; j++) t += ssw[j];
      invs = rsqrtf(t / (float)inDim + eps);
    }
    __syncthreads();
    const float inv = invs;
    for (int j = threadIdx.x; j < n4; j += blockDim.x) normScale4g(xs[(j & 1) * n8 + (j >> 1)], inv, loadNw4(nw, 0, j), 0);
    __syncthreads();
  }
  if (o >= outDim) return;
  if constexpr (!PREF) {
    for (int i = 0; o < outDim; o = outputOf(++i)) {
      for (int g = 0; g < G; g++) {
        if (i > 0 || g > 0) load(qa, o, g);
        fma(qa, g);
      }
      finish(o);
    }
  } else {
    int i = 0, g = 0;
    // step: multiply cur (output o, group g) while the next position's group loads into nxt.
    auto step = [&](uint4 (&cur)[P][NO], uint4 (&nxt)[P][NO]) -> bool {
      int g2 = g + 1, i2 = i, o2 = o;
      if (g2 == G) { g2 = 0; i2++; o2 = outputOf(i2); }
      const bool more = o2 < outDim;
      if (more) load(nxt, o2, g2);
      fma(cur, g);
      if (g == G - 1) finish(o);
      i = i2; g = g2; o = o2;
      return more;
    };
    while (step(qa, qb) && step(qb, qa)) {
    }
  }
}

struct Shape { const char* name; int inDim, outDim; bool norm, glu; };

static float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t f2bfh(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16); }

int main(int argc, char** argv) {
  int dev = 0, sms = 0;
  CK(cudaSetDevice(dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // Copy bandwidth, as measureCopyBandwidth: 2 x bytes a copy over its time.
  double copyGBs = 0;
  {
    size_t n = 1ull << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemsetAsync(a, 1, n, st));
    for (int rep = 0; rep < 3; rep++) {
      CK(cudaEventRecord(e0, st));
      for (int i = 0; i < 10; i++) CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      copyGBs = std::max(copyGBs, 2.0 * n * 10 / (ms / 1e3) / 1e9);
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
  }
  printf("{\"probe\":\"copy\",\"GBs\":%.1f,\"sms\":%d}\n", copyGBs, sms);
  const Shape shapes[] = {
      {"8b_gate_up", 4096, 12288, true, true}, {"8b_qkv", 4096, 6144, true, false},   {"8b_down", 12288, 4096, false, false},
      {"8b_lm_head", 4096, 151936, true, false}, {"06b_gate_up", 1024, 3072, true, true}, {"06b_qkv", 1024, 4096, true, false},
      {"06b_lm_head", 1024, 151936, true, false},
  };
  srand(7);
  for (const Shape& s : shapes) {
    const size_t welems = (size_t)(s.glu ? 2 : 1) * s.outDim * s.inDim, wbytes = welems * 2;
    const int copies = (int)std::max<size_t>(1, ((1ull << 30) + wbytes - 1) / wbytes);
    std::vector<uint16_t> hw(welems);
    for (size_t i = 0; i < welems; i++) hw[i] = f2bfh(((rand() & 0xffff) / 65536.f - 0.5f) * 0.05f);
    std::vector<uint16_t*> dw(copies);
    for (int c = 0; c < copies; c++) {
      CK(cudaMalloc(&dw[c], wbytes));
      CK(cudaMemcpy(dw[c], hw.data(), wbytes, cudaMemcpyHostToDevice));
    }
    std::vector<float> hx(s.inDim), hn(s.inDim);
    for (int i = 0; i < s.inDim; i++) { hx[i] = (rand() & 0xffff) / 32768.f - 1.f; hn[i] = 0.5f + (rand() & 0xff) / 256.f; }
    float *dx, *dn, *dout;
    CK(cudaMalloc(&dx, s.inDim * 4));
    CK(cudaMalloc(&dn, s.inDim * 4));
    CK(cudaMalloc(&dout, (size_t)s.outDim * 4));
    CK(cudaMemcpy(dx, hx.data(), s.inDim * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dn, hn.data(), s.inDim * 4, cudaMemcpyHostToDevice));
    const size_t smem = s.norm ? (size_t)s.inDim * 4 : 0;
    std::vector<float> ref(s.outDim), got(s.outDim);
    // A variant: launch(c) on copy c.
    auto timeIt = [&](const char* tag, auto launch) {
      CK(cudaMemsetAsync(dout, 0, (size_t)s.outDim * 4, st));
      launch(0);
      CK(cudaStreamSynchronize(st));
      CK(cudaGetLastError());
      CK(cudaMemcpy(got.data(), dout, (size_t)s.outDim * 4, cudaMemcpyDeviceToHost));
      const bool isRef = !strcmp(tag, "engine");
      if (isRef) ref = got;
      const bool same = !memcmp(ref.data(), got.data(), (size_t)s.outDim * 4);
      const int L = std::max(copies * ((40 + copies - 1) / copies), copies);
      cudaGraph_t gr;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < L; i++) launch(i % copies);
      CK(cudaStreamEndCapture(st, &gr));
      CK(cudaGraphInstantiate(&ge, gr, 0));
      float best = 1e30f;
      for (int rep = 0; rep < 4; rep++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep > 0) best = std::min(best, ms);
      }
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(gr));
      const double us = best * 1e3 / L, gbs = wbytes / (us * 1e-6) / 1e9;
      printf("{\"probe\":\"gemv_stream\",\"shape\":\"%s\",\"variant\":\"%s\",\"us\":%.2f,\"GBs\":%.1f,\"fraction_of_copy\":%.3f,\"same_bits\":%s,\"launches\":%d}\n",
             s.name, tag, us, gbs, gbs / copyGBs, same ? "true" : "false", L);
      fflush(stdout);
    };
    const unsigned grid16 = (unsigned)((s.outDim + 15) / 16);
#define ENGINE(N_, G_)                                                                                              \
  timeIt("engine", [&](int c) {                                                                                     \
    k_gemv_bf16<1, 1, N_, G_, 1><<<grid16, 512, smem, st>>>(dx, dw[c], dout, 1, s.inDim, s.outDim, nullptr, 0, dn, 0, \
                                                            1e-6f, 0, 0, 0, 0);                                      \
  })
#define VAR(TAG, P_, N_, G_, PS_, PF_)                                                                                 \
  do {                                                                                                                \
    auto kf = kStream<P_, N_, G_, PS_, PF_>;                                                                          \
    int occ = 0;                                                                                                      \
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kf, 512, smem));                                           \
    const unsigned gr = PS_ ? std::min<unsigned>(grid16, (unsigned)(occ * sms)) : grid16;                             \
    timeIt(TAG, [&](int c) { kf<<<gr, 512, smem, st>>>(dx, dw[c], dout, s.inDim, s.outDim, dn, 1e-6f); });          \
  } while (0)
#define ALL(N_, G_)                                          \
  ENGINE(N_, G_);                                            \
  VAR("mine_p4", 4, N_, G_, false, false);                   \
  VAR("p8", 8, N_, G_, false, false);                        \
  VAR("p4_pref", 4, N_, G_, false, true);                    \
  VAR("persist_p4", 4, N_, G_, true, false);                 \
  VAR("persist_p4_pref", 4, N_, G_, true, true);             \
  VAR("persist_p2_pref", 2, N_, G_, true, true);             \
  VAR("persist_p8", 8, N_, G_, true, false);
    if (s.norm && s.glu) { ALL(true, true); }
    else if (s.norm) { ALL(true, false); }
    else { ALL(false, false); }
    for (auto p : dw) CK(cudaFree(p));
    CK(cudaFree(dx));
    CK(cudaFree(dn));
    CK(cudaFree(dout));
  }
  return 0;
}
