// Host-side launch machinery of every op family: the argument decoder (src/abi.ts' layouts), error
// reporting into NervaExec::errCall, and cudaLaunchKernelEx with programmatic dependent launch.
#pragma once
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <utility>

#include "nerva.h"

namespace nerva {

struct Args {
  const double* a;
  int n;
  int i = 0;
  bool ok = true;
  double next() {
    if (i >= n) {
      ok = false;
      return 0;
    }
    return a[i++];
  }
  void* ptr() { return (void*)(uintptr_t)next(); }
  int num() { return (int)next(); }
};

struct Buf {
  void* p;
  int dt;
};

inline Buf buf(Args& A) {
  Buf b;
  b.p = A.ptr();
  b.dt = A.num();
  return b;
}

inline int bad(NervaExec* ex, const char* why) {
  snprintf(ex->errCall, sizeof ex->errCall, "%s", why);
  return NERVA_BAD_ARGS;
}

inline int check(NervaExec* ex, const char* name, cudaError_t launched = cudaSuccess) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = launched;
  if (!ex->capturing) ex->launches++;
  if (e != cudaSuccess) {
    snprintf(ex->errCall, sizeof ex->errCall, "launch %s", name);
    return (int)e;
  }
  return NERVA_OK;
}

// Every kernel goes through cudaLaunchKernelEx so that, with ex->pdl, it carries the
// programmatic-stream-serialization attribute (inside stream capture the graph edge becomes
// programmatic): it may launch before its predecessor finishes and syncs itself with pdlWait().
template <typename... KArgs, typename... Actual>
cudaError_t launchKernel(NervaExec* ex, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, Actual&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ex->stream;
  cudaLaunchAttribute attr[1];
  if (ex->pdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  if (ex->sinceRingPush < (1u << 20)) ex->sinceRingPush++;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Actual>(args)...);
}

#define LAUNCH(name, grid, block, smem, ...)                                    \
  do {                                                                          \
    cudaError_t _le = launchKernel(ex, name, dim3(grid), dim3(block), (smem), __VA_ARGS__); \
    int _rc = check(ex, #name, _le);                                            \
    if (_rc) return _rc;                                                        \
  } while (0)

cudaError_t allowKernelAttributeImpl(const void* fn, cudaFuncAttribute attr, int value);

// Set a kernel attribute that only grows (a shared-memory size, a cluster opt-in) to at least
// `value`. Attributes are per function and per device, so the grant is remembered per (function,
// attribute, device): set once, not on every launch, and never assumed for a second device of
// the same process (a launcher's own static cache would be).
template <typename... KArgs>
cudaError_t allowKernelAttribute(void (*kernel)(KArgs...), cudaFuncAttribute attr, int value) {
  return allowKernelAttributeImpl(reinterpret_cast<const void*>(kernel), attr, value);
}

// Opt a kernel into `bytes` of dynamic shared memory (a block needs it above 48 KiB).
template <typename... KArgs>
cudaError_t allowDynamicSmem(void (*kernel)(KArgs...), size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return allowKernelAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

inline unsigned gridFor(size_t n, int block, int smCount) {
  size_t g = (n + block - 1) / block;
  size_t cap = (size_t)smCount * 16;
  return (unsigned)std::max<size_t>(1, std::min(g, cap));
}

inline size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

// A launch of clusters of C blocks along x (with programmatic dependent launch where `pdl`);
// also k_sample_cluster's.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[2];
  ClusterLaunch(dim3 grid, unsigned threads, size_t smem, int C, cudaStream_t stream, bool pdl) {
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)C;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (pdl) {
      attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[1].val.programmaticStreamSerializationAllowed = 1;
      cfg.numAttrs = 2;
    }
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // cfg.attrs points into it
};

}  // namespace nerva
