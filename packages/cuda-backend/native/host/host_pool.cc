// The host compute pool shared by the host MLP and host attention: see host_pool.h.
#include "host_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "host_util.h"
#include "knobs.h"

#ifdef __linux__
#include <pthread.h>
#include <sched.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

using nerva_host::cpuRelax;

int defaultThreads() {
  int n = (int)nerva::knobs::intValue("NERVA_HOST_THREADS");
  if (n > 0) return n > 256 ? 256 : n;
#ifdef __linux__
  cpu_set_t set;  // the CPUs this process may run on (a container's cpuset), as Node's availableParallelism
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
  if (n <= 0) n = (int)std::thread::hardware_concurrency();
  // Three CPUs stay outside the pool: the host channel's server thread (it spins while decode
  // runs), the CUDA host-function thread and the thread that waits on the GPU. With any of them
  // sharing a CPU with a spinning worker, a preempted thread holds up the whole call for a
  // scheduler time slice. H100 machine, 16 CPUs, 8B long context at 4x (tools/gpu longctx): 15
  // workers spinning 100 us 0.407 of all-hot, 15 spinning 1000 us 0.339, 13 spinning 1000 us 0.504.
  n -= 3;
  if (n < 1) n = 1;
  return n > 256 ? 256 : n;
}

bool defaultPin() { return std::strcmp(nerva::knobs::textValue("NERVA_HOST_PIN"), "1") == 0; }

int64_t spinNs() { return (int64_t)nerva::knobs::intValue("NERVA_HOST_SPIN_US") * 1000; }

// A phase counter tagged with its call: epoch (24 bits) | tasks of the phase (20) | count (20).
// A worker decides from the counter alone: one that wakes after its call has ended sees another
// epoch (or a finished count) and takes nothing, so a call never waits for a late worker, and
// nothing a late worker reads from the job (which the next call rewrites) can make it claim a task.
struct alignas(64) Counter {
  std::atomic<uint64_t> v{0};
};
constexpr uint64_t kCountMask = (1u << 20) - 1;
constexpr int kMaxTasks = (int)kCountMask;  // more tasks than this in a phase: the calling thread runs the job alone
constexpr uint32_t kEpochMask = (1u << 24) - 1;
inline uint64_t counterOf(uint32_t epoch, uint32_t tasks) { return (uint64_t)(epoch & kEpochMask) << 40 | (uint64_t)tasks << 20; }
inline uint32_t epochOf(uint64_t v) { return (uint32_t)(v >> 40); }
inline uint32_t tasksOf(uint64_t v) { return (uint32_t)((v >> 20) & kCountMask); }
inline uint32_t countOf(uint64_t v) { return (uint32_t)(v & kCountMask); }

template <class F>
void waitUntil(F ready) {
  for (unsigned spins = 0; !ready(); spins++) {
    if (spins < 4096) cpuRelax();
    else std::this_thread::yield();
  }
}

}  // namespace

struct HostPool {
  HostPool() { start(defaultThreads(), defaultPin()); }

  void configure(int threads, int pin) {
    std::lock_guard<std::mutex> call(callMu);
    stopWorkers();
    start(threads > 0 ? (threads > 256 ? 256 : threads) : defaultThreads(), pin < 0 ? defaultPin() : pin != 0);
  }

  // callMu held.
  void run(const HostPoolJob& j) {
    if (j.phases <= 0) return;
    bool alone = workers.empty();
    for (int p = 0; p < j.phases; p++) alone = alone || j.tasks[p] > kMaxTasks;
    if (alone) {
      for (int p = 0; p < j.phases; p++)
        for (int i = 0; i < j.tasks[p]; i++) j.fn(j.ctx, p, i, 0);
      return;
    }
    // The counters first, then the job, then the generation: a late worker's compare-exchange on
    // an old counter fails once the counter is rewritten, whatever it read from the job.
    const uint32_t e = (uint32_t)((gen.load(std::memory_order_relaxed) + 1) & kEpochMask);
    for (int p = 0; p < kHostPoolMaxPhases; p++) {
      const uint32_t n = p < j.phases ? (uint32_t)std::max(0, j.tasks[p]) : 0;
      next[p].v.store(counterOf(e, n), std::memory_order_seq_cst);
      done[p].v.store(counterOf(e, n), std::memory_order_seq_cst);
    }
    job = j;
    {
      std::lock_guard<std::mutex> lk(mu);
      gen.store(e, std::memory_order_release);  // publishes job and the counters
    }
    cv.notify_all();
    work(0, e);
    // Done when every task of the last phase is (the phases before it are, by the barrier); a
    // worker still asleep or descheduled holds up nothing it has not taken.
    const int last = j.phases - 1;
    waitUntil([&] {
      const uint64_t d = done[last].v.load(std::memory_order_acquire);
      return countOf(d) >= tasksOf(d);
    });
  }

