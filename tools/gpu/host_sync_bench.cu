// Per-layer cost of a GPU -> host -> GPU round trip inside a captured CUDA graph, the shape of
// tiered KV decode (the host computes attention over warm pages once per layer). Compares the
// stream-ordered host function (cudaLaunchHostFunc with staging copies) against a host thread
// that spin-polls a flag in mapped pinned memory written by a kernel, answered by a kernel that
// spin-waits on the host's flag. Prints one JSON object per variant.
//   nvcc -O2 -arch=sm_90 -std=c++17 tools/gpu/host_sync_bench.cu -o /tmp/host_sync_bench
#include <cuda_runtime.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#define CK(x)                                                                    \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                     \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

constexpr int kLayers = 36;
constexpr int kQ = 4096;  // floats of q (and out) per layer: 32 heads x 128

__global__ void k_busy(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

struct Flags {
  unsigned req;
  unsigned pad[31];
  unsigned resp;
};

__global__ void k_signal(const float* q, float* qHost, unsigned* ctr, Flags* f) {
  for (int i = threadIdx.x; i < kQ; i += blockDim.x) qHost[i] = q[i];
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned c = *ctr + 1;
    *ctr = c;
    *(volatile unsigned*)&f->req = c;
  }
}

__global__ void k_wait(const float* outHost, float* out, const unsigned* ctr, Flags* f, int* timedOut) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    unsigned c = *ctr;
    long long t0 = clock64();
    ok = 1;
    while (*(volatile unsigned*)&f->resp != c) {
      if (clock64() - t0 > 4000000000LL) {
        ok = 0;
        atomicAdd(timedOut, 1);
        break;
      }
    }
  }
  __syncthreads();
  const volatile float* src = outHost;
  for (int i = threadIdx.x; i < kQ; i += blockDim.x) out[i] = ok ? src[i] : __int_as_float(0x7fc00000);
}

static void CUDART_CB noop(void*) {}

std::atomic<bool> stopSpin{false};
void responder(Flags* f, const float* qHost, float* outHost) {
  unsigned seen = 0;
  while (!stopSpin.load(std::memory_order_relaxed)) {
    unsigned r = *(volatile unsigned*)&f->req;
    if (r == seen) continue;
    seen = r;
    for (int i = 0; i < kQ; i++) outHost[i] = qHost[i] * 2.f;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    *(volatile unsigned*)&f->resp = r;
  }
}

