// Read bandwidth of the H100's HBM for the shapes a batch-1 LM head streams (docs/results/decode.md): a
// persistent grid with eight 16-byte loads in flight a thread, against short blocks of 512
// threads that each read one 32 KB tile (four loads a thread) and reduce it, as k_gemv_bf16's
// LM-head blocks do (9,496 of them over 311 MB), at 2 and 3 such blocks an SM.
//   nvcc -O2 -arch=sm_90 -o readbw tools/gpu/readbw.cu && ./readbw
#include <cuda_runtime.h>
#include <cstdio>

__global__ void k_stream(const uint4* __restrict__ p, size_t n, unsigned* out) {
  unsigned acc = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; u++) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < 8; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

// One 32 KB tile a block: 512 threads x 4 loads of 16 bytes, then a block reduction (two barriers).
__global__ void __launch_bounds__(512) k_tiles(const uint4* __restrict__ p, unsigned* out) {
  __shared__ unsigned red[16];
  const uint4* t = p + (size_t)blockIdx.x * 2048;
  uint4 v[4];
#pragma unroll
  for (int u = 0; u < 4; u++) v[u] = __ldcs(t + threadIdx.x + u * 512);
  unsigned acc = 0;
#pragma unroll
  for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned a = 0;
    for (int i = 0; i < 16; i++) a ^= red[i];
    if (a == 0x12345678u) out[blockIdx.x] = a;
  }
}

int main() {
  const size_t bytes = 311164928;  // 151936 x 1024 bf16
  uint4* p;
  unsigned* out;
  cudaMalloc(&p, bytes);
  cudaMalloc(&out, 1 << 20);
  cudaMemset(p, 1, bytes);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  auto report = [&](const char* what, float ms, int reps) {
    printf("%-58s %.2f us, %.3f TB/s\n", what, ms * 1e3 / reps, bytes / (ms * 1e-3 / reps) / 1e12);
  };
  const int R = 20;
  for (int bps : {2, 4, 8}) {
    k_stream<<<sms * bps, 256>>>(p, bytes / 16, out);
    cudaEventRecord(a);
    for (int r = 0; r < R; r++) k_stream<<<sms * bps, 256>>>(p, bytes / 16, out);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    char w[80];
    snprintf(w, sizeof w, "persistent, %d blocks of 256 an SM, 8 loads in flight:", bps);
    report(w, ms, R);
  }
  const unsigned tiles = (unsigned)(bytes / 32768);
  // Shared memory that caps the blocks an SM: 3 (64 KB each), 2 (100 KB).
  for (int smem : {0, 64 * 1024, 100 * 1024}) {
    cudaFuncSetAttribute(k_tiles, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    k_tiles<<<tiles, 512, smem>>>(p, out);
    cudaEventRecord(a);
    for (int r = 0; r < R; r++) k_tiles<<<tiles, 512, smem>>>(p, out);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    int nb = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_tiles, 512, smem);
    char w[80];
    snprintf(w, sizeof w, "%u tiles of 32 KB, %d blocks of 512 an SM:", tiles, nb);
    report(w, ms, R);
  }
  printf("status: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
