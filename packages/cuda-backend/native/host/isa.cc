// CPU feature detection and the NERVA_HOST_ISA cap (isa.h).
#include "isa.h"

#include "knobs.h"

bool nerva_host_isa_supported(int isa) {
  if (isa == HOST_ISA_SCALAR) return true;
#if NERVA_HOST_X86 && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  // x86-64-v3's features (what both modules' AVX2 paths are compiled for), then v4's.
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
                  __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
  if (isa == HOST_ISA_AVX2) return v3;
  if (isa == HOST_ISA_AVX512)
    return v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd");
#endif
  return false;
}

int nerva_host_isa_cap() {
  const char* v = nerva::knobs::textValue("NERVA_HOST_ISA");
  if (!std::strcmp(v, "scalar")) return HOST_ISA_SCALAR;
  if (!std::strcmp(v, "avx2")) return HOST_ISA_AVX2;
  return HOST_ISA_AVX512;
}

int nerva_host_isa_best() {
  static const int best = [] {
    for (int i = nerva_host_isa_cap(); i > HOST_ISA_SCALAR; i--)
      if (nerva_host_isa_supported(i)) return i;
    return (int)HOST_ISA_SCALAR;
  }();
  return best;
}

const char* nerva_host_isa_name(int isa) {
  return isa == HOST_ISA_AVX512 ? "avx512" : isa == HOST_ISA_AVX2 ? "avx2" : "scalar";
}
