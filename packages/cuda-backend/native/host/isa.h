// The host compute modules' one SIMD/ISA layer (host attention, host MLP): which vector path
// this CPU runs (feature detection, capped by NERVA_HOST_ISA), the target attributes each path's
// functions are compiled with, and the vector primitives they share.
//
// Paths: HOST_ISA_AVX512 (x86-64-v4: AVX-512 F, BW, VL, DQ, CD), HOST_ISA_AVX2 (x86-64-v3: AVX2,
// FMA, BMI1/2) and HOST_ISA_SCALAR, the baseline every CPU runs (plain code, or 16-byte vectors
// where the compiler lowers them to SSE2). A file compiles with plain -O2 on any x86-64: the
// wider paths are functions with target attributes, picked at run time, so one process runs one
// path and results depend on neither the thread count nor the caller.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <cstdlib>
#include <cstring>
#include <new>

enum HostIsa { HOST_ISA_SCALAR = 0, HOST_ISA_AVX2 = 1, HOST_ISA_AVX512 = 2 };

// Compiled in and supported by this CPU and OS.
bool nerva_host_isa_supported(int isa);
// The cap NERVA_HOST_ISA sets (default HOST_ISA_AVX512).
int nerva_host_isa_cap();
// The most capable supported path within the cap: what the modules run unless a test selects one.
int nerva_host_isa_best();
const char* nerva_host_isa_name(int isa);  // "scalar", "avx2", "avx512"

// Intrinsics (x86 with a GNU-compatible compiler): AVX2+FMA and AVX-512 functions by feature list.
#if defined(__x86_64__) || defined(__i386__)
#define NERVA_HOST_X86 1
#define NERVA_AVX2 __attribute__((target("avx2,fma")))
#define NERVA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#endif

// Generic vector code (GCC vector extensions) compiled once per ISA level with GCC: NERVA_V3 and
// NERVA_V4 functions, NERVA_BASE the baseline. The helpers they call are NERVA_INLINE (forced
// inline), so each level's entry point gets its own copy of them.
#if defined(__GNUC__) && !defined(__clang__)
#define NERVA_OPT optimize("O3", "fp-contract=fast")
#define NERVA_BASE __attribute__((NERVA_OPT))
#else
#define NERVA_BASE
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NERVA_X86_TARGETS 1
#define NERVA_V4 __attribute__((target("arch=x86-64-v4"), NERVA_OPT))
#define NERVA_V3 __attribute__((target("arch=x86-64-v3"), NERVA_OPT))
#else
#define NERVA_X86_TARGETS 0
#endif
#define NERVA_INLINE inline __attribute__((always_inline))
#if defined(__GNUC__) && !defined(__clang__)
#define NERVA_UNROLL _Pragma("GCC unroll 16")
#else
#define NERVA_UNROLL
#endif

namespace nerva_host {

inline float bf16ToF32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Grow-only 64-byte-aligned scratch (never shrinks, freed with the process).
template <class T>
struct Scratch {
  T* p = nullptr;
  size_t cap = 0;
  void reserve(size_t n) {
    if (n <= cap) return;
    size_t bytes = ((n * sizeof(T)) + 63) & ~(size_t)63;
    void* q = std::aligned_alloc(64, bytes);
    if (!q) throw std::bad_alloc();
    std::free(p);
    p = (T*)q;
    cap = bytes / sizeof(T);
  }
};

// Vec<L>::F: L floats, a kernel's unit; L is each level's register width (16 for AVX-512, 8 for
// AVX2, 4 for the baseline's 16-byte vectors: wider vectors than the registers are lowered
// through the stack). I: L int32, H: L uint16. GCC and Clang vector extensions.
template <int L>
struct Vec;
#if !defined(__clang__)
// Returning 32- and 64-byte vectors "changes the ABI" below AVX: these functions are all inlined.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
template <>
struct Vec<16> {
  typedef float F __attribute__((vector_size(64)));
  typedef int32_t I __attribute__((vector_size(64)));
  typedef uint16_t H __attribute__((vector_size(32)));
};
template <>
struct Vec<8> {
  typedef float F __attribute__((vector_size(32)));
  typedef int32_t I __attribute__((vector_size(32)));
  typedef uint16_t H __attribute__((vector_size(16)));
};
template <>
struct Vec<4> {
  typedef float F __attribute__((vector_size(16)));
  typedef int32_t I __attribute__((vector_size(16)));
  typedef uint16_t H __attribute__((vector_size(8)));
};
// Inside templates over L: the vector types of Vec<L>.
#define NERVA_F typename nerva_host::Vec<L>::F
#define NERVA_I typename nerva_host::Vec<L>::I

template <int L>
NERVA_INLINE NERVA_F vload(const float* p) {
  NERVA_F v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <int L>
NERVA_INLINE void vstore(float* p, const NERVA_F& v) {
  std::memcpy(p, &v, sizeof v);
}
template <int L>
NERVA_INLINE NERVA_F vsplat(float s) {
  return s - NERVA_F{};  // a broadcast (0 + s is not folded: -0)
}
template <int L>
NERVA_INLINE NERVA_F vmax(const NERVA_F& a, const NERVA_F& b) {
  const NERVA_I m = a > b;
  return (NERVA_F)((m & (NERVA_I)a) | (~m & (NERVA_I)b));
}
// Halves until 4 lanes, then a fixed pair order: the same sum for the same input.
template <int L>
NERVA_INLINE float hsum(const NERVA_F& v) {
  if constexpr (L == 4) {
    return (v[0] + v[2]) + (v[1] + v[3]);
  } else {
    typename Vec<L / 2>::F a, b;
    std::memcpy(&a, &v, sizeof a);
    std::memcpy(&b, (const char*)&v + sizeof a, sizeof b);
    return hsum<L / 2>(a + b);
  }
}

}  // namespace nerva_host

