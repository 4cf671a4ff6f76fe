// Asynchronous global -> shared copies (cp.async), for the quantized GEMVs' weight rings.
#pragma once
#include <cstdint>

namespace nerva::ops {

// A copy of CB bytes (16, 8 or 4 asynchronous; both addresses CB-aligned) into shared memory. CB
// 2 (rows of an odd number of 210-byte Q6_K blocks) is a plain load and store.
template <int CB>
__device__ __forceinline__ void cpAsync(uint8_t* dst, const uint8_t* src) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  if constexpr (CB == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  else if constexpr (CB == 2) *reinterpret_cast<uint16_t*>(dst) = __ldg(reinterpret_cast<const unsigned short*>(src));
  else asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(d), "l"(src), "n"(CB) : "memory");
}

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
