// Kernels of the host channel (host_channel.h): the stage kernel (inputs to mapped host memory,
// then the request number) and the wait kernel (spin on the response word, then the outputs to
// the device). Its own translation unit; host_channel.h is found through the include path.
#include "host_channel.h"

namespace hostchannel {

struct Copies {
  HostChannelCopy c[kHostChannelMaxCopies];
  int n;
};

__device__ inline size_t copyWords(const HostChannelCopy& c) { return (size_t)c.width * c.rows; }

// Every thread copies a grid-stride share of every copy; then each block fences (system scope)
// and the last block to finish writes the request: the host sees all inputs before the number.
__global__ void k_stage(Copies cs, uint32_t* counter, uint32_t* blocksDone, volatile uint32_t* reqWord) {
  const size_t nth = (size_t)gridDim.x * blockDim.x;
  const size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (int k = 0; k < cs.n; k++) {
    const HostChannelCopy c = cs.c[k];
    const uint32_t* src = (const uint32_t*)c.src;
    uint32_t* dst = (uint32_t*)c.dst;
    for (size_t i = t0; i < copyWords(c); i += nth) {
      const size_t r = i / c.width, col = i - r * c.width;
      dst[r * c.dstPitch + col] = src[r * c.srcPitch + col];
    }
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned done = atomicAdd(blocksDone, 1u);
    if (done == gridDim.x - 1) {
      *blocksDone = 0;
      const uint32_t next = *counter + 1;
      *counter = next;
      __threadfence_system();
      *reqWord = next;
    }
  }
}

// Each block waits for the response to this enqueue's request (the counter the stage kernel
// left), then copies its share of the outputs; on timeout its share is NaN and block 0 counts it.
__global__ void k_wait(Copies cs, const uint32_t* counter, const volatile uint32_t* respWord, uint32_t* timeouts,
                       unsigned long long timeoutCycles) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    const uint32_t want = *counter;
    const long long start = clock64();
    ok = 1;
    while (*respWord != want) {
      if ((unsigned long long)(clock64() - start) > timeoutCycles) {
        ok = 0;
        if (blockIdx.x == 0) *(volatile uint32_t*)timeouts = *(volatile uint32_t*)timeouts + 1;
        break;
      }
    }
  }
  __syncthreads();
  const size_t nth = (size_t)gridDim.x * blockDim.x;
  const size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (int k = 0; k < cs.n; k++) {
    const HostChannelCopy c = cs.c[k];
    // volatile: the host rewrote these words since the last replay; never a cached copy.
    const volatile uint32_t* src = (const volatile uint32_t*)c.src;
    uint32_t* dst = (uint32_t*)c.dst;
    for (size_t i = t0; i < copyWords(c); i += nth) {
      const size_t r = i / c.width, col = i - r * c.width;
      dst[r * c.dstPitch + col] = ok ? src[r * c.srcPitch + col] : 0x7fc00000u;
    }
  }
}

inline Copies pack(const HostChannelCopy* c, int n, size_t* words) {
  Copies cs{};
  cs.n = n;
  *words = 0;
  for (int i = 0; i < n; i++) {
    cs.c[i] = c[i];
    *words += (size_t)c[i].width * c[i].rows;
  }
  return cs;
}

// Blocks of 256 threads, each about 4 words per thread, at most maxBlocks.
inline unsigned blocksFor(size_t words, unsigned maxBlocks) {
  size_t b = (words + 1023) / 1024;
  return (unsigned)(b < 1 ? 1 : b > maxBlocks ? maxBlocks : b);
}

}  // namespace hostchannel

extern "C" int nerva_host_channel_launch_stage(CUstream_st* s, const HostChannelCopy* in, int nIn, uint32_t* counter,
                                               uint32_t* blocksDone, volatile uint32_t* reqWord) {
  if (nIn < 0 || nIn > kHostChannelMaxCopies) return (int)cudaErrorInvalidValue;
  size_t words = 0;
  hostchannel::Copies cs = hostchannel::pack(in, nIn, &words);
  hostchannel::k_stage<<<hostchannel::blocksFor(words, 64), 256, 0, (cudaStream_t)s>>>(cs, counter, blocksDone, reqWord);
  return (int)cudaGetLastError();
}

extern "C" int nerva_host_channel_launch_wait(CUstream_st* s, const HostChannelCopy* out, int nOut, const uint32_t* counter,
                                              const volatile uint32_t* respWord, uint32_t* timeouts, unsigned long long timeoutCycles) {
  if (nOut < 0 || nOut > kHostChannelMaxCopies) return (int)cudaErrorInvalidValue;
  size_t words = 0;
  hostchannel::Copies cs = hostchannel::pack(out, nOut, &words);
  // Few blocks: every block polls the response word over PCIe.
  hostchannel::k_wait<<<hostchannel::blocksFor(words, 16), 256, 0, (cudaStream_t)s>>>(cs, counter, respWord, timeouts, timeoutCycles);
  return (int)cudaGetLastError();
}

