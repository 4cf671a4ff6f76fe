// Benchmark of the host MLP (packages/cuda-backend/native/host/host_mlp.cc) on the GPU machine: the
// Qwen3-8B MLP shape (H 4096, I 12288) with c host channels, weight bytes read per second
// (3 * c * H * 2 bytes per call), alone and while a concurrent cudaMemcpyAsync loop copies a 1 GiB
// pinned buffer to the device over and over (how the CPU and the DMA share DRAM bandwidth).
// Built and run by `bash tools/gpu/run.sh hostmlp`; one JSON object per line on stdout:
//   probe "hostmlp"          one configuration: c, rows, threads, pinned, isa, overlap -> gemv_gbps
//                            (and h2d_gbps measured during the same window when overlap is true)
//   probe "hostmlp_h2d"      the copy loop alone (the H2D rate without CPU traffic)
//   probe "hostmlp_wake"     per-call time with idle gaps (workers asleep) vs back to back
//   probe "hostmlp_enqueue"  nerva_host_mlp_enqueue on a stream and from a CUDA graph: the same y
//                            as a direct call (bitwise), and the per-call time through the stream
// Weights sit in pinned memory (as in the engine) and every call reads a different layer's copy
// out of a 1.5 GiB region, so the CPU caches do not hold them (DRAM bandwidth, not L3).
//   host_mlp_bench [--cpu-only] [--seconds S]
//   --cpu-only: no CUDA at all (no overlap, no enqueue, weights in ordinary memory): for a
//   machine without a GPU. NERVA_BENCH_THREADS="16 8" and NERVA_BENCH_PIN="0 1" override the lists.
#include <cuda_runtime.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "host_mlp.h"

