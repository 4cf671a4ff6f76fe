// Stress test of the host pool (native/host/host_pool.cc): many back-to-back calls on an
// oversubscribed pool whose idle workers sleep at once (NERVA_HOST_SPIN_US=0), so workers often
// wake after their call has ended. Every call must run each task of each phase exactly once, no
// phase-1 task may start before every phase-0 task of its call is done, and a call must not
// return before all its tasks are done. Prints one JSON line; exit status 1 on any violation.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "host_pool.h"

namespace {
constexpr int kMaxTasks = 64;
struct Ctx {
  std::atomic<int> runs[2][kMaxTasks];
  std::atomic<int> phase0Done{0};
  int tasks0 = 0;
  std::atomic<int> barrierViolations{0};
  std::atomic<int> badThread{0};
  int threads = 0;
};

void task(void* p, int phase, int i, int thread) {
  Ctx& c = *static_cast<Ctx*>(p);
  if (thread < 0 || thread >= c.threads) c.badThread.fetch_add(1);
  if (phase == 1 && c.phase0Done.load(std::memory_order_acquire) != c.tasks0) c.barrierViolations.fetch_add(1);
  // A little work, different per task, so tasks finish out of order.
  volatile unsigned x = (unsigned)i;
  for (int k = 0; k < (i % 7) * 50; k++) x = x * 1103515245u + 12345u;
  c.runs[phase][i].fetch_add(1, std::memory_order_relaxed);
  if (phase == 0) c.phase0Done.fetch_add(1, std::memory_order_release);
}
}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 20000;
  long missing = 0, duplicated = 0, earlyReturns = 0;
  Ctx c;
  for (int n = 0; n < calls; n++) {
    HostPoolCall call;
    c.threads = call.threads();
    const int t0 = 1 + (n * 7) % kMaxTasks, t1 = (n * 13) % (kMaxTasks + 1);  // phase 1 may have 0 tasks
    for (int p = 0; p < 2; p++)
      for (int i = 0; i < kMaxTasks; i++) c.runs[p][i].store(0, std::memory_order_relaxed);
    c.phase0Done.store(0);
    c.tasks0 = t0;
    HostPoolJob job;
    job.fn = task;
    job.ctx = &c;
    job.phases = 2;
    job.tasks[0] = t0;
    job.tasks[1] = t1;
    call.run(job);
    // Read right after run returns: a task still running would show as missing.
    for (int p = 0; p < 2; p++) {
      const int np = p == 0 ? t0 : t1;
      for (int i = 0; i < kMaxTasks; i++) {
        const int r = c.runs[p][i].load(std::memory_order_acquire);
        if (i < np && r == 0) missing++, earlyReturns++;
        if (r > 1 || (i >= np && r != 0)) duplicated++;
      }
    }
  }
  const bool ok = missing == 0 && duplicated == 0 && c.barrierViolations.load() == 0 && c.badThread.load() == 0;
  std::printf("{\"calls\":%d,\"threads\":%d,\"missing\":%ld,\"duplicated\":%ld,\"barrierViolations\":%d,\"badThread\":%d,\"ok\":%s}\n", calls,
              nerva_host_pool_threads(), missing, duplicated, c.barrierViolations.load(), c.badThread.load(), ok ? "true" : "false");
  (void)earlyReturns;
  return ok ? 0 : 1;
}
