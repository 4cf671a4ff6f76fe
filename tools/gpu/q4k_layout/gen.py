# Writes k.cuh: k_q4k_mma of packages/cuda-backend/native/ops/q4k_mma.cu with a layout parameter RP
# (0: GGUF rows as today; 1: a repacked layout, each 16-row x super-block item 2304 contiguous bytes;
# 2: the repacked items through a per-warp TMA bulk ring in shared memory). Timing only: the
# repacked variants read GGUF bytes as if repacked. Build and run (H200):
#   python3 gen.py && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I../../../packages/cuda-backend/native \
#     -I../../../.device/include -o q4kb bench.cu && ./q4kb      (bench_gpb.cu: groups-a-block sweep, graph-timed)
import os, re, sys
src=open(os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../packages/cuda-backend/native/ops/q4k_mma.cu')).read()
src=src.split('template <bool GLU>\nstatic int q4kLaunch')[0]
src=src.replace('#include "common/exec.cuh"\n#include "ops/ops.h"\n','')
src=src.replace('template <bool GLU, bool ONE_SB>\n__global__ void __launch_bounds__(512) k_q4k_mma(',
                'template <bool GLU, bool ONE_SB, bool RP>\n__global__ void __launch_bounds__(512) k_q4k_mma(')
old='''    const uint32_t sbOff = (uint32_t)(warp + fs * KS) * QK_BYTES;
#pragma unroll
    for (int h = 0; h < 2; h++) {'''
assert old in src
new='''    if (RP) {
      // repacked: item (block group, sb) = 2304 contiguous bytes: 16 heads, then 4 x 512 B lane-major
      const uint8_t* base = w + ((size_t)(blockIdx.x * groups + fg) * sbs + (warp + fs * KS)) * 2304;
      it.head[0] = ldW4(base + g * 16);
      it.head[1] = ldW4(base + (8 + g) * 16);
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const uint4 v = ldW4(base + 256 + c * 512 + lane * 16);
        it.q[0][c] = make_uint2(v.x, v.y);
        it.q[1][c] = make_uint2(v.z, v.w);
      }
      if (ONE_SB) fg++; else if (++fg == groups) { fg = 0; fs++; }
      return;
    }
''' + old
src=src.replace(old,new)
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'k.cuh'),'w').write(src+'\n}  // namespace nerva::ops\n')
# ---- ring variant: RP int; RP == 2: per-warp TMA bulk ring of NS items in shared memory
s=open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'k.cuh')).read()
s=s.replace('template <bool GLU, bool ONE_SB, bool RP>','template <bool GLU, bool ONE_SB, int RP>')
s=s.replace('    if (RP) {\n      // repacked','    if (RP == 1) {\n      // repacked')
ring_helpers='''
constexpr int NS = 4;  // ring slots a warp
__device__ __forceinline__ uint32_t smaddr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbInit(uint64_t* b) { asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smaddr(b)) : "memory"); }
__device__ __forceinline__ void bulkItem(uint8_t* dst, const uint8_t* src, uint64_t* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 2304;" :: "r"(smaddr(bar)) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 2304, [%2];"
               :: "r"(smaddr(dst)), "l"(src), "r"(smaddr(bar)) : "memory");
}
__device__ __forceinline__ void mbWait(uint64_t* bar, uint32_t parity) {
  asm volatile("{\\n.reg .pred p;\\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\\n@!p bra W;\\n}" :: "r"(smaddr(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ uint4 lds4(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
'''
s=s.replace('}  // namespace\n\n// One block:', ring_helpers + '}  // namespace\n\n// One block:',1)
old='''  Q4kItem ra, rb;
  fetch(ra);  // weights only: before the dependency wait
  fetch(rb);'''
new='''  Q4kItem ra, rb;
  uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(xsc + sbs) + 127) & ~(uintptr_t)127) + (size_t)warp * NS * 2304;
  uint64_t* bars = reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(xsc + sbs) + 127) & ~(uintptr_t)127) + (size_t)KS * NS * 2304) + warp * NS;
  auto src = [&](int i) {
    const int gi = ONE_SB ? i : i % groups, si2 = ONE_SB ? 0 : i / groups;
    return w + ((size_t)(blockIdx.x * groups + gi) * sbs + (warp + si2 * KS)) * 2304;
  };
  if constexpr (RP == 2) {
    if (lane == 0) {
      for (int s = 0; s < NS; s++) mbInit(bars + s);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      for (int s = 0; s < NS && s < items; s++) bulkItem(ring + s * 2304, src(s), bars + s);
    }
    __syncwarp();
  } else {
  fetch(ra);  // weights only: before the dependency wait
  fetch(rb);
  }'''
assert old in s; s=s.replace(old,new)
old='''  for (int i = 0; i < items; i += 2) {
    step(ra);'''
new='''  if constexpr (RP == 2) {
    for (int i = 0; i < items; i++) {
      const int sl = i % NS;
      mbWait(bars + sl, (uint32_t)((i / NS) & 1));
      const uint8_t* base = ring + sl * 2304;
      Q4kItem it;
      it.head[0] = lds4(base + g * 16);
      it.head[1] = lds4(base + (8 + g) * 16);
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const uint4 v = lds4(base + 256 + c * 512 + lane * 16);
        it.q[0][c] = make_uint2(v.x, v.y);
        it.q[1][c] = make_uint2(v.z, v.w);
      }
      step(it);
      __syncwarp();
      if (lane == 0 && i + NS < items) bulkItem(ring + sl * 2304, src(i + NS), bars + sl);
    }
  } else
  for (int i = 0; i < items; i += 2) {
    step(ra);'''
assert old in s; s=s.replace(old,new)
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'k.cuh'),'w').write(s)
