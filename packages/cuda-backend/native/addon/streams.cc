// The context's streams, events, synchronization and CUDA graphs (context.h).
#include <cstring>

#include "context.h"
#include "knobs.h"

namespace nerva::addon {

Napi::Value Context::CreateStream(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  cudaStream_t s;
  CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  streams_.push_back(s);
  return Napi::Number::New(env, (double)(streams_.size() - 1));
}

Napi::Value Context::DestroyStream(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  int id = info[0].As<Napi::Number>().Int32Value();
  if (id == 0) throw Napi::Error::New(env, "the default stream cannot be destroyed");
  cudaStream_t s = Stream(env, info[0]);
  CU(cudaStreamDestroy(s));
  streams_[id] = nullptr;
  return env.Undefined();
}

Napi::Value Context::CreateEvent(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  cudaEvent_t e;
  CU(cudaEventCreate(&e));
  events_.push_back(e);
  return Napi::Number::New(env, (double)(events_.size() - 1));
}

Napi::Value Context::DestroyEvent(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  cudaEvent_t e = Event(env, info[0]);
  CU(cudaEventDestroy(e));
  events_[info[0].As<Napi::Number>().Int32Value()] = nullptr;
  return env.Undefined();
}

Napi::Value Context::Record(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  CU(cudaEventRecord(Event(env, info[0]), Stream(env, info[1])));
  return env.Undefined();
}

Napi::Value Context::WaitEvent(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  CU(cudaStreamWaitEvent(Stream(env, info[0]), Event(env, info[1]), 0));
  return env.Undefined();
}

Napi::Value Context::Elapsed(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  float ms = 0;
  CU(cudaEventElapsedTime(&ms, Event(env, info[0]), Event(env, info[1])));
  return Napi::Number::New(env, ms);
}

// synchronize(stream | -1 for the whole device)
Napi::Value Context::Synchronize(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  int id = info[0].As<Napi::Number>().Int32Value();
  if (id < 0) CU(cudaDeviceSynchronize());
  else if (BlockingWait()) {
    // Sleep instead of spinning while the host pool computes inside the stream (host attention,
    // host MLP): a spinning waiter takes the CPU a pool worker needs, and a preempted worker
    // stalls its layer for a scheduler time slice. The wake-up costs tens of microseconds.
    cudaStream_t s = Stream(env, info[0]);
    if (!blockEv_) CU(cudaEventCreateWithFlags(&blockEv_, cudaEventBlockingSync | cudaEventDisableTiming));
    CU(cudaEventRecord(blockEv_, s));
    CU(cudaEventSynchronize(blockEv_));
  } else {
    CU(cudaStreamSynchronize(Stream(env, info[0])));
  }
  return env.Undefined();
}

// synchronizeEvent(event): the host waits for one recorded event; later work keeps running.
Napi::Value Context::SynchronizeEvent(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  CU(cudaEventSynchronize(Event(env, info[0])));
  return env.Undefined();
}

// NERVA_CUDA_SYNC: spin (cudaStreamSynchronize under the default schedule), block (a
// blocking-sync event), or auto (default): block once the context has host compute modules.
bool Context::BlockingWait() {
  static const int mode = [] {
    const char* v = knobs::textValue("NERVA_CUDA_SYNC");
    if (!std::strcmp(v, "spin")) return 0;
    if (!std::strcmp(v, "block")) return 1;
    return 2;  // auto
  }();
  if (mode != 2) return mode == 1;
  for (auto& m : hostMlps_)
    if (m) return true;
  for (auto& h : hostAttns_)
    if (h) return true;
  return false;
}

Napi::Value Context::BeginCapture(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  cudaStream_t s = Stream(env, info[0]);
  CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  ex_.capturing = true;
  return env.Undefined();
}

// endCapture(stream) -> [graphId, nodeCount]
Napi::Value Context::EndCapture(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  cudaStream_t s = Stream(env, info[0]);
  ex_.capturing = false;
  cudaGraph_t g = nullptr;
  CU(cudaStreamEndCapture(s, &g));
  size_t n = 0;
  cudaError_t e = cudaGraphGetNodes(g, nullptr, &n);
  cudaGraphExec_t exec = nullptr;
  if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, g, 0);
  if (e != cudaSuccess) {
    cudaGraphDestroy(g);
    throw cudaErr(env, (int)e, "cudaGraphInstantiate");
  }
  graphs_.push_back({g, exec});
  Napi::Array out = Napi::Array::New(env, 2);
  out.Set((uint32_t)0, (double)(graphs_.size() - 1));
  out.Set((uint32_t)1, (double)n);
  return out;
}

Napi::Value Context::Replay(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  int id = info[0].As<Napi::Number>().Int32Value();
  if (id < 0 || id >= (int)graphs_.size() || !graphs_[id].exec) throw Napi::Error::New(env, "unknown graph");
  CU(cudaGraphLaunch(graphs_[id].exec, Stream(env, info[1])));
  graphReplays_++;
  return env.Undefined();
}

Napi::Value Context::DestroyGraph(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  int id = info[0].As<Napi::Number>().Int32Value();
  if (id < 0 || id >= (int)graphs_.size() || !graphs_[id].exec) throw Napi::Error::New(env, "unknown graph");
  CU(cudaGraphExecDestroy(graphs_[id].exec));
  CU(cudaGraphDestroy(graphs_[id].graph));
  graphs_[id] = {nullptr, nullptr};
  return env.Undefined();
}

}  // namespace nerva::addon
