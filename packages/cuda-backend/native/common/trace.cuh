// Device timeline (a build with -DNERVA_TRACE only; tools/gpu/trace_timeline.py reads it): thread 0
// of each block of a traced kernel appends {tag, block, entry, wait, exit, grid, mark}
// (%globaltimer ns; mark: NERVA_TRACE_MARK, a kernel's own midpoint) to its SM's ring, so the
// kernels of a replayed graph can be placed on one clock, PDL overlap included.
// Each translation unit has its own copy of the ring pointers (no relocatable device code):
// NERVA_TRACE_TU registers a setter that trace.cu calls once the rings exist.
#pragma once
#include <cuda_runtime.h>

namespace nerva {

#ifdef NERVA_TRACE
namespace trace {
// Called by each TU's registration (static initializer): `set` stores the rings in its symbols.
int registerModule(void (*set)(unsigned long long* buf, unsigned* count, unsigned cap));
void dump();
// Allocates the rings (first launch, before any capture) and hands them to every module.
void init();
}  // namespace trace

static __device__ unsigned long long* g_tr = nullptr;
static __device__ unsigned* g_trCount = nullptr;
static __device__ unsigned g_trCap = 0;
static __shared__ unsigned long long s_trWait, s_trMark;

static void traceSetSymbols(unsigned long long* buf, unsigned* count, unsigned cap) {
  cudaMemcpyToSymbol(g_tr, &buf, sizeof(buf));
  cudaMemcpyToSymbol(g_trCount, &count, sizeof(count));
  cudaMemcpyToSymbol(g_trCap, &cap, sizeof(cap));
}
static const int traceRegistered_ = trace::registerModule(&traceSetSymbols);

__device__ __forceinline__ unsigned long long trNow() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
struct TraceScope {
  unsigned tag;
  unsigned long long t0;
  __device__ explicit TraceScope(unsigned line) : tag(line), t0(0) {
    if (threadIdx.x == 0) {
      t0 = trNow();
      s_trWait = 0;
      s_trMark = 0;
    }
  }
  __device__ ~TraceScope() {
    if (threadIdx.x != 0 || !g_tr) return;
    unsigned sm;
    asm volatile("mov.u32 %0, %smid;" : "=r"(sm));
    const unsigned i = atomicAdd(g_trCount + sm, 1u) % g_trCap;
    unsigned long long* r = g_tr + ((size_t)sm * g_trCap + i) * 6;
    const unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r[0] = ((unsigned long long)tag << 40) | ((unsigned long long)sm << 32) | blk;
    r[1] = t0;
    r[2] = s_trWait;
    r[4] = gridDim.x * gridDim.y * gridDim.z;
    r[5] = s_trMark;
    r[3] = trNow();
  }
};
#define NERVA_TRACE_KERNEL() TraceScope nervaTraceScope_(__LINE__)
// A kernel's tag is BASE + its line in its file (trace_timeline.py --src PATH:BASE).
#define NERVA_TRACE_KERNEL_AT(BASE) TraceScope nervaTraceScope_((BASE) + __LINE__)
#define NERVA_TRACE_MARK()                 \
  do {                                     \
    if (threadIdx.x == 0) s_trMark = trNow(); \
  } while (0)
#else
#define NERVA_TRACE_MARK() \
  do {                     \
  } while (0)
#define NERVA_TRACE_KERNEL() \
  do {                       \
  } while (0)
#define NERVA_TRACE_KERNEL_AT(BASE) \
  do {                              \
  } while (0)
#endif

}  // namespace nerva
