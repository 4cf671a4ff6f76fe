// Small helpers the host-side modules share (host pool, host channel).
#pragma once
#include <cstdlib>
#include <thread>

namespace nerva_host {

// An integer environment setting; `dflt` when unset, empty or not a whole number.
inline int envInt(const char* name, int dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return end && *end == 0 ? (int)n : dflt;
}

// One step of a spin-wait: the pause instruction where there is one (it frees the core's
// resources for a sibling hyperthread), else a yield.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace nerva_host
