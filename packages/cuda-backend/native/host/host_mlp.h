// Host MLP ("compute near data"): part of a streamed decoder layer's MLP computed on the CPU,
// where its weights already sit in pinned host memory, while the GPU computes the rest.
//
//   xn   = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * normW      RMSNorm (sum of squares in f64)
//   g, u = gate . xn, up . xn                                   the host's c intermediate channels
//   a    = silu(g) * u                                          silu(v) = v / (1 + exp(-v))
//   y[r] = down . a                                             y is written, not accumulated
//
// Plain C++17 (no CUDA in the math, no napi): compiled by g++ with host_pool.cc, isa.cc and
// ../common/knobs.cc into the addon and
// into the standalone test (test/native/host_mlp_test.cc) and benchmark (tools/gpu/host_mlp_bench.cc).
// Define NERVA_HOST_MLP_NO_CUDA to build without the CUDA runtime (drops nerva_host_mlp_enqueue).
//
// The math is memory-bound (the weights are read once per call, rows is 1..8): every weight row
// is converted bf16 -> f32 once and multiplied against all rows, and each kernel pass takes up to
// 4 weight rows at once so the activations (L2-resident) are loaded once per 4 weight rows. The
// result is bitwise reproducible for a given ISA and thread count-independent (each output is
// summed by one thread in a fixed order, whichever thread that is). Vector paths: AVX-512, AVX2 +
// FMA, and scalar, chosen at run time by the ISA layer (isa.h); elsewhere than x86 only the scalar
// path exists.
//
// Threads: the process-wide host pool (host_pool.h), shared with host attention: NERVA_HOST_THREADS
// threads (default: the CPUs of the process's affinity mask), the calling thread being one of
// them; idle workers spin NERVA_HOST_SPIN_US microseconds (default 1000), then sleep;
// NERVA_HOST_PIN=1 pins them. Work is split into chunks taken from an atomic counter (gate/up by
// output channel, down by output row of H), so a descheduled thread delays only its current
// chunk; the phases (RMSNorm, gate/up, down) are separated by the pool's barriers.
// NERVA_HOST_ISA=scalar|avx2|avx512 caps the vector path. Calls are serialized (one pool), host
// attention's included.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "isa.h"

// Optional per-args counters (nerva_host_mlp adds to them, plain stores: read them between calls).
struct HostMlpCounters {
  uint64_t calls = 0;
  uint64_t ns = 0;  // wall time inside nerva_host_mlp, including the wait for the pool
};

struct HostMlpArgs {
  int rows = 0;    // >= 1 (any number; 1..8 is the designed case, larger counts reload weights per 8 rows)
  int hidden = 0;  // H >= 1
  int inter = 0;   // c >= 0: the intermediate channels computed here (0: y = 0)
  float eps = 1e-6f;
  const float* x = nullptr;         // f32 [rows, H]
  const float* normW = nullptr;     // f32 [H]
  const uint16_t* gateUp = nullptr;  // bf16 [2c, H]: c gate rows, then c up rows
  const uint16_t* down = nullptr;    // bf16 [H, c]: H rows of c
  float* y = nullptr;               // f32 [rows, H], written
  HostMlpCounters* counters = nullptr;  // optional
};

// Computes the MLP for a (on the calling thread plus the pool). Blocks until y is written.
// Allocates nothing once nerva_host_mlp_reserve has covered the shape (it grows its scratch on
// the first call of a larger shape otherwise). Arguments must pass nerva_host_mlp_validate.
void nerva_host_mlp(const HostMlpArgs& a);

// Null when a is well-formed, else why not (a static string).
const char* nerva_host_mlp_validate(const HostMlpArgs& a);

// Grows the scratch for rows x hidden and rows x inter (call it where allocating is fine;
// nerva_host_mlp itself then never allocates). Creates the host pool if needed.
void nerva_host_mlp_reserve(int rows, int hidden, int inter);

// Process-wide counters and configuration.
struct HostMlpStats {
  uint64_t calls;
  uint64_t ns;
  int threads;  // the host pool's size, the calling thread included
  int isa;      // HostIsa in use (isa.h)
  bool pinned;  // the host pool's workers are pinned
};
HostMlpStats nerva_host_mlp_stats();
// Selects the vector path (tests, benchmarks). Returns the isa now in use, or -1 (unchanged)
// when it is not supported here.
int nerva_host_mlp_set_isa(int isa);
// Re-creates the host pool with `threads` threads (<= 0: the default) and pinning on or off
// (pin < 0: NERVA_HOST_PIN). Waits for a running call. The pool is shared: this sizes host
// attention's threads too (nerva_host_pool_configure). For benchmarks and tests.
void nerva_host_mlp_configure(int threads, int pin);

#ifndef NERVA_HOST_MLP_NO_CUDA
struct CUstream_st;  // cudaStream_t is CUstream_st*
// Enqueues nerva_host_mlp(*a) on stream s with cudaLaunchHostFunc: work queued after it on s
// waits for it, work before it is complete (and its writes to host memory visible) when it runs,
// and it can be captured into a CUDA graph. `a` (and what it points to) must stay valid until the
// call has run, and for as long as any graph captured with it exists: the caller owns it. The
// host function runs on a CUDA runtime thread and must not call CUDA (it does not); while it runs,
// the stream (and a graph launched on it) is blocked. Returns the cudaError_t (0 = queued).
int nerva_host_mlp_enqueue(CUstream_st* s, const HostMlpArgs* a);

// The addon's pinned arena: its host view and the device view JavaScript sees (they coincide
// under unified addressing).
struct HostMlpArena {
  char* host;
  char* dev;
  size_t bytes;
};
// Fills a from { rows, hidden, inter, eps, x, normW, gateUp, down, y } as numbers (addresses as
// JS numbers, 0 = none): an address in the arena's device view maps to its host view, a buffer
// starting in the arena must end in it, device memory is refused (the CPU would fault on it).
// Returns false with the reason in why. Calls CUDA (cudaPointerGetAttributes): not for host functions.
bool nerva_host_mlp_resolve(HostMlpArgs* a, const double v[9], const HostMlpArena& arena, char* why, size_t whyLen);
#endif
