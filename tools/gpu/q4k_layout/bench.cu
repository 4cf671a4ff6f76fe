// Q4_K decode GEMV: GGUF layout against an item-contiguous repacked layout (timing only).
#include "k.cuh"
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>
using namespace nerva::ops;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)

struct Shape { const char* name; int outDim, inDim; bool glu, norm, acc; };

template <bool GLU, bool ONE, int RP>
float timeIt(const Shape& s, bool hot, uint8_t* pool, size_t poolBytes, float* x, float* out, float* nw, int sm, int optin, double* gbs) {
  const int sbs = s.inDim / 256;
  int ks = std::min(sbs, 16);
  if (sbs > 16) for (int d = 16; d >= 8; d--) if (sbs % d == 0) { ks = d; break; }
  const long long groups = ((long long)s.outDim * (GLU ? 2 : 1) + 15) / 16;
  long long gpb = std::max<long long>(1, (groups + sm - 1) / sm);
  if (gpb > 16) gpb = (groups + sm * ((gpb + 15) / 16) - 1) / (sm * ((gpb + 15) / 16));
  const int per = (int)std::min<long long>(s.outDim, gpb * (GLU ? 8 : 16));
  const size_t chunks = (size_t)(s.outDim + per - 1) / per;
  const int stride = per * (GLU ? 2 : 1);
  const size_t smem = (((size_t)ks * stride * 4 + 15) & ~(size_t)15) + (size_t)sbs * (XT_SB + 9 * 4) + (RP == 2 ? 128 + (size_t)ks * NS * (2304 + 8) : 0);
  auto fn = k_q4k_mma<GLU, ONE, RP>;
  CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const size_t bytes = (size_t)s.outDim * (GLU ? 2 : 1) * sbs * 144;
  const size_t rpBytes = chunks * ((stride + 15) / 16) * sbs * 2304;
  const size_t span = ((std::max(bytes, rpBytes) + 4095) / 4096) * 4096;
  const int copies = hot ? 1 : (int)(poolBytes / span);
  const int N = 60;
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  auto launch = [&](int i) {
    fn<<<(unsigned)chunks, 32 * ks, smem>>>(x, pool + (size_t)(i % copies) * span, out, 1, s.inDim, s.outDim, per, nullptr, 0, s.acc ? 1 : 0, 0,
                                            s.outDim, 0, s.norm ? (const void*)nw : nullptr, 0, 1e-6f, nullptr, 0);
  };
  for (int i = 0; i < 5; i++) launch(i);
  CK(cudaDeviceSynchronize());
  float best = 1e30f;
  for (int rep = 0; rep < 3; rep++) {
    cudaEventRecord(a);
    for (int i = 0; i < N; i++) launch(i);
    cudaEventRecord(b);
    CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b);
    best = std::min(best, ms * 1000.f / N);
  }
  *gbs = bytes / (best * 1e-6) / 1e9;
  printf("{\"shape\":\"%s%s\",\"layout\":\"%s\",\"us\":%.2f,\"gbs\":%.1f,\"blocks\":%zu,\"warps\":%d,\"per\":%d,\"copies\":%d}\n", s.name, hot ? "_l2hot" : "",
         RP == 2 ? "ring" : RP ? "repacked" : "gguf", best, *gbs, chunks, ks, per, copies);
  return best;
}

template <bool GLU, bool ONE>
void both(const Shape& s, uint8_t* pool, size_t pb, float* x, float* out, float* nw, int sm, int optin, double copy) {
  double g0, g1, g2;
  timeIt<GLU, ONE, 0>(s, false, pool, pb, x, out, nw, sm, optin, &g0);
  timeIt<GLU, ONE, 1>(s, false, pool, pb, x, out, nw, sm, optin, &g1);
  timeIt<GLU, ONE, 2>(s, false, pool, pb, x, out, nw, sm, optin, &g2);
  printf("{\"shape\":\"%s\",\"gguf_frac\":%.3f,\"repacked_frac\":%.3f,\"ring_frac\":%.3f}\n", s.name, g0 / copy, g1 / copy, g2 / copy);
  if (s.outDim * (GLU ? 2 : 1) * (size_t)s.inDim / 256 * 144 < (24u << 20)) {
    timeIt<GLU, ONE, 0>(s, true, pool, pb, x, out, nw, sm, optin, &g0);
    timeIt<GLU, ONE, 2>(s, true, pool, pb, x, out, nw, sm, optin, &g1);
  }
}

int main() {
  int dev = 0, sm = 0, optin = 0;
  CK(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const size_t poolBytes = (size_t)1 << 30;
  uint8_t* pool; CK(cudaMalloc(&pool, poolBytes));
  // Random bytes, but every head's d/dmin a small finite half (0x2000 ~ 2^-7): finite results.
  std::vector<uint8_t> h(poolBytes);
  uint32_t st = 12345;
  for (size_t i = 0; i < poolBytes; i++) { st = st * 1664525u + 1013904223u; h[i] = (uint8_t)(st >> 24); }
  CK(cudaMemcpy(pool, h.data(), poolBytes, cudaMemcpyHostToDevice));
  float *x, *out, *nw;
  CK(cudaMalloc(&x, 16384 * 4)); CK(cudaMalloc(&out, 32768 * 4)); CK(cudaMalloc(&nw, 16384 * 4));
  std::vector<float> hx(16384);
  for (int i = 0; i < 16384; i++) hx[i] = 0.01f * ((i * 37) % 101 - 50);
  CK(cudaMemcpy(x, hx.data(), 16384 * 4, cudaMemcpyHostToDevice));
  for (int i = 0; i < 16384; i++) hx[i] = 1.f;
  CK(cudaMemcpy(nw, hx.data(), 16384 * 4, cudaMemcpyHostToDevice));
  // Copy bandwidth: device-to-device copy of 256 MiB (read + written bytes over time, as readbw's copy).
  uint8_t* c2; CK(cudaMalloc(&c2, (size_t)256 << 20));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  float best = 1e30f;
  for (int i = 0; i < 10; i++) {
    cudaEventRecord(a); CK(cudaMemcpyAsync(c2, pool + (i % 3) * ((size_t)256 << 20), (size_t)256 << 20, cudaMemcpyDeviceToDevice)); cudaEventRecord(b);
    CK(cudaEventSynchronize(b)); float ms; cudaEventElapsedTime(&ms, a, b); best = std::min(best, ms);
  }
  const double copy = 2.0 * ((size_t)256 << 20) / (best * 1e-3) / 1e9;
  printf("{\"copy_gbs\":%.1f,\"sms\":%d}\n", copy, sm);
  Shape S[] = {{"8b_gate_up", 12288, 4096, true, true, false}, {"8b_down", 4096, 12288, false, false, true},
               {"8b_qk", 5120, 4096, false, true, false}, {"8b_o", 4096, 4096, false, false, true},
               {"0.6b_gate_up", 3072, 1024, true, true, false}, {"0.6b_down", 1024, 3072, false, false, true}};
  both<true, true>(S[0], pool, poolBytes, x, out, nw, sm, optin, copy);
  both<false, false>(S[1], pool, poolBytes, x, out, nw, sm, optin, copy);
  both<false, true>(S[2], pool, poolBytes, x, out, nw, sm, optin, copy);
  both<false, true>(S[3], pool, poolBytes, x, out, nw, sm, optin, copy);
  both<true, true>(S[4], pool, poolBytes, x, out, nw, sm, optin, copy);
  both<false, true>(S[5], pool, poolBytes, x, out, nw, sm, optin, copy);
  return 0;
}
