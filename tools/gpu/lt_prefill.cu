// Phase `ltprefill`: whether a prompt's matmuls have a faster cuBLAS kernel than the one cuBLAS's
// own heuristic runs, with the same bits. For each Qwen3-0.6B and Qwen3-8B prefill weight shape
// (m outputs, k inputs, n prompt rows: W bf16 [m, k] as A with op T, x bf16 [n, k], out f32
// [n, m], beta 1 where the engine adds into the residual stream) it times cublasGemmEx with
// CUBLAS_GEMM_DEFAULT (what op matmul calls) and every cuBLASLt offer of the heuristic for that
// shape (up to 32), and says whether each offer's output equals cublasGemmEx's bit for bit (over
// the whole output, on the device). One JSON line per candidate -> stdout.
#include <cublasLt.h>
#include "lt_probe.h"
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>


struct Shape {
  const char* name;
  int m, k, n;
  bool accumulate;
};

static const Shape kShapes[] = {
    {"8B qkv", 6144, 4096, 4096, false},    {"8B o", 4096, 4096, 4096, true},
    {"8B gate_up", 24576, 4096, 4096, false}, {"8B down", 4096, 12288, 4096, true},
    {"0.6B qkv", 4096, 1024, 4096, false},  {"0.6B o", 1024, 2048, 4096, true},
    {"0.6B gate_up", 6144, 1024, 4096, false}, {"0.6B down", 1024, 3072, 4096, true},
};
constexpr size_t kWs = 32ull << 20;  // the context's cuBLAS workspace

__global__ void k_fill(uint16_t* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    const float f = ((float)(h & 0xffffff) / 16777216.f - 0.5f) * scale;
    uint32_t u;
    memcpy(&u, &f, 4);
    p[i] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  }
}

__global__ void k_diff(const uint32_t* a, const uint32_t* b, size_t n, unsigned long long* count) {
  unsigned long long c = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) c += a[i] != b[i];
  if (c) atomicAdd(count, c);
}


template <typename F>
static float timeIt(cudaStream_t st, F call) {
  for (int r = 0; r < 3; r++) CK(call());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int reps = 20;
  CK(cudaEventRecord(e0, st));
  for (int r = 0; r < reps; r++) CK(call());
  CK(cudaEventRecord(e1, st));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms / reps;
}

int main() {
  CK(cudaSetDevice(0));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cublasLtHandle_t lt;
  cublasHandle_t blas;
  CK(cublasLtCreate(&lt));
  CK(cublasCreate(&blas));
  CK(cublasSetStream(blas, st));
  void* ws;
  CK(cudaMalloc(&ws, kWs));
  CK(cublasSetWorkspace(blas, ws, kWs));
  unsigned long long* dcount;
  CK(cudaMalloc(&dcount, sizeof *dcount));
  for (const Shape& s : kShapes) {
    uint16_t *w, *x;
    float *out, *ref;
    const size_t outN = (size_t)s.n * s.m;
    CK(cudaMalloc(&w, (size_t)s.m * s.k * 2));
    CK(cudaMalloc(&x, (size_t)s.n * s.k * 2));
    CK(cudaMalloc(&out, outN * 4));
    CK(cudaMalloc(&ref, outN * 4));
    k_fill<<<1024, 256, 0, st>>>(w, (size_t)s.m * s.k, 11u, 0.05f);
    k_fill<<<1024, 256, 0, st>>>(x, (size_t)s.n * s.k, 29u, 2.f);
    const float one = 1.f, zero = 0.f;
    const float* beta = s.accumulate ? &one : &zero;
    auto gemmEx = [&](float* o, const float* b) {
      return cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, s.m, s.n, s.k, &one, w, CUDA_R_16BF, s.k, x, CUDA_R_16BF, s.k, b, o,
                          CUDA_R_32F, s.m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    CK(gemmEx(ref, &zero));
    const double flops = 2.0 * s.m * s.n * s.k;
    const float msEx = timeIt(st, [&] { return gemmEx(out, beta); });
    printf("{\"shape\":\"%s\",\"m\":%d,\"k\":%d,\"n\":%d,\"from\":\"cublasGemmEx\",\"ms\":%.4f,\"tflops\":%.1f}\n", s.name, s.m, s.k,
           s.n, msEx, flops / msEx / 1e9);
    fflush(stdout);

    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN));
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.m, s.k));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, s.n, s.k));
    CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, s.m, s.n, s.m));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsMax = kWs;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsMax, sizeof wsMax));
    cublasLtMatmulHeuristicResult_t res[32];
    int got = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 32, res, &got));
    for (int i = 0; i < got; i++) {
      if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
      const cublasLtMatmulAlgo_t& a = res[i].algo;
      auto call = [&](float* o, const float* b) {
        return cublasLtMatmul(lt, desc, &one, w, la, x, lb, b, o, lc, o, lc, &a, ws, res[i].workspaceSize, st);
      };
      CK(call(out, &zero));
      CK(cudaMemsetAsync(dcount, 0, sizeof *dcount, st));
      k_diff<<<1024, 256, 0, st>>>((const uint32_t*)out, (const uint32_t*)ref, outN, dcount);
      unsigned long long diff = 0;
      CK(cudaMemcpyAsync(&diff, dcount, sizeof diff, cudaMemcpyDeviceToHost, st));
      CK(cudaStreamSynchronize(st));
      const float ms = timeIt(st, [&] { return call(out, beta); });
      printf("{\"shape\":\"%s\",\"m\":%d,\"k\":%d,\"n\":%d,\"from\":\"heuristic\",\"rank\":%d,\"algo\":%d,\"tile\":%d,\"stages\":%d,"
             "\"splitk\":%d,\"reduction\":%d,\"cta_swizzling\":%d,\"custom\":%d,\"cluster\":%d,\"ws_bytes\":%zu,\"ms\":%.4f,"
             "\"tflops\":%.1f,\"vs_gemmex\":%.3f,\"outputs_differing\":%llu}\n",
             s.name, s.m, s.k, s.n, i, cfg(a, CUBLASLT_ALGO_CONFIG_ID), cfg(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
             cfg(a, CUBLASLT_ALGO_CONFIG_STAGES_ID), cfg(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
             cfg(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), cfg(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
             cfg(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION), cfg(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
             res[i].workspaceSize, ms, flops / ms / 1e9, msEx / ms, diff);
      fflush(stdout);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(w);
    cudaFree(x);
    cudaFree(out);
    cudaFree(ref);
  }
  return 0;
}
