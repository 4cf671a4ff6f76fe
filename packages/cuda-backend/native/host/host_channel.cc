// Host channel: see host_channel.h.
#include "host_channel.h"

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "host_util.h"

namespace {

using Clock = std::chrono::steady_clock;

using nerva_host::cpuRelax;

// How long the server spins after its last request before it polls in naps, the nap, and how
// long a device wait gives up after (its outputs then NaN): measured defaults, not settings.
constexpr int64_t kServerSpinNs = 3000 * 1000;
constexpr int kIdleNapUs = 20;
constexpr unsigned long long kWaitTimeoutMs = 30000;

// The words the GPU and the host share, in mapped pinned memory, each on its own cache line.
struct alignas(64) Words {
  volatile uint32_t req;  // written by the stage kernel
  uint32_t pad0[15];
  volatile uint32_t resp;  // written by the server
  uint32_t pad1[15];
  volatile uint32_t timeouts;  // written by the wait kernel
  uint32_t pad2[15];
};

}  // namespace

struct HostChannel {
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
  Words* words = nullptr;      // host view
  Words* wordsDev = nullptr;   // device alias
  uint32_t* counter = nullptr;  // device memory: [0] the last request number, [1] the stage kernel's block count
  uint32_t served = 0;  // the last request number answered (server thread only)
  uint64_t servedCount = 0;
  unsigned long long timeoutCycles = 0;
};

namespace {

struct Server {
  std::mutex mu;  // guards channels and the sweep (create/destroy wait for a sweep in progress)
  std::condition_variable cv;
  std::vector<HostChannel*> channels;
  std::atomic<int64_t> lastActivityNs{0};
  std::atomic<uint64_t> naps{0}, servedRetired{0}, timeoutsRetired{0};
  int64_t spinNs = kServerSpinNs;
  std::thread thread;

  Server() { thread = std::thread([this] { loop(); }); thread.detach(); }

  static int64_t now() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

  void loop() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      bool any = false;
      for (HostChannel* ch : channels) {
        const uint32_t r = ch->words->req;
        if (r == ch->served) continue;
        std::atomic_thread_fence(std::memory_order_acquire);  // the inputs were written before the number
        ch->fn(ch->arg);
        std::atomic_thread_fence(std::memory_order_seq_cst);  // the outputs before the response
        ch->words->resp = r;
        ch->served = r;
        ch->servedCount++;
        any = true;
      }
      if (any) {
        lastActivityNs.store(now(), std::memory_order_relaxed);
        continue;
      }
      if (channels.empty()) {
        // No channel to serve: sleep until one is created.
        cv.wait(lk, [this] { return !channels.empty(); });
        continue;
      }
      // Spin with the lock released now and then, so create/destroy get in; past the spin
      // window, poll in short naps (a request then waits at most one nap).
      const bool idle = now() - lastActivityNs.load(std::memory_order_relaxed) > spinNs;
      lk.unlock();
      if (idle) {
        naps.fetch_add(1, std::memory_order_relaxed);
        std::this_thread::sleep_for(std::chrono::microseconds(kIdleNapUs));
      } else
        for (int i = 0; i < 32; i++) cpuRelax();
      lk.lock();
    }
  }
};

Server& server() {
  static Server* s = new Server();  // never destroyed: the thread may be mid-sweep at exit
  return *s;
}

}  // namespace

HostChannel* nerva_host_channel_create(void (*fn)(void*), void* arg, int* err) {
  *err = 0;
  auto* ch = new HostChannel();
  ch->fn = fn;
  ch->arg = arg;
  // Allocation is not a stream operation: allowed (relaxed mode) while a graph is captured.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaError_t e = cudaHostAlloc((void**)&ch->words, sizeof(Words), cudaHostAllocMapped | cudaHostAllocPortable);
  if (e == cudaSuccess) {
    std::memset((void*)ch->words, 0, sizeof(Words));
    e = cudaHostGetDevicePointer((void**)&ch->wordsDev, ch->words, 0);
  }
  if (e == cudaSuccess) e = cudaMalloc((void**)&ch->counter, 2 * sizeof(uint32_t));
  if (e == cudaSuccess) e = cudaMemset(ch->counter, 0, 2 * sizeof(uint32_t));
  if (e == cudaSuccess) {
    int dev = 0, khz = 0;
    cudaGetDevice(&dev);
    e = cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev);
    ch->timeoutCycles = (unsigned long long)(khz > 0 ? khz : 2000000) * kWaitTimeoutMs;
  }
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (e != cudaSuccess) {
    *err = (int)e;
    nerva_host_channel_destroy(ch);
    return nullptr;
  }
  Server& s = server();
  {
    std::lock_guard<std::mutex> g(s.mu);
    s.channels.push_back(ch);
  }
  s.cv.notify_one();
  return ch;
}

void nerva_host_channel_destroy(HostChannel* ch) {
  if (!ch) return;
  {
    Server& s = server();
    std::lock_guard<std::mutex> g(s.mu);  // not mid-sweep
    for (size_t i = 0; i < s.channels.size(); i++)
      if (s.channels[i] == ch) {
        s.channels.erase(s.channels.begin() + (long)i);
        s.servedRetired += ch->servedCount;
        s.timeoutsRetired += ch->words ? ch->words->timeouts : 0;
        break;
      }
  }
  if (ch->counter) cudaFree(ch->counter);
  if (ch->words) cudaFreeHost((void*)ch->words);
  delete ch;
}

int nerva_host_channel_enqueue(CUstream_st* s, HostChannel* ch, const HostChannelCopy* in, int nIn, const HostChannelCopy* out,
                               int nOut) {
  if (!ch || nIn < 0 || nOut < 0 || nIn > kHostChannelMaxCopies || nOut > kHostChannelMaxCopies) return (int)cudaErrorInvalidValue;
  int rc = nerva_host_channel_launch_stage(s, in, nIn, ch->counter, ch->counter + 1, &ch->wordsDev->req);
  if (rc) return rc;
  return nerva_host_channel_launch_wait(s, out, nOut, ch->counter, &ch->wordsDev->resp, (uint32_t*)&ch->wordsDev->timeouts, ch->timeoutCycles);
}

HostChannelStats nerva_host_channel_stats() {
  Server& s = server();
  std::lock_guard<std::mutex> g(s.mu);
  HostChannelStats t;
  t.served = s.servedRetired;
  t.timeouts = s.timeoutsRetired;
  for (HostChannel* ch : s.channels) {
    t.served += ch->servedCount;
    t.timeouts += ch->words->timeouts;
  }
  t.naps = s.naps.load();
  return t;
}
