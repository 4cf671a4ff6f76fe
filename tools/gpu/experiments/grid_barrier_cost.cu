// Build and run (H200): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o gb grid_barrier_cost.cu && ./gb
// Grid-wide synchronization costs on one GPU: a kernel boundary in a CUDA graph (plain and with
// programmatic dependent launch) against a grid barrier inside one persistent kernel.
#include <cooperative_groups.h>
#include <cstdio>
#include <cuda_runtime.h>
namespace cg = cooperative_groups;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); return 1; } } while (0)

__global__ void __launch_bounds__(512) k_empty(int* sink, int pdl) {
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(sink, 1);
}

// Hand-rolled barrier: one arrival a block (release), then every block spins on the count (acquire).
__device__ __forceinline__ void gridBar(unsigned* count, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
    } while (v < target);
  }
  __syncthreads();
}

__global__ void __launch_bounds__(512) k_bars(unsigned* count, int n, int* sink) {
  for (int i = 1; i <= n; i++) gridBar(count, i * gridDim.x);
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(sink, 1);
}

__global__ void __launch_bounds__(512) k_coop(int n, int* sink) {
  cg::grid_group g = cg::this_grid();
  for (int i = 0; i < n; i++) g.sync();
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(sink, 1);
}

int main() {
  int sm = 0;
  CK(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0));
  int* sink; unsigned* count;
  CK(cudaMalloc(&sink, 4)); CK(cudaMalloc(&count, 4));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  const int N = 400;
  for (int per : {1, 2}) {
    const int grid = sm * per;
    for (int pdl = 0; pdl < 2; pdl++) {
      cudaGraph_t gr; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < N; i++) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(grid); cfg.blockDim = dim3(512); cfg.stream = st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at; cfg.numAttrs = pdl;
        CK(cudaLaunchKernelEx(&cfg, k_empty, sink, pdl));
      }
      CK(cudaStreamEndCapture(st, &gr));
      CK(cudaGraphInstantiate(&ge, gr, 0));
      CK(cudaGraphLaunch(ge, st)); CK(cudaStreamSynchronize(st));
      float best = 1e9f;
      for (int r = 0; r < 5; r++) {
        cudaEventRecord(a, st); CK(cudaGraphLaunch(ge, st)); cudaEventRecord(b, st); CK(cudaEventSynchronize(b));
        float ms; cudaEventElapsedTime(&ms, a, b); best = fminf(best, ms);
      }
      printf("{\"what\":\"graph of empty kernels\",\"blocks\":%d,\"pdl\":%d,\"us_each\":%.3f}\n", grid, pdl, best * 1000.f / N);
      cudaGraphExecDestroy(ge); cudaGraphDestroy(gr);
    }
    {
      float best = 1e9f;
      for (int r = 0; r < 5; r++) {
        CK(cudaMemsetAsync(count, 0, 4, st));
        cudaEventRecord(a, st);
        k_bars<<<grid, 512, 0, st>>>(count, N, sink);
        cudaEventRecord(b, st); CK(cudaEventSynchronize(b));
        float ms; cudaEventElapsedTime(&ms, a, b); best = fminf(best, ms);
      }
      printf("{\"what\":\"red.release + ld.acquire barrier\",\"blocks\":%d,\"us_each\":%.3f}\n", grid, best * 1000.f / N);
    }
    {
      float best = 1e9f;
      int n = N;
      void* args[] = {&n, &sink};
      for (int r = 0; r < 5; r++) {
        cudaEventRecord(a, st);
        CK(cudaLaunchCooperativeKernel((void*)k_coop, dim3(grid), dim3(512), args, 0, st));
        cudaEventRecord(b, st); CK(cudaEventSynchronize(b));
        float ms; cudaEventElapsedTime(&ms, a, b); best = fminf(best, ms);
      }
      printf("{\"what\":\"cooperative grid.sync\",\"blocks\":%d,\"us_each\":%.3f}\n", grid, best * 1000.f / N);
    }
  }
  return 0;
}
