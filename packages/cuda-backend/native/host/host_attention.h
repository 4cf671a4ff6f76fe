// Host attention ("compute near data" for KV): paged attention over a KV cache that lives in
// pinned host memory (the warm tier of tiered KV), computed by the CPU where the pages lie, so
// only q (in) and the partial result (out, lse) cross PCIe instead of the pages.
//
// The math is op `attention` of @nerva/core in exact numerics: row r (sequence rowSeq[r], position
// positions[r]) attends to its positions lo..positions[r] (lo = 0, or positions[r] - window + 1);
// a block-table entry < 0 is a block that is not in this cache and is skipped. Scores are
// (q . k) * scale in float32, softmax by the online rule (running max, sum, rescaled accumulator,
// float32), out = acc / sum, and lse = max + ln(sum) (-inf, out = 0, when no position remains).
//
// Plain C++17 (no CUDA in the math, no napi), built with host_pool.cc, isa.cc and
// ../common/knobs.cc into the addon and into the standalone test (test/native/host_attention_test.cc). Define NERVA_HOST_ATTN_NO_CUDA to build without the CUDA
// runtime. Work: tasks of (row, split of the positions), each computing the partials of every
// query head over every KV head so each key and value row is read once, then (after the pool's
// barrier) a merge per (row, head), on the process-wide host pool shared with the host MLP
// (host_pool.h: NERVA_HOST_THREADS threads, default the CPUs of the affinity mask; idle workers
// spin NERVA_HOST_SPIN_US, default 1000, then sleep; calls are serialized with the host MLP's).
// The inner loops (GCC vector extensions) are compiled for AVX-512, AVX2+FMA and the baseline,
// and the ISA layer (isa.h, capped by NERVA_HOST_ISA as for the host MLP) picks one; their exp is a polynomial within 1 ulp (weights below FLT_MIN are 0).
// The result does not depend on the thread count (each partial is computed by one thread over a
// fixed split, and the merge is in split order).
#pragma once
#include <stddef.h>
#include <stdint.h>

enum HostAttnDType { HOST_ATTN_F32 = 0, HOST_ATTN_BF16 = 1, HOST_ATTN_F16 = 2 };

struct HostAttnCounters {
  uint64_t calls = 0;
  uint64_t ns = 0;        // wall time inside nerva_host_attention
  uint64_t keys = 0;      // (row, KV head, position) triples read
  uint64_t badBlocks = 0;  // block ids outside the cache (the row's outputs are NaN)
};

struct HostAttnArgs {
  int rows = 0;
  int numHeads = 0;
  int numKvHeads = 0;
  int headDim = 0;     // 1..256
  int blockSize = 0;
  int maxBlocksPerSeq = 0;
  int numSeqs = 0;     // block tables held: tables is [numSeqs, maxBlocksPerSeq]
  long long numBlocks = 0;  // blocks the cache holds
  int window = 0;      // 0: full causal attention
  float scale = 1.f;
  int kvDtype = HOST_ATTN_F32;
  const void* k = nullptr;  // [numBlocks * blockSize, numKvHeads * headDim]
  const void* v = nullptr;
  const float* q = nullptr;  // [rows, numHeads * headDim] (packed)
  const int* tables = nullptr;
  const int* rowSeq = nullptr;
  const int* positions = nullptr;
  float* out = nullptr;  // [rows, numHeads * headDim]
  float* lse = nullptr;  // [rows * numHeads], optional
  HostAttnCounters* counters = nullptr;
};

// Null when a is well-formed (shapes, pointers), else why not (a static string). Indices read
// from the tables are checked as they are used: a row whose sequence, position or a block id is
// out of range gets NaN outputs and counts in badBlocks (a host function cannot raise).
const char* nerva_host_attention_validate(const HostAttnArgs& a);

// Grows the scratch for up to `rows` rows of this shape (where allocating is fine); a call of
// that shape or smaller then allocates nothing.
void nerva_host_attention_reserve(int rows, int numHeads, int numKvHeads, int headDim);

// Computes on the calling thread plus the host pool; blocks until out (and lse) are written.
void nerva_host_attention(const HostAttnArgs& a);

// Re-creates the host pool with `threads` threads (<= 0: the default), pinning as NERVA_HOST_PIN.
// The pool is shared: this sizes the host MLP's threads too (nerva_host_pool_configure). Tests
// and benchmarks.
void nerva_host_attention_configure(int threads);
int nerva_host_attention_threads();  // the host pool's size, the calling thread included

#ifndef NERVA_HOST_ATTN_NO_CUDA
struct CUstream_st;
struct HostChannel;
// What the stream-ordered form copies around the host computation: q rows from the device
// (qStride floats apart, heads at qOffset) into a.q, the int buffers into a.tables/rowSeq/
// positions (host scratch the caller owns), and afterwards a.out (and a.lse) to outDst (lseDst).
// The copies are kernels of the host channel (host_channel.h) through mapped memory: they need the
// device aliases of the host buffers (qDev: a.q; intsDev: a.tables, with rowSeq and positions
// right after it as the caller lays them out; outHostDev, lseHostDev) and the channel. A
// cudaLaunchHostFunc round trip cost about 100 us against the channel's 30 and is gone.
struct HostAttnStage {
  const float* qSrc = nullptr;
  int qStride = 0;
  int qOffset = 0;
  const int* tablesSrc = nullptr;
  const int* rowSeqSrc = nullptr;
  const int* positionsSrc = nullptr;
  float* outDst = nullptr;
  float* lseDst = nullptr;  // with a.lse
  float* qDev = nullptr;
  int* intsDev = nullptr;
  const float* outHostDev = nullptr;
  const float* lseHostDev = nullptr;
  HostChannel* channel = nullptr;
};
// Enqueues on s the whole round trip through st->channel: inputs to the host,
// nerva_host_attention(*a), outputs back (capturable into a graph). `a` and `st` must outlive every graph captured with them. Returns
// the first cudaError_t (0 = queued).
int nerva_host_attention_enqueue(CUstream_st* s, const HostAttnArgs* a, const HostAttnStage* st);
// The host function a channel for `a` calls (pass &args as its arg).
void nerva_host_attention_channel_fn(void* args);
#endif
