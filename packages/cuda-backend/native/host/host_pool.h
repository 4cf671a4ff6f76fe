// The host compute pool: one process-wide set of worker threads shared by the host MLP
// (host_mlp.cc) and host attention (host_attention.cc), so a process has one pool of about one
// thread per CPU instead of one per module (two pools would oversubscribe the CPUs whenever both
// are awake, and each would keep its own threads spinning after a call).
//
// A call runs a job: up to kHostPoolMaxPhases phases in order, with a barrier between them
// (every task of phase p is done before any task of phase p + 1 starts). Phase p's tasks are
// fn(ctx, p, i, thread) for i < tasks[p], taken from an atomic counter by the calling thread
// (thread 0, which takes part) and the workers (threads 1..threads()-1): a descheduled or
// still sleeping thread delays only the task it holds (a call ends when its tasks are done, not
// when every worker has been through it; the counters carry the call's epoch, so a worker that
// wakes late takes nothing of a later call), and which thread runs a task does not change what
// the task computes, so a module whose tasks each write their own outputs in a fixed order gets
// results that do not depend on the thread count. `thread` only selects per-thread scratch.
//
// Threads: NERVA_HOST_THREADS (default: three less than the CPUs of the process's affinity mask,
// else of std::thread::hardware_concurrency(), so the host channel's server, the CUDA
// host-function thread and the thread waiting on the GPU keep a CPU each; at least 1, at
// most 256), the calling thread included; created on first use, never destroyed (the workers sleep at exit). NERVA_HOST_PIN=1 pins worker i to the
// (i+1)-th CPU of the affinity mask (the calling thread is not pinned). Idle workers spin for
// NERVA_HOST_SPIN_US microseconds (default 1000: decode calls come about once per layer, every
// 0.2-0.4 ms; with the three CPUs above left free this no longer starves the CUDA host-function
// and Node threads, as it did with all but one CPU in the pool), then sleep on a condition
// variable, so an idle pool costs nothing. The three settings are knobs (../common/knobs.h).
//
// Calls are serialized: a HostPoolCall holds the pool from construction to destruction, so the
// two modules' calls run one after another (they are queued on the CUDA host-function thread one
// after another anyway). Running a job allocates nothing.
#pragma once
#include <stdint.h>

constexpr int kHostPoolMaxPhases = 4;

typedef void (*HostPoolTaskFn)(void* ctx, int phase, int task, int thread);

struct HostPoolJob {
  HostPoolTaskFn fn = nullptr;
  void* ctx = nullptr;
  int phases = 0;                      // 0..kHostPoolMaxPhases
  int tasks[kHostPoolMaxPhases] = {};  // tasks of each phase (0 is fine)
};

// One call's hold on the pool (creates it on first use). While it lives no other call runs and
// the thread count cannot change: a module sizes per-thread scratch by threads(), then runs, and
// its own scratch is guarded by the same hold.
class HostPoolCall {
 public:
  HostPoolCall();
  ~HostPoolCall();
  HostPoolCall(const HostPoolCall&) = delete;
  HostPoolCall& operator=(const HostPoolCall&) = delete;

  int threads() const;  // the calling thread included
  // Runs the job on the calling thread plus the workers; returns when every task is done.
  void run(const HostPoolJob& job);

 private:
  struct HostPool* pool_;
};

// Re-creates the pool with `threads` threads (<= 0: the default above) and pinning on or off
// (pin < 0: NERVA_HOST_PIN), after a running call. Both modules' configure functions land here.
void nerva_host_pool_configure(int threads, int pin);
// The pool's size and pinning (creates the pool on first use; does not wait for a running call).
int nerva_host_pool_threads();
bool nerva_host_pool_pinned();
int nerva_host_pool_spin_us();  // how long idle workers spin before they sleep
