// Shared by the kernel emulation tests: a float's bits and back (memcpy, no aliasing).
#pragma once
#include <cstdint>
#include <cstring>

namespace {

inline float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

}  // namespace
