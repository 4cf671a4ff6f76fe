// The knob table (knobs.h): every environment name the native code reads, declared once. The
// only getenv of the native code is here.
#include "common/knobs.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace nerva::knobs {
namespace {

constexpr Knob kTable[] = {
    {"NERVA_CUDA_SYNC", Kind::OneOf, "auto", 0, 0, "spin,block,auto",
     "how a host thread waits for the GPU: spin, block (a blocking-sync event), auto (block once host compute modules run)"},
    {"NERVA_PINNED_HUGEPAGES", Kind::OneOf, "1", 0, 0, "0,1",
     "pinned host arenas on 2 MiB pages where the kernel allows (0: cudaHostAlloc)"},
    {"NERVA_NCCL_PATH", Kind::Path, "", 0, 0, "", "the libnccl to load for multi-GPU runs (default: the system's)"},
    {"NERVA_HOST_THREADS", Kind::Int, "0", 0, INT_MAX, "",
     "host compute threads (0: the CPUs this process may use; at most 256)"},
    {"NERVA_HOST_PIN", Kind::OneOf, "0", 0, 0, "0,1", "pin host compute threads to CPUs"},
    {"NERVA_HOST_SPIN_US", Kind::Int, "1000", 0, INT_MAX, "", "microseconds a host compute worker spins before it sleeps"},
    {"NERVA_HOST_ISA", Kind::OneOf, "", 0, 0, "scalar,avx2,avx512",
     "most capable vector path of the host compute modules (default: the best the CPU has)"},
    {"NERVA_DEVICE_TRACE", Kind::Path, "", 0, 0, "",
     "file the device timeline is written to (builds with -DNERVA_TRACE only)"},
};
constexpr std::size_t kCount = sizeof kTable / sizeof kTable[0];

// Whether `v` is one of the comma-separated `values`.
bool oneOf(const char* values, const char* v) {
  const std::size_t n = std::strlen(v);
  for (const char* p = values; *p;) {
    const char* e = std::strchr(p, ',');
    const std::size_t len = e ? (std::size_t)(e - p) : std::strlen(p);
    if (len == n && std::strncmp(p, v, n) == 0) return true;
    if (!e) break;
    p = e + 1;
  }
  return false;
}

// Whether `v` is a whole number within the knob's bounds (into *out).
bool parseInt(const Knob& k, const char* v, long* out) {
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != 0 || errno == ERANGE || n < k.min || n > k.max) return false;
  *out = n;
  return true;
}

// The environment's value when set and non-empty, else nullptr.
const char* envOf(const Knob& k) {
  const char* v = std::getenv(k.name);
  return v && *v ? v : nullptr;
}

bool valid(const Knob& k, const char* v) {
  long n;
  switch (k.kind) {
    case Kind::Int: return parseInt(k, v, &n);
    case Kind::OneOf: return oneOf(k.values, v);
    case Kind::Path: return true;
  }
  return false;
}

}  // namespace

const Knob* table(std::size_t* count) {
  if (count) *count = kCount;
  return kTable;
}

const Knob* find(const char* name) {
  if (!name) return nullptr;
  for (const Knob& k : kTable)
    if (std::strcmp(k.name, name) == 0) return &k;
  return nullptr;
}

long intValue(const char* name) {
  const Knob* k = find(name);
  if (!k) return 0;
  long n = 0;
  const char* v = envOf(*k);
  if (k->kind == Kind::Int && v && parseInt(*k, v, &n)) return n;
  if (k->kind == Kind::OneOf && v && oneOf(k->values, v)) return std::strtol(v, nullptr, 10);
  return std::strtol(k->dflt, nullptr, 10);
}

const char* textValue(const char* name) {
  const Knob* k = find(name);
  if (!k) return "";
  const char* v = envOf(*k);
  return v && valid(*k, v) ? v : k->dflt;
}

bool validate(char* why, std::size_t whyLen) {
  for (const Knob& k : kTable) {
    const char* v = envOf(k);
    if (!v || valid(k, v)) continue;
    if (why && whyLen) {
      if (k.kind == Kind::Int)
        std::snprintf(why, whyLen, "%s=%s: expected a whole number in %ld..%ld (%s)", k.name, v, k.min, k.max, k.doc);
      else
        std::snprintf(why, whyLen, "%s=%s: expected one of %s (%s)", k.name, v, k.values, k.doc);
    }
    return false;
  }
  return true;
}

}  // namespace nerva::knobs
