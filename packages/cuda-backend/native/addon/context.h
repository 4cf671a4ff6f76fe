// The addon's context: one per backend (one CUDA device), holding its memory (a device arena
// and a mapped pinned-host arena that JavaScript sub-allocates), its streams, events and graphs,
// and its host compute modules. Its methods are defined by concern: context.cc (creation, info,
// launch, counters, NCCL ranks), memory.cc (arenas, copies, the staging ring), streams.cc
// (streams, events, synchronization, graph capture and replay) and host_compute.cc (host MLP and
// host attention); module.cc registers it. Every CUDA failure becomes a JS exception carrying the
// CUDA error name and the call.
#pragma once
#include <napi.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "host_attention.h"
#include "host_channel.h"
#include "host_mlp.h"
#include "nerva.h"

namespace nerva::addon {

constexpr double MAX_SAFE = 9007199254740992.0;  // 2^53: addresses travel as JS numbers

// A JS error for a CUDA status (code > 0), a cuBLAS failure or bad arguments, naming the call.
Napi::Error cudaErr(Napi::Env env, int code, const std::string& call);

// A pointer as a JS number (throws past 2^53).
double addrOf(Napi::Env env, const void* p);

// Throws cudaErr on failure; needs `env` in scope.
#define CU(call)                                                               \
  do {                                                                         \
    cudaError_t _e = (call);                                                   \
    if (_e != cudaSuccess) throw cudaErr(env, (int)_e, #call);                 \
  } while (0)

class Context : public Napi::ObjectWrap<Context> {
 public:
  static Napi::Function Init(Napi::Env env);
  Context(const Napi::CallbackInfo& info);
  ~Context();

 private:
  // Host MLP (host_mlp.cc): CPU-computed MLP channels of a streamed layer. The args live here,
  // at a stable address, for the host functions and graphs that reference them.
  struct HostMlp {
    HostMlpArgs args;
    HostMlpCounters counters;
  };

  // Host attention (host_attention.cc): the warm partial of tiered KV, computed by the CPU over
  // KV pages in the pinned arena. The args, the staging description and a pinned copy of the
  // int buffers (block tables, rowSeq, positions) live here for the host functions and graphs.
  struct HostAttn {
    HostAttnArgs args;
    HostAttnStage stage;
    HostAttnCounters counters;
    int* ints = nullptr;  // cudaHostAlloc: tables, then rowSeq, then positions
    HostChannel* channel = nullptr;  // the round trip's mechanism (host_channel.h)
    ~HostAttn() {
      nerva_host_channel_destroy(channel);
      if (ints) cudaFreeHost(ints);
    }
  };

  struct Graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
  };

  struct Staged {
    size_t off, len;
    cudaEvent_t ev;
  };

  // context.cc: creation, info, launches, counters, NCCL ranks
  void Release();
  void Live(Napi::Env env);
  cudaStream_t Stream(Napi::Env env, const Napi::Value& v);
  cudaEvent_t Event(Napi::Env env, const Napi::Value& v);
  Napi::Value Info(const Napi::CallbackInfo& info);
  Napi::Value Launch(const Napi::CallbackInfo& info);
  Napi::Value SetHotPath(const Napi::CallbackInfo& info);
  Napi::Value Counters(const Napi::CallbackInfo& info);
  Napi::Value CopyBandwidth(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);
  Napi::Value NcclCommInit(const Napi::CallbackInfo& info);
  Napi::Value NcclSend(const Napi::CallbackInfo& info);
  Napi::Value NcclRecv(const Napi::CallbackInfo& info);

  // memory.cc: the pinned arena, copies, the staging ring
  cudaError_t AllocPinned(size_t bytes);
  void FreePinned();
  char* PinnedDevView(const char* host);
  char* PinnedHostView(Napi::Env env, double addr, size_t bytes, const char* name);
  Napi::Value PinnedArrayBuffer(const Napi::CallbackInfo& info);
  Napi::Value PeekPinned(const Napi::CallbackInfo& info);
  Napi::Value Copy(const Napi::CallbackInfo& info);
  Napi::Value Write(const Napi::CallbackInfo& info);
  size_t StageAlloc(Napi::Env env, size_t len, bool* waited);
  Napi::Value Read(const Napi::CallbackInfo& info);

  // streams.cc: streams, events, synchronization, graphs
  Napi::Value CreateStream(const Napi::CallbackInfo& info);
  Napi::Value DestroyStream(const Napi::CallbackInfo& info);
  Napi::Value CreateEvent(const Napi::CallbackInfo& info);
  Napi::Value DestroyEvent(const Napi::CallbackInfo& info);
  Napi::Value Record(const Napi::CallbackInfo& info);
  Napi::Value WaitEvent(const Napi::CallbackInfo& info);
  Napi::Value Elapsed(const Napi::CallbackInfo& info);
  Napi::Value Synchronize(const Napi::CallbackInfo& info);
  Napi::Value SynchronizeEvent(const Napi::CallbackInfo& info);
  bool BlockingWait();
  Napi::Value BeginCapture(const Napi::CallbackInfo& info);
  Napi::Value EndCapture(const Napi::CallbackInfo& info);
  Napi::Value Replay(const Napi::CallbackInfo& info);
  Napi::Value DestroyGraph(const Napi::CallbackInfo& info);

  // host_compute.cc: host MLP and host attention
  HostMlp& HostMlpAt(Napi::Env env, const Napi::Value& v);
  Napi::Value HostMlpCreate(const Napi::CallbackInfo& info);
  Napi::Value HostMlpEnqueue(const Napi::CallbackInfo& info);
  Napi::Value HostMlpRun(const Napi::CallbackInfo& info);
  Napi::Value HostMlpDestroy(const Napi::CallbackInfo& info);
  Napi::Value HostMlpStats(const Napi::CallbackInfo& info);
  HostAttn& HostAttnAt(Napi::Env env, const Napi::Value& v);
  Napi::Value HostAttnCreate(const Napi::CallbackInfo& info);
  Napi::Value HostAttnEnqueue(const Napi::CallbackInfo& info);
  Napi::Value HostAttnDestroy(const Napi::CallbackInfo& info);
  Napi::Value HostAttnStats(const Napi::CallbackInfo& info);

  static constexpr size_t kStageBytes = 4u << 20;     // the pinned staging ring
  static constexpr size_t kStageMaxWrite = 1u << 20;  // larger writes synchronize instead
  static constexpr size_t kCounterCount = 16384;      // attention combine counters (rows x heads)
  static constexpr size_t kGridBarWords = 16;         // k_q4k_chain's grid barrier (two used; 64 bytes keep the plan aligned)
  size_t stageOff_ = 0, stageHead_ = 0;
  std::deque<Staged> staged_;
  std::vector<cudaEvent_t> stageEvents_;
  int device_ = 0;
  cudaDeviceProp prop_{};
  char* devBase_ = nullptr;
  char* pinBase_ = nullptr;
  char* pinDev_ = nullptr;
  size_t devBytes_ = 0, pinBytes_ = 0;
  NervaExec ex_;
  CublasApi api_;
  std::string blasNote_;
  std::string ltNote_;  // why cuBLASLt did not load (batch-invariant contexts)
  std::string pinPages_;  // how the pinned arena was allocated (AllocPinned)
  size_t pinMapLen_ = 0;  // mmap length when the arena is registered anonymous memory, else 0
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_;
  cudaEvent_t blockEv_ = nullptr;  // Synchronize's blocking-sync event (BlockingWait)
  std::vector<Graph> graphs_;
  std::vector<std::unique_ptr<HostMlp>> hostMlps_;
  std::vector<std::unique_ptr<HostAttn>> hostAttns_;
  uint64_t allocCalls_ = 0, freeCalls_ = 0, graphReplays_ = 0, hotPathRejected_ = 0;
  bool hotPath_ = false;
  bool disposed_ = false;
};

}  // namespace nerva::addon
