// The knob table (knobs.h): every environment name the native code reads, declared once.
#include "knobs.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace nerva::knobs {
namespace {

constexpr long kIntMax = 2147483647;

// Keep a knob only where a user or operator would set it; a default here is the behaviour with
// the variable unset.
const Knob kTable[] = {
    {"NERVA_CUDA_SYNC", Kind::OneOf, "auto", 0, 0, "spin,block,auto",
     "how synchronize waits: spin, block (a blocking-sync event: the thread sleeps), or auto (block while the context has host compute modules)"},
    {"NERVA_PINNED_HUGEPAGES", Kind::OneOf, "1", 0, 0, "0,1",
     "pinned arenas on anonymous memory advised for 2 MiB pages, then registered (0: cudaHostAlloc)"},
    {"NERVA_NCCL_PATH", Kind::Path, "", 0, 0, 0,
     "libnccl.so.2, or the directory holding it, tried before the loader's search path"},
    {"NERVA_HOST_THREADS", Kind::Int, "0", 0, kIntMax, 0,
     "host compute threads (0: three less than the CPUs this process may use, at least 1; at most 256)"},
    {"NERVA_HOST_PIN", Kind::OneOf, "0", 0, 0, "0,1", "pin host compute worker threads to CPUs"},
    {"NERVA_HOST_SPIN_US", Kind::Int, "1000", 0, kIntMax, 0, "microseconds an idle host compute worker spins before it sleeps"},
    {"NERVA_HOST_ISA", Kind::OneOf, "avx512", 0, 0, "scalar,avx2,avx512",
     "most capable vector path of the host compute modules (the CPU's best up to this)"},
    {"NERVA_DEVICE_TRACE", Kind::Path, "", 0, 0, 0,
     "file the device timeline is written to when the backend is disposed (builds with -DNERVA_TRACE only)"},
};
constexpr std::size_t kCount = sizeof kTable / sizeof kTable[0];

// The environment's value of k when set and non-empty, else nullptr.
const char* envOf(const Knob& k) {
  const char* v = std::getenv(k.name);
  return v && *v ? v : nullptr;
}

// Whether `v` is one of the comma-separated `values`.
bool oneOf(const char* values, const char* v) {
  const std::size_t n = std::strlen(v);
  for (const char* p = values; p && *p;) {
    const char* end = std::strchr(p, ',');
    const std::size_t len = end ? (std::size_t)(end - p) : std::strlen(p);
    if (len == n && std::strncmp(p, v, n) == 0) return true;
    p = end ? end + 1 : nullptr;
  }
  return false;
}

// A whole decimal number in [min, max] (digits only: no sign, blanks or fraction).
bool parseInt(const Knob& k, const char* v, long* out) {
  for (const char* p = v; *p; p++)
    if (*p < '0' || *p > '9') return false;
  errno = 0;
  const long n = std::strtol(v, nullptr, 10);
  if (errno == ERANGE || n < k.min || n > k.max) return false;
  *out = n;
  return true;
}

bool valid(const Knob& k, const char* v) {
  long n;
  switch (k.kind) {
    case Kind::Int:
      return parseInt(k, v, &n);
    case Kind::OneOf:
      return oneOf(k.values, v);
    case Kind::Path:
      return true;
  }
  return false;
}

}  // namespace

const Knob* table(std::size_t* count) {
  if (count) *count = kCount;
  return kTable;
}

const Knob* find(const char* name) {
  for (const Knob& k : kTable)
    if (std::strcmp(k.name, name) == 0) return &k;
  return nullptr;
}

const char* textValue(const char* name) {
  const Knob* k = find(name);
  if (!k) return "";
  const char* v = envOf(*k);
  return v && valid(*k, v) ? v : k->dflt;
}

long intValue(const char* name) {
  const Knob* k = find(name);
  if (!k) return 0;
  const char* v = textValue(name);
  if (k->kind == Kind::Int) {
    long n = 0;
    return parseInt(*k, v, &n) ? n : std::strtol(k->dflt, nullptr, 10);
  }
  return std::strtol(v, nullptr, 10);  // a OneOf of numbers ("0,1")
}

bool validate(char* why, std::size_t whyLen) {
  for (const Knob& k : kTable) {
    const char* v = envOf(k);
    if (!v || valid(k, v)) continue;
    if (why && whyLen) {
      if (k.kind == Kind::Int)
        std::snprintf(why, whyLen, "%s: must be an integer in [%ld, %ld] or unset, got \"%s\" (%s)", k.name, k.min, k.max, v, k.doc);
      else
        std::snprintf(why, whyLen, "%s: must be one of %s or unset, got \"%s\" (%s)", k.name, k.values, v, k.doc);
    }
    return false;
  }
  return true;
}

}  // namespace nerva::knobs