int main() {
  cudaStream_t s;
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int clk = 0;
  CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
  const long long busy = (long long)clk * 200 / 1000;  // ~200 us of a layer's GPU work
  float *q, *out, *qHost, *outHost, *stageQ, *stageOut;
  unsigned* ctr;
  int* timedOut;
  Flags* f;
  CK(cudaMalloc(&q, kQ * 4));
  CK(cudaMalloc(&out, kQ * 4));
  CK(cudaMalloc(&ctr, 4));
  CK(cudaMalloc(&timedOut, 4));
  CK(cudaMemset(ctr, 0, 4));
  CK(cudaMemset(timedOut, 0, 4));
  CK(cudaHostAlloc(&qHost, kQ * 4, cudaHostAllocMapped));
  CK(cudaHostAlloc(&outHost, kQ * 4, cudaHostAllocMapped));
  CK(cudaHostAlloc(&stageQ, kQ * 4, cudaHostAllocDefault));
  CK(cudaHostAlloc(&stageOut, kQ * 4, cudaHostAllocDefault));
  CK(cudaHostAlloc(&f, sizeof(Flags), cudaHostAllocMapped));
  memset(f, 0, sizeof(Flags));
  float* ones = new float[kQ];
  for (int i = 0; i < kQ; i++) ones[i] = 1.f + i;
  CK(cudaMemcpy(q, ones, kQ * 4, cudaMemcpyHostToDevice));
  float *qHostD, *outHostD;
  Flags* fD;
  CK(cudaHostGetDevicePointer(&qHostD, qHost, 0));
  CK(cudaHostGetDevicePointer(&outHostD, outHost, 0));
  CK(cudaHostGetDevicePointer(&fD, f, 0));
  std::thread spin(responder, f, qHost, outHost);

  // 5: the round trip on a side stream beside a 10 us kernel (tiered attention's shape: the host
  // partial beside the device's own); 6: the same plus a host function forked before it and
  // joined after (the server's arm); 7: the 10 us kernel alone.
  const char* names[] = {"busy_only", "hostfunc_noop", "hostfunc_with_copies", "mapped_spin", "mapped_spin_kernels_only_16",
                         "mapped_spin_beside", "mapped_spin_beside_armed", "busy10_only"};
  const long long busy10 = (long long)clk * 10 / 1000;
  cudaStream_t side, armS;
  cudaEvent_t evs[4 * kLayers];
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&armS, cudaStreamNonBlocking));
  for (auto& e : evs) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (int v = 0; v < 8; v++) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < kLayers; l++) {
      if (v == 5 || v == 6) {
        cudaEvent_t* e = evs + 4 * l;
        CK(cudaEventRecord(e[0], s));
        CK(cudaStreamWaitEvent(side, e[0], 0));
        if (v == 6) {
          CK(cudaStreamWaitEvent(armS, e[0], 0));
          CK(cudaLaunchHostFunc(armS, noop, nullptr));
          CK(cudaEventRecord(e[2], armS));
        }
        k_signal<<<1, 256, 0, side>>>(q, qHostD, ctr, fD);
        k_wait<<<1, 256, 0, side>>>(outHostD, out, ctr, fD, timedOut);
        if (v == 6) CK(cudaStreamWaitEvent(side, e[2], 0));
        CK(cudaEventRecord(e[1], side));
        k_busy<<<1, 32, 0, s>>>(busy10);
        CK(cudaStreamWaitEvent(s, e[1], 0));
        continue;
      }
      if (v == 7) {
        k_busy<<<1, 32, 0, s>>>(busy10);
        continue;
      }
      if (v == 4) {
        for (int k = 0; k < 16; k++) k_busy<<<1, 32, 0, s>>>(busy / 16);
      } else {
        k_busy<<<1, 32, 0, s>>>(busy);
      }
      if (v == 1) CK(cudaLaunchHostFunc(s, noop, nullptr));
      if (v == 2) {
        CK(cudaMemcpyAsync(stageQ, q, kQ * 4, cudaMemcpyDeviceToHost, s));
        CK(cudaMemcpyAsync(stageQ, q, 1024, cudaMemcpyDeviceToHost, s));
        CK(cudaMemcpyAsync(stageQ, q, 4, cudaMemcpyDeviceToHost, s));
        CK(cudaMemcpyAsync(stageQ, q, 4, cudaMemcpyDeviceToHost, s));
        CK(cudaLaunchHostFunc(s, noop, nullptr));
        CK(cudaMemcpyAsync(out, stageOut, kQ * 4, cudaMemcpyHostToDevice, s));
        CK(cudaMemcpyAsync(out, stageOut, 128, cudaMemcpyHostToDevice, s));
      }
      if (v == 3) {
        k_signal<<<1, 256, 0, s>>>(q, qHostD, ctr, fD);
        k_wait<<<1, 256, 0, s>>>(outHostD, out, ctr, fD, timedOut);
      }
    }
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int w = 0; w < 3; w++) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    const int reps = 20;
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; r++) {
      CK(cudaGraphLaunch(ge, s));
      CK(cudaStreamSynchronize(s));
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    int to = 0;
    float o0 = 0;
    CK(cudaMemcpy(&to, timedOut, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&o0, out + 5, 4, cudaMemcpyDeviceToHost));
    printf("{\"variant\":\"%s\",\"layers\":%d,\"ms_per_pass\":%.3f,\"us_per_layer\":%.2f,\"timed_out\":%d,\"out5\":%g}\n", names[v], kLayers, ms,
           ms * 1000 / kLayers, to, o0);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  }
  stopSpin = true;
  spin.join();
  return 0;
}
