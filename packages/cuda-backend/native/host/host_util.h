// Small helpers the host-side modules share (host pool, host channel).
#pragma once
#include <thread>

namespace nerva_host {

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
