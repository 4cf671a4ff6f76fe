// Host channel: a GPU -> host -> GPU round trip inside a stream (and a captured graph) without a
// host function on the critical path. Used where the host computes once per layer near its data
// (host attention over warm KV pages): with cudaLaunchHostFunc each round trip cost about 100 us
// on the H100 machine (host node dispatch plus the staging copies around it), with this about 30
// (tools/gpu/host_sync_bench.cu).
//
// Per enqueue, on the stream: a stage kernel copies the inputs into mapped host memory and, after
// a system-scope fence, bumps the channel's request number in mapped memory; a process-wide server
// thread that spin-polls the live channels sees it, runs the channel's host function, and writes
// the same number to the channel's response word; a wait kernel spins on that word (reads over
// PCIe) and copies the outputs from mapped host memory to the device. The request numbers come
// from a counter in device memory that the stage kernel increments, so a captured graph replays
// with fresh numbers and nothing on the host has to know about replays.
//
// The server runs while a channel exists: it spins for 3 ms after its last request, then polls
// in 20 us naps (longer by the OS timer's slack, ~50 us on Linux: a request after a pause waits at
// most one nap, and an idle context with tiered KV costs a wake-up that often), and sleeps only
// when no channel is left. Nothing on the stream wakes it: a host function beside each round
// trip put 36 host nodes in a token's graph and cost ~1 ms a token (docs/results/kv-tiers.md).
//
// A wait that sees no response for 30 s gives up: its
// outputs are NaN (0x7fc00000 in every word) and the channel's timeout count rises, so a stuck
// host shows as poisoned output and a counter, not a hung GPU.
#pragma once
#include <stddef.h>
#include <stdint.h>

struct CUstream_st;

// A 2-D copy in 4-byte words: rows of `width` words, `srcPitch`/`dstPitch` words apart. Pointers
// are as the device sees them (a mapped host buffer by its device alias).
struct HostChannelCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  uint32_t width = 0;
  uint32_t rows = 0;
  uint32_t dstPitch = 0;
  uint32_t srcPitch = 0;
};

constexpr int kHostChannelMaxCopies = 4;

struct HostChannel;

// Creates a channel whose server calls fn(arg) per request. Allocates its mapped words, its device
// counter and its events (allowed during a relaxed-mode capture). Null on failure (*err set).
HostChannel* nerva_host_channel_create(void (*fn)(void* arg), void* arg, int* err);
// Stops serving the channel (waits for a request in progress) and frees it. The caller makes sure
// no graph that uses it will run again.
void nerva_host_channel_destroy(HostChannel* ch);

// Enqueues the round trip on s: `in` copies (device -> mapped host) and the request, the wait,
// then the `out` copies (mapped host -> device). At most kHostChannelMaxCopies of each. Returns
// the first cudaError_t (0 = queued).
int nerva_host_channel_enqueue(CUstream_st* s, HostChannel* ch, const HostChannelCopy* in, int nIn, const HostChannelCopy* out,
                               int nOut);

// Requests served and waits that timed out, summed over live channels' lifetimes.
struct HostChannelStats {
  uint64_t served = 0;
  uint64_t timeouts = 0;
  uint64_t naps = 0;  // idle polls in naps (the server is awake but nothing came for 3 ms)
};
HostChannelStats nerva_host_channel_stats();

// Kernels (host_channel.cuh, compiled into the kernels unit). reqWord/respWord/timeouts: device
// aliases of mapped host words; counter: device memory.
extern "C" int nerva_host_channel_launch_stage(CUstream_st* s, const HostChannelCopy* in, int nIn, uint32_t* counter,
                                               uint32_t* blocksDone, volatile uint32_t* reqWord);
extern "C" int nerva_host_channel_launch_wait(CUstream_st* s, const HostChannelCopy* out, int nOut, const uint32_t* counter,
                                              const volatile uint32_t* respWord, uint32_t* timeouts, unsigned long long timeoutCycles);
