// Asynchronous global -> shared copies (cp.async), for the quantized GEMVs' weight rings.
#pragma once
#include <cstdint>

namespace nerva::ops {

// Wait until at most `pending` (0..6) of this thread's most recent cp.async groups are in flight.
__device__ __forceinline__ void cpWait(int pending) {
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
  }
}

}  // namespace nerva::ops
