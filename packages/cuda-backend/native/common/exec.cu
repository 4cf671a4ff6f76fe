// Kernel attributes granted once per (function, device); see allowKernelAttribute in exec.cuh.
#include <map>
#include <mutex>
#include <tuple>

#include "common/exec.cuh"

namespace nerva {

cudaError_t allowKernelAttributeImpl(const void* fn, cudaFuncAttribute attr, int value) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  // One map for the process, under a lock: the attribute is the function's on a device, and a
  // thread's own cache could lower a size another thread raised.
  static std::mutex m;
  static std::map<std::tuple<const void*, int, int>, int> granted;
  std::lock_guard<std::mutex> lock(m);
  auto it = granted.find({fn, dev, (int)attr});
  if (it != granted.end() && it->second >= value) return cudaSuccess;
  e = cudaFuncSetAttribute(fn, attr, value);
  if (e == cudaSuccess) granted[{fn, dev, (int)attr}] = value;
  return e;
}

}  // namespace nerva