namespace {

using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

#define CK(call)                                                                                        \
  do {                                                                                                  \
    cudaError_t e_ = (call);                                                                            \
    if (e_ != cudaSuccess) {                                                                            \
      std::printf("{\"probe\":\"hostmlp_error\",\"call\":\"%s\",\"error\":\"%s\"}\n", #call, cudaGetErrorName(e_)); \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

bool gCpuOnly = false;
double gSeconds = 1.0;
const int H = 4096;
const int I = 12288;
const size_t kWeightRegion = (size_t)3 << 29;  // 1.5 GiB of layers
const size_t kCopyBytes = (size_t)1 << 30;     // the H2D loop's buffer

std::vector<int> intList(const char* env, std::vector<int> dflt) {
  const char* v = std::getenv(env);
  if (!v || !*v) return dflt;
  std::vector<int> out;
  std::istringstream in(v);
  for (int n; in >> n;) out.push_back(n);
  return out.empty() ? dflt : out;
}

void* hostAlloc(size_t bytes) {
  void* p = nullptr;
  if (gCpuOnly) {
    p = std::aligned_alloc(4096, bytes);
    if (!p) {
      std::printf("{\"probe\":\"hostmlp_error\",\"error\":\"out of host memory\"}\n");
      std::exit(1);
    }
  } else {
    CK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  }
  return p;
}

// Random normal-range bf16 values in [-0.05, 0.05) (no denormals).
void fillBf16(uint16_t* p, size_t n, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    float f = ((float)(s >> 40) / 16777216.0f - 0.5f) * 0.1f;
    if (std::fabs(f) < 1e-6f) f = 1e-3f;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    p[i] = (uint16_t)(u >> 16);
  }
}

struct Buffers {
  uint16_t* weights = nullptr;  // kWeightRegion bytes
  float* x = nullptr;
  float* normW = nullptr;
  float* y = nullptr;
  void* copySrc = nullptr;  // pinned, kCopyBytes
  void* copyDst = nullptr;  // device, kCopyBytes
};

HostMlpArgs argsFor(const Buffers& b, int rows, int c, size_t layer) {
  HostMlpArgs a;
  a.rows = rows;
  a.hidden = H;
  a.inter = c;
  a.eps = 1e-6f;
  a.x = b.x;
  a.normW = b.normW;
  size_t layerElems = (size_t)3 * c * H;
  a.gateUp = b.weights + layer * layerElems;
  a.down = a.gateUp + (size_t)2 * c * H;
  a.y = b.y;
  return a;
}

size_t layersFor(int c) { return kWeightRegion / ((size_t)3 * c * H * 2); }

// The H2D loop: copies the 1 GiB buffer again and again until stopped, one copy in flight,
// recording each copy's host-clock start and end.
struct Copier {
  std::atomic<bool> stop{false};
  std::vector<std::pair<double, double>> spans;  // seconds since t0
  std::thread th;
  void start(const Buffers& b, Clock::time_point t0) {
    stop = false;
    spans.clear();
    th = std::thread([this, &b, t0] {
      cudaStream_t s;
      CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      while (!stop.load()) {
        double a = secondsSince(t0);
        CK(cudaMemcpyAsync(b.copyDst, b.copySrc, kCopyBytes, cudaMemcpyHostToDevice, s));
        CK(cudaStreamSynchronize(s));
        spans.push_back({a, secondsSince(t0)});
      }
      CK(cudaStreamDestroy(s));
    });
  }
  // GB/s over the copies lying wholly inside [w0, w1]; count of them in *n.
  double finish(double w0, double w1, int* n) {
    stop = true;
    th.join();
    double bytes = 0, secs = 0;
    *n = 0;
    for (auto& sp : spans)
      if (sp.first >= w0 && sp.second <= w1) {
        bytes += (double)kCopyBytes;
        secs += sp.second - sp.first;
        (*n)++;
      }
    return secs > 0 ? bytes / secs / 1e9 : 0;
  }
};

struct Timing {
  int calls = 0;
  double secs = 0, mean = 0, median = 0, min = 0, p90 = 0;
};

// Calls the MLP on rotating layers for at least `seconds` (after 2 warm-up calls); gapUs > 0
// sleeps that long between calls (the pool's workers fall asleep).
Timing timeCalls(const Buffers& b, int rows, int c, double seconds, int gapUs, Clock::time_point t0, double* w0, double* w1) {
  const size_t nl = layersFor(c);
  size_t layer = 0;
  for (int i = 0; i < 2; i++) nerva_host_mlp(argsFor(b, rows, c, layer++ % nl));
  std::vector<double> ms;
  *w0 = secondsSince(t0);
  double busy = 0;
  while (secondsSince(t0) - *w0 < seconds || ms.size() < 5) {
    if (gapUs > 0) std::this_thread::sleep_for(std::chrono::microseconds(gapUs));
    HostMlpArgs a = argsFor(b, rows, c, layer++ % nl);
    Clock::time_point c0 = Clock::now();
    nerva_host_mlp(a);
    double s = secondsSince(c0);
    busy += s;
    ms.push_back(s * 1e3);
  }
  *w1 = secondsSince(t0);
  Timing t;
  t.calls = (int)ms.size();
  t.secs = busy;
  t.mean = busy * 1e3 / ms.size();
  std::sort(ms.begin(), ms.end());
  t.median = ms[ms.size() / 2];
  t.min = ms.front();
  t.p90 = ms[(ms.size() * 9) / 10];
  return t;
}

int availableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return (int)std::thread::hardware_concurrency();
}

void config(const Buffers& b, int c, int rows, int threads, int pin, int isa, bool overlap, const char* tag) {
  nerva_host_mlp_configure(threads, pin);
  nerva_host_mlp_set_isa(isa);
  nerva_host_mlp_reserve(rows, H, c);
  Clock::time_point t0 = Clock::now();
  Copier cp;
  if (overlap) {
    cp.start(b, t0);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the copies under way
  }
  double w0 = 0, w1 = 0;
  // With the copy loop, a window long enough for ~25 whole copies of 1 GiB at ~50 GB/s.
  Timing t = timeCalls(b, rows, c, overlap ? std::max(gSeconds, 0.6) : gSeconds, 0, t0, &w0, &w1);
  int copies = 0;
  double h2d = overlap ? cp.finish(w0, w1, &copies) : 0;
  const double bytes = 3.0 * c * H * 2;
  HostMlpStats st = nerva_host_mlp_stats();
  std::printf(
      "{\"probe\":\"hostmlp\",\"set\":\"%s\",\"hidden\":%d,\"intermediate\":%d,\"c\":%d,\"rows\":%d,\"threads\":%d,"
      "\"pinned\":%s,\"isa\":\"%s\",\"overlap\":%s,\"weight_bytes_per_call\":%.0f,\"calls\":%d,\"ms_per_call\":%.4f,"
      "\"ms_median\":%.4f,\"ms_min\":%.4f,\"ms_p90\":%.4f,\"gemv_gbps\":%.2f,",
      tag, H, I, c, rows, st.threads, st.pinned ? "true" : "false", nerva_host_isa_name(st.isa),
      overlap ? "true" : "false", bytes, t.calls, t.mean, t.median, t.min, t.p90, bytes * t.calls / t.secs / 1e9);
  if (overlap) std::printf("\"h2d_gbps\":%.2f,\"h2d_copies\":%d,", h2d, copies);
  else std::printf("\"h2d_gbps\":null,");
  std::printf("\"layers_rotated\":%zu,\"cpus\":%d}\n", layersFor(c), availableCpus());
  std::fflush(stdout);
}

void h2dAlone(const Buffers& b) {
  Clock::time_point t0 = Clock::now();
  Copier cp;
  cp.start(b, t0);
  std::this_thread::sleep_for(std::chrono::milliseconds((int)(std::max(gSeconds, 0.6) * 1000) + 50));
  int copies = 0;
  double gbps = cp.finish(0.0, secondsSince(t0), &copies);
  std::printf("{\"probe\":\"hostmlp_h2d\",\"bytes_per_copy\":%zu,\"copies\":%d,\"h2d_gbps\":%.2f}\n", kCopyBytes, copies, gbps);
  std::fflush(stdout);
}

void wake(const Buffers& b, int threads) {
  const int c = 4096, rows = 1;
  nerva_host_mlp_configure(threads, 0);
  nerva_host_mlp_reserve(rows, H, c);
  Clock::time_point t0 = Clock::now();
  double w0, w1;
  Timing hot = timeCalls(b, rows, c, gSeconds / 2, 0, t0, &w0, &w1);
  Timing cold = timeCalls(b, rows, c, gSeconds / 2, 2000, t0, &w0, &w1);
  const char* spin = std::getenv("NERVA_HOST_SPIN_US");
  std::printf(
      "{\"probe\":\"hostmlp_wake\",\"c\":%d,\"rows\":%d,\"threads\":%d,\"spin_us\":%s,\"gap_us\":2000,"
      "\"ms_median_back_to_back\":%.4f,\"ms_median_after_gap\":%.4f,\"ms_p90_after_gap\":%.4f}\n",
      c, rows, threads, spin ? spin : "100", hot.median, cold.median, cold.p90);
  std::fflush(stdout);
}

void enqueueCheck(const Buffers& b, int threads) {
  const int c = 4096, rows = 4, n = 20;
  nerva_host_mlp_configure(threads, 0);
  nerva_host_mlp_reserve(rows, H, c);
  HostMlpArgs a = argsFor(b, rows, c, 0);
  nerva_host_mlp(a);
  std::vector<float> ref(b.y, b.y + (size_t)rows * H);
  Clock::time_point t0 = Clock::now();
  for (int i = 0; i < n; i++) nerva_host_mlp(a);
  double directMs = secondsSince(t0) * 1e3 / n;

  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::fill(b.y, b.y + (size_t)rows * H, std::nanf(""));
  t0 = Clock::now();
  for (int i = 0; i < n; i++) CK((cudaError_t)nerva_host_mlp_enqueue(s, &a));
  CK(cudaStreamSynchronize(s));
  double streamMs = secondsSince(t0) * 1e3 / n;
  bool streamOk = std::memcmp(ref.data(), b.y, ref.size() * 4) == 0;

  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CK((cudaError_t)nerva_host_mlp_enqueue(s, &a));
  cudaGraph_t g;
  CK(cudaStreamEndCapture(s, &g));
  size_t nodes = 0;
  CK(cudaGraphGetNodes(g, nullptr, &nodes));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  std::fill(b.y, b.y + (size_t)rows * H, std::nanf(""));
  t0 = Clock::now();
  for (int i = 0; i < n; i++) CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  double graphMs = secondsSince(t0) * 1e3 / n;
  bool graphOk = std::memcmp(ref.data(), b.y, ref.size() * 4) == 0;
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(s));
  std::printf(
      "{\"probe\":\"hostmlp_enqueue\",\"c\":%d,\"rows\":%d,\"threads\":%d,\"stream_matches_direct\":%s,"
      "\"graph_matches_direct\":%s,\"graph_nodes\":%zu,\"ms_direct\":%.4f,\"ms_stream\":%.4f,\"ms_graph\":%.4f}\n",
      c, rows, threads, streamOk ? "true" : "false", graphOk ? "true" : "false", nodes, directMs, streamMs, graphMs);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--cpu-only")) gCpuOnly = true;
    else if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) gSeconds = std::atof(argv[++i]);
  }
  if (!gCpuOnly) {
    CK(cudaSetDevice(0));
    // The copy loop's thread sleeps in cudaStreamSynchronize instead of spinning on a core the
    // pool needs.
    CK(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync));
  }
  Buffers b;
  b.weights = (uint16_t*)hostAlloc(kWeightRegion);
  fillBf16(b.weights, kWeightRegion / 2, 1);
  b.x = (float*)hostAlloc(sizeof(float) * 8 * H);
  b.normW = (float*)hostAlloc(sizeof(float) * H);
  b.y = (float*)hostAlloc(sizeof(float) * 8 * H);
  for (int i = 0; i < 8 * H; i++) b.x[i] = std::sin(0.37f * i) * 2.0f;
  for (int i = 0; i < H; i++) b.normW[i] = 1.0f + 0.25f * std::cos(0.11f * i);
  if (!gCpuOnly) {
    b.copySrc = hostAlloc(kCopyBytes);
    std::memset(b.copySrc, 1, kCopyBytes);
    CK(cudaMalloc(&b.copyDst, kCopyBytes));
  }

  int best = HOST_ISA_SCALAR;
  for (int i = HOST_ISA_SCALAR; i <= HOST_ISA_AVX512; i++)
    if (nerva_host_isa_supported(i)) best = i;
  const std::vector<int> threadList = intList("NERVA_BENCH_THREADS", {16, 8});
  const std::vector<int> pinList = intList("NERVA_BENCH_PIN", {0, 1});
  const int cs[] = {2048, 4096, 6144, 12288};
  const int rowsList[] = {1, 4};

  if (!gCpuOnly) h2dAlone(b);
  for (int overlap = 0; overlap < (gCpuOnly ? 1 : 2); overlap++)
    for (int threads : threadList)
      for (int pin : pinList)
        for (int c : cs)
          for (int rows : rowsList) config(b, c, rows, threads, pin, best, overlap == 1, "main");
  // The vector paths side by side, on the largest slice.
  for (int isa = HOST_ISA_SCALAR; isa <= HOST_ISA_AVX512; isa++)
    if (nerva_host_isa_supported(isa))
      for (int rows : rowsList) config(b, I, rows, threadList[0], 0, isa, false, "isa");
  wake(b, threadList[0]);
  if (!gCpuOnly) {
    enqueueCheck(b, threadList[0]);
    h2dAlone(b);  // again at the end: the copy rate did not drift
  }
  return 0;
}
