// Shared by the standalone host-module tests: a heap-allocation counter (the modules must not
// allocate once their scratch is reserved) and a seeded splitmix64 source of uniform doubles.
// Define NERVA_TEST_SEED before including it.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

// Counts heap allocations while armed.
static std::atomic<bool> gArmed{false};
static std::atomic<long> gAllocs{0};
void* operator new(size_t n) {
  if (gArmed.load(std::memory_order_relaxed)) gAllocs.fetch_add(1);
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace {

uint64_t gSeed = NERVA_TEST_SEED;
double uniform(double lo, double hi) {  // splitmix64
  uint64_t z = (gSeed += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return lo + (hi - lo) * ((double)(z >> 11) / 9007199254740992.0);
}

}  // namespace