  // The calling thread and every worker run this for call `e`; a worker that comes late finds
  // another epoch in the counters, or finished ones, and returns.
  void work(int self, uint32_t e) {
    for (int p = 0; p < kHostPoolMaxPhases; p++) {
      for (;;) {
        uint64_t v = next[p].v.load(std::memory_order_acquire);
        if (epochOf(v) != e) return;
        if (countOf(v) >= tasksOf(v)) break;
        // A compare-exchange, not fetch_add: an increment from an ended call must not land on the next one's counter.
        if (!next[p].v.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) continue;
        const HostPoolJob& j = job;  // call e's: it cannot end (and job change) before this task is done
        j.fn(j.ctx, p, (int)countOf(v), self);
        done[p].v.fetch_add(1, std::memory_order_release);
      }
      // The barrier counts finished tasks, not threads: a worker that wakes late joins whichever
      // phase is running. Phases past the job's have no tasks.
      bool ended = false;
      waitUntil([&] {
        const uint64_t d = done[p].v.load(std::memory_order_acquire);
        ended = epochOf(d) != e;
        return ended || countOf(d) >= tasksOf(d);
      });
      if (ended) return;
    }
  }

  void start(int threads, bool pin) {
    nthreads.store(threads, std::memory_order_relaxed);
    pinned.store(pin, std::memory_order_relaxed);
    spin.store(spinNs(), std::memory_order_relaxed);
    stop.store(false);
    std::vector<int> cpus;
#ifdef __linux__
    if (pin) {
      cpu_set_t set;
      CPU_ZERO(&set);
      if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int i = 0; i < CPU_SETSIZE; i++)
          if (CPU_ISSET(i, &set)) cpus.push_back(i);
    }
#endif
    // The calling thread is one of the `threads`; the others are workers 1..threads-1. A worker
    // starts from the generation current now (callMu is held or the pool is being built), not
    // from the one it reads when it gets to run: a call may have been posted by then.
    const uint64_t g = gen.load();
    for (int i = 1; i < threads; i++) {
      const int cpu = cpus.empty() ? -1 : cpus[i % cpus.size()];
      workers.emplace_back([this, i, cpu, g] { workerMain(i, cpu, g); });
    }
  }

  void stopWorkers() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop.store(true);
    }
    cv.notify_all();
    for (auto& t : workers) t.join();
    workers.clear();
  }

  void workerMain(int self, int cpu, uint64_t seen) {
    const int64_t spinFor = spin.load(std::memory_order_relaxed);  // set before the workers start
#ifdef __linux__
    if (cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
#else
    (void)cpu;
#endif
    for (;;) {
      // Spin a little (back-to-back layers), then sleep.
      Clock::time_point t0 = Clock::now();
      for (unsigned spins = 0; gen.load(std::memory_order_acquire) == seen && !stop.load(std::memory_order_relaxed); spins++) {
        cpuRelax();
        if ((spins & 255) == 255 && std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count() > spinFor) {
          std::unique_lock<std::mutex> lk(mu);
          cv.wait(lk, [&] { return gen.load(std::memory_order_acquire) != seen || stop.load(); });
          break;
        }
      }
      if (stop.load()) return;
      seen = gen.load(std::memory_order_acquire);
      work(self, (uint32_t)seen & kEpochMask);
    }
  }

  std::mutex callMu;  // one call at a time (HostPoolCall); also guards configuration
  std::mutex mu;      // the sleepers' condition variable
  std::condition_variable cv;
  std::atomic<uint64_t> gen{0};
  std::atomic<bool> stop{false};
  Counter next[kHostPoolMaxPhases], done[kHostPoolMaxPhases];
  HostPoolJob job;
  std::vector<std::thread> workers;
  std::atomic<int> nthreads{1};  // written under callMu, read without it (stats)
  std::atomic<bool> pinned{false};
  std::atomic<int64_t> spin{100000};  // ns; written under callMu, read by the spin getter without it
};

namespace {
// Created on first use and never destroyed (its threads sleep at exit; destroying joinable
// threads would abort).
HostPool& pool() {
  static HostPool* p = new HostPool();
  return *p;
}
}  // namespace

HostPoolCall::HostPoolCall() : pool_(&pool()) { pool_->callMu.lock(); }
HostPoolCall::~HostPoolCall() { pool_->callMu.unlock(); }
int HostPoolCall::threads() const { return pool_->nthreads.load(std::memory_order_relaxed); }
void HostPoolCall::run(const HostPoolJob& job) { pool_->run(job); }

void nerva_host_pool_configure(int threads, int pin) { pool().configure(threads, pin); }
int nerva_host_pool_threads() { return pool().nthreads.load(std::memory_order_relaxed); }
bool nerva_host_pool_pinned() { return pool().pinned.load(std::memory_order_relaxed); }
int nerva_host_pool_spin_us() { return (int)(pool().spin.load(std::memory_order_relaxed) / 1000); }
