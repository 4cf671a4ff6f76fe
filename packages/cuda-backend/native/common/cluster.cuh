// Thread block cluster helpers (sm_90): st.async stores into a cluster peer's shared memory,
// counted by its transaction barrier. Used by k_attn_decode_short and k_sample_cluster.
#pragma once
#include <stdint.h>

namespace nerva {

// The cluster's partials travel by st.async into the merging block's shared memory, each store
// counted by that block's transaction barrier (mbarrier complete_tx), instead of plain remote
// stores and a cluster barrier: a cluster barrier's release is a GPU-scope fence (MEMBAR.ALL.GPU,
// an L2 round trip) and waits for every block, where a block here needs only its own slices.
// The barrier's initialization is published once, before the dependency wait, by a relaxed
// cluster barrier (fence.mbarrier_init: no L2 round trip).
__device__ __forceinline__ unsigned saShared(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ unsigned saMapa(unsigned addr, int rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void saTxInit(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void saStAsync(unsigned remote, float v, unsigned remoteBar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(remote), "r"(__float_as_uint(v)),
               "r"(remoteBar)
               : "memory");
}
__device__ __forceinline__ void saTxWait(unsigned bar) {
  unsigned done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar)
        : "memory");
  }
}

}  // namespace nerva
