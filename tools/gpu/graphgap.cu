// What separates two back-to-back CUDA graph replays on the GPU, with and without event records
// between them or inside them (figures: docs/results/decode.md). Each kernel spins 20 us so the host enqueues faster
// than the GPU runs; the time per replay beyond the spins is then the GPU's own.
//   nvcc -O2 -arch=sm_90 -o graphgap tools/gpu/graphgap.cu && ./graphgap
#include <cuda_runtime.h>
#include <cstdio>

__global__ void k_spin(int* p) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  } while (t - t0 < 20000);
  if (threadIdx.x == 0) p[blockIdx.x] += 1;
}

int main() {
  int* d;
  cudaMalloc(&d, 1024);
  cudaStream_t s, side;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  cudaEvent_t t0, t1, ea, eb, na, nb, inT, inU;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  cudaEventCreate(&ea);
  cudaEventCreate(&eb);
  cudaEventCreate(&inT);
  cudaEventCreateWithFlags(&na, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&nb, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&inU, cudaEventDisableTiming);
  // inGraph 0: kernels only; 1: a timed event recorded inside the graph after them; 2: untimed.
  for (int nk : {1, 4})
    for (int inGraph = 0; inGraph < 3; inGraph++) {
      cudaGraph_t g;
      cudaGraphExec_t ge;
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      for (int i = 0; i < nk; i++) k_spin<<<1, 32, 0, s>>>(d);
      if (inGraph) cudaEventRecordWithFlags(inGraph == 1 ? inT : inU, s, cudaEventRecordExternal);
      cudaStreamEndCapture(s, &g);
      cudaGraphInstantiate(&ge, g, 0);
      for (int mode = 0; mode < (inGraph ? 1 : 5); mode++) {
        const int N = 2000;
        for (int w = 0; w < 100; w++) cudaGraphLaunch(ge, s);
        cudaStreamSynchronize(s);
        cudaEventRecord(t0, s);
        for (int i = 0; i < N; i++) {
          cudaGraphLaunch(ge, s);
          if (mode == 1) cudaEventRecord(ea, s), cudaEventRecord(eb, s);
          if (mode == 2) cudaEventRecord(na, s), cudaEventRecord(nb, s);
          if (mode == 3) cudaEventRecord(ea, s);
          if (mode == 4) cudaEventRecord(na, s), cudaStreamWaitEvent(side, na, 0), cudaEventRecord(ea, side);
        }
        cudaEventRecord(t1, s);
        cudaEventSynchronize(t1);
        float ms;
        cudaEventElapsedTime(&ms, t0, t1);
        const char* what = inGraph == 1   ? "a timed event inside the graph"
                           : inGraph == 2 ? "an untimed event inside the graph"
                           : mode == 0    ? "no events"
                           : mode == 1    ? "2 timed events between replays"
                           : mode == 2    ? "2 untimed events between replays"
                           : mode == 3    ? "1 timed event between replays"
                                          : "an untimed event between replays, a timed one behind it on another stream";
        printf("kernels a graph %d, %s: %.3f us a replay beyond the spins\n", nk, what, ms * 1e3 / N - 20.0 * nk);
      }
      cudaGraphExecDestroy(ge);
      cudaGraphDestroy(g);
    }
  cudaEventRecord(t0, s);
  for (int i = 0; i < 2000; i++) k_spin<<<1, 32, 0, s>>>(d);
  cudaEventRecord(t1, s);
  cudaEventSynchronize(t1);
  float ms;
  cudaEventElapsedTime(&ms, t0, t1);
  printf("eager launches: %.3f us a kernel beyond the spin\n", ms * 1e3 / 2000 - 20.0);
  printf("status: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
