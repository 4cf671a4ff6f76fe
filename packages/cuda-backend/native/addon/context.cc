// The context's creation, release, info, op launches, counters and NCCL ranks (context.h).
#include "context.h"

#include <cstring>
#include <string>

#include "knobs.h"
#include "nccl_dl.h"

namespace nerva::addon {

Napi::Error cudaErr(Napi::Env env, int code, const std::string& call) {
  std::string name, desc;
  if (code > 0) {
    name = cudaGetErrorName((cudaError_t)code);
    desc = cudaGetErrorString((cudaError_t)code);
  } else if (code == NERVA_CUBLAS_FAILED) {
    name = "CUBLAS_STATUS_ERROR";
    desc = "cuBLAS call failed";
  } else {
    name = "NERVA_BAD_ARGS";
    desc = "invalid arguments";
  }
  Napi::Error err = Napi::Error::New(env, name + " (" + desc + ") in " + call);
  err.Value().Set("cudaError", Napi::String::New(env, name));
  err.Value().Set("call", Napi::String::New(env, call));
  err.Value().Set("status", Napi::Number::New(env, code));
  return err;
}


double addrOf(Napi::Env env, const void* p) {
  double d = (double)(uintptr_t)p;
  if (d >= MAX_SAFE) throw Napi::Error::New(env, "device address beyond 2^53 cannot travel as a JS number");
  return d;
}

Napi::Function Context::Init(Napi::Env env) {
  return DefineClass(env, "Context",
                     {
                         InstanceMethod("info", &Context::Info),
                         InstanceMethod("pinnedArrayBuffer", &Context::PinnedArrayBuffer),
                         InstanceMethod("peekPinned", &Context::PeekPinned),
                         InstanceMethod("launch", &Context::Launch),
                         InstanceMethod("copy", &Context::Copy),
                         InstanceMethod("write", &Context::Write),
                         InstanceMethod("read", &Context::Read),
                         InstanceMethod("createStream", &Context::CreateStream),
                         InstanceMethod("destroyStream", &Context::DestroyStream),
                         InstanceMethod("createEvent", &Context::CreateEvent),
                         InstanceMethod("destroyEvent", &Context::DestroyEvent),
                         InstanceMethod("record", &Context::Record),
                         InstanceMethod("waitEvent", &Context::WaitEvent),
                         InstanceMethod("elapsed", &Context::Elapsed),
                         InstanceMethod("synchronize", &Context::Synchronize),
                         InstanceMethod("synchronizeEvent", &Context::SynchronizeEvent),
                         InstanceMethod("beginCapture", &Context::BeginCapture),
                         InstanceMethod("endCapture", &Context::EndCapture),
                         InstanceMethod("replay", &Context::Replay),
                         InstanceMethod("destroyGraph", &Context::DestroyGraph),
                         InstanceMethod("setHotPath", &Context::SetHotPath),
                         InstanceMethod("counters", &Context::Counters),
                         InstanceMethod("copyBandwidth", &Context::CopyBandwidth),
                         InstanceMethod("dispose", &Context::Dispose),
                         InstanceMethod("ncclCommInit", &Context::NcclCommInit),
                         InstanceMethod("ncclSend", &Context::NcclSend),
                         InstanceMethod("ncclRecv", &Context::NcclRecv),
                         InstanceMethod("hostMlpCreate", &Context::HostMlpCreate),
                         InstanceMethod("hostMlpEnqueue", &Context::HostMlpEnqueue),
                         InstanceMethod("hostMlpRun", &Context::HostMlpRun),
                         InstanceMethod("hostMlpDestroy", &Context::HostMlpDestroy),
                         InstanceMethod("hostMlpStats", &Context::HostMlpStats),
                         InstanceMethod("hostAttnCreate", &Context::HostAttnCreate),
                         InstanceMethod("hostAttnEnqueue", &Context::HostAttnEnqueue),
                         InstanceMethod("hostAttnDestroy", &Context::HostAttnDestroy),
                         InstanceMethod("hostAttnStats", &Context::HostAttnStats),
                     });
}

// new Context({ device, deviceArenaBytes, pinnedArenaBytes, workspaceBytes, cublasWorkspaceBytes, gemmMode })
Context::Context(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Context>(info) {
  Napi::Env env = info.Env();
  Napi::Object o = info[0].As<Napi::Object>();
  device_ = o.Get("device").As<Napi::Number>().Int32Value();
  devBytes_ = (size_t)o.Get("deviceArenaBytes").As<Napi::Number>().DoubleValue();
  pinBytes_ = (size_t)o.Get("pinnedArenaBytes").As<Napi::Number>().DoubleValue();
  size_t wsBytes = (size_t)o.Get("workspaceBytes").As<Napi::Number>().DoubleValue();
  size_t cbWs = (size_t)o.Get("cublasWorkspaceBytes").As<Napi::Number>().DoubleValue();
  int gemmMode = o.Get("gemmMode").As<Napi::Number>().Int32Value();
  ex_.bf16act = o.Has("bf16Activations") && o.Get("bf16Activations").ToBoolean().Value();
  ex_.batchInv = o.Has("batchInvariant") && o.Get("batchInvariant").ToBoolean().Value();

  CU(cudaSetDevice(device_));
  CU(cudaGetDeviceProperties(&prop_, device_));
  // One reservation holds the arena, the op workspace and cuBLAS's workspace.
  // The prefill tile plan's tiles (at most one per 32 rows), count and row flags follow the counters.
  const size_t planTiles = NERVA_TILE_PLAN_ROWS / 32;
  const size_t planBytes = planTiles * sizeof(int2) + 256 + NERVA_TILE_PLAN_ROWS;
  size_t total = devBytes_ + wsBytes + cbWs + (kCounterCount + kGridBarWords) * sizeof(int) + planBytes;
  cudaError_t e = cudaMalloc((void**)&devBase_, total);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw cudaErr(env, (int)e, "cudaMalloc(device arena of " + std::to_string(total) + " bytes)");
  }
  allocCalls_++;
  // The staging ring of small writes sits after the arena JavaScript sub-allocates.
  stageOff_ = (pinBytes_ + 255) & ~(size_t)255;
  e = AllocPinned(stageOff_ + kStageBytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cudaFree(devBase_);
    freeCalls_++;
    devBase_ = nullptr;
    throw cudaErr(env, (int)e, "cudaHostAlloc(pinned arena of " + std::to_string(pinBytes_) + " bytes)");
  }
  allocCalls_++;
  CU(cudaHostGetDevicePointer((void**)&pinDev_, pinBase_, 0));
  ex_.ws = devBase_ + devBytes_;
  ex_.wsBytes = wsBytes;
  ex_.cublasWs = devBase_ + devBytes_ + wsBytes;
  ex_.cublasWsBytes = cbWs;
  ex_.smCount = prop_.multiProcessorCount;
  ex_.smemOptin = (int)prop_.sharedMemPerBlockOptin;
  ex_.l2Bytes = (size_t)prop_.l2CacheSize;
  ex_.counters = (int*)(devBase_ + devBytes_ + wsBytes + cbWs);
  ex_.counterCount = kCounterCount;
  ex_.gridBar = (unsigned*)(ex_.counters + kCounterCount);
  CU(cudaMemset(ex_.counters, 0, (kCounterCount + kGridBarWords) * sizeof(int)));
  {
    char* plan = (char*)(ex_.counters + kCounterCount + kGridBarWords);
    ex_.tiles = (int2*)plan;
    ex_.tileCount = (int*)(plan + planTiles * sizeof(int2));
    ex_.tileCovered = (unsigned char*)(plan + planTiles * sizeof(int2) + 256);
    ex_.planRows = NERVA_TILE_PLAN_ROWS;
  }
  CU(cudaDeviceSynchronize());  // the streams are non-blocking: the zeroes land before any launch
  cudaStream_t s0;
  CU(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  streams_.push_back(s0);

  // Programmatic dependent launch: Hopper and later, kernels built with their PDL waits.
  ex_.pdl = prop_.major >= 9 && nerva_pdl_compiled();

  ex_.gemmMode = GEMM_GEMV;
  if (gemmMode != GEMM_GEMV) {
    char why[256] = {0};
    if (nerva_load_cublas(&api_, why, sizeof why)) {
      void* h = nullptr;
      int st = api_.create(&h);
      if (st == 0 && h) {
        // A workspace of our own: no cuBLAS allocation later, and graph capture is legal.
        st = api_.setWorkspace(h, ex_.cublasWs, ex_.cublasWsBytes);
        ex_.cublas = h;
        ex_.api = &api_;
        ex_.gemmMode = gemmMode;
        if (st != 0) blasNote_ = "cublasSetWorkspace failed (status " + std::to_string(st) + ")";
      } else {
        blasNote_ = "cublasCreate failed (status " + std::to_string(st) + ")";
      }
    } else {
      blasNote_ = why;
    }
  } else {
    blasNote_ = "disabled by option";
  }
  // Batch-invariant matmuls on cuBLASLt's pinned algorithms (see nerva_lt_gemm); where it does
  // not load, on k_gemm_bi.
  if (ex_.batchInv && ex_.cublas) {
    char why[256] = {0};
    if (!nerva_lt_open(&ex_, why, sizeof why)) ltNote_ = why;
  }
}

Context::~Context() { Release(); }

void Context::Release() {
  if (disposed_) return;
  disposed_ = true;
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  for (auto& g : graphs_) {
    if (g.exec) cudaGraphExecDestroy(g.exec);
    if (g.graph) cudaGraphDestroy(g.graph);
  }
  graphs_.clear();
  hostMlps_.clear();  // after the graphs that may hold them, and with no host function pending
  hostAttns_.clear();
  for (auto ev : events_)
    if (ev) cudaEventDestroy(ev);
  events_.clear();
  if (blockEv_) cudaEventDestroy(blockEv_);
  blockEv_ = nullptr;
  for (auto& st : staged_) cudaEventDestroy(st.ev);
  staged_.clear();
  for (auto ev : stageEvents_) cudaEventDestroy(ev);
  stageEvents_.clear();
  nerva_lt_close(&ex_);
  if (ex_.cublas && api_.destroy) api_.destroy(ex_.cublas);
  ex_.cublas = nullptr;
  for (auto s : streams_)
    if (s) cudaStreamDestroy(s);
  streams_.clear();
  if (devBase_) {
    cudaFree(devBase_);
    freeCalls_++;
    devBase_ = nullptr;
  }
  if (pinBase_) {
    FreePinned();
    freeCalls_++;
    pinBase_ = nullptr;
  }
}

void Context::Live(Napi::Env env) {
  if (disposed_) throw Napi::Error::New(env, "CUDA context already disposed");
  // Several contexts (one per GPU: pipeline stages) live in one process: every call acts on
  // this context's device. Cheap when it is already current.
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != device_) CU(cudaSetDevice(device_));
}

cudaStream_t Context::Stream(Napi::Env env, const Napi::Value& v) {
  int id = v.IsNumber() ? v.As<Napi::Number>().Int32Value() : 0;
  if (id < 0 || id >= (int)streams_.size() || !streams_[id]) throw Napi::Error::New(env, "unknown stream " + std::to_string(id));
  return streams_[id];
}

cudaEvent_t Context::Event(Napi::Env env, const Napi::Value& v) {
  int id = v.As<Napi::Number>().Int32Value();
  if (id < 0 || id >= (int)events_.size() || !events_[id]) throw Napi::Error::New(env, "unknown event " + std::to_string(id));
  return events_[id];
}

Napi::Value Context::Info(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  Napi::Object o = Napi::Object::New(env);
  o.Set("name", prop_.name);
  o.Set("totalMemory", (double)prop_.totalGlobalMem);
  o.Set("smCount", prop_.multiProcessorCount);
  o.Set("computeCapability", std::to_string(prop_.major) + "." + std::to_string(prop_.minor));
  o.Set("deviceBase", addrOf(env, devBase_));
  o.Set("deviceArenaBytes", (double)devBytes_);
  o.Set("pinnedBase", addrOf(env, pinDev_));
  o.Set("pinnedArenaBytes", (double)pinBytes_);
  o.Set("workspaceBytes", (double)ex_.wsBytes);
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  o.Set("runtimeVersion", rt);
  o.Set("driverVersion", drv);
  o.Set("numerics", ex_.bf16act ? "bf16" : "exact");
  o.Set("batchInvariant", ex_.batchInv);
  o.Set("gemm", ex_.gemmMode == GEMM_SPLIT_BF16 ? "cublas-split-bf16" : ex_.gemmMode == GEMM_BF16 ? "cublas-bf16" : "gemv");
  o.Set("cublas", api_.lib ? api_.libName : "");
  o.Set("cublasNote", blasNote_);
  // The batch-invariant matmul: cuBLASLt with pinned algorithms, else k_gemm_bi.
  if (ex_.batchInv) {
    o.Set("biGemm", ex_.lt ? "cublaslt-pinned" : "k_gemm_bi");
    char pins[2048];
    nerva_lt_describe(&ex_, pins, sizeof pins);
    o.Set("biGemmPins", pins);
    if (!ltNote_.empty()) o.Set("biGemmNote", ltNote_);
  }
  o.Set("pinnedPages", pinPages_);
  o.Set("pdl", ex_.pdl);
  o.Set("decodeShortKeys", nerva_decode_short_keys(&ex_));
  o.Set("decodeLongKeys", nerva_decode_long_keys(&ex_));
  o.Set("decoderLayersEmbed", true);
  o.Set("sampleStepTail", true);
  o.Set("sampleMask", true);  // op sample reads and applies its mask (ops/sample.cu)
  return o;
}

Napi::Value Context::Launch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  int op = info[0].As<Napi::Number>().Int32Value();
  Napi::Float64Array args = info[1].As<Napi::Float64Array>();
  int nargs = info[2].As<Napi::Number>().Int32Value();
  ex_.stream = Stream(env, info[3]);
  if (nargs > (int)args.ElementLength()) throw Napi::Error::New(env, "launch: nargs beyond the argument array");
  int rc = nerva_launch(&ex_, op, args.Data(), nargs);
  if (rc != NERVA_OK) {
    if (rc > 0) cudaGetLastError();
    Napi::Error err = cudaErr(env, rc, ex_.errCall);
    throw err;
  }
  return env.Undefined();
}

Napi::Value Context::SetHotPath(const Napi::CallbackInfo& info) {
  hotPath_ = info[0].As<Napi::Boolean>().Value();
  return info.Env().Undefined();
}

Napi::Value Context::Counters(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = Napi::Object::New(env);
  o.Set("allocCalls", (double)allocCalls_);
  o.Set("freeCalls", (double)freeCalls_);
  o.Set("launches", (double)ex_.launches);
  o.Set("graphReplays", (double)graphReplays_);
  o.Set("hotPathRejected", (double)hotPathRejected_);
  return o;
}

// copyBandwidth(bytes, iters) -> GB/s (read + written). Allocates, so refused on the hot path.
Napi::Value Context::CopyBandwidth(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  if (hotPath_) {
    hotPathRejected_++;
    throw Napi::Error::New(env, "HOT_PATH: copyBandwidth allocates and the hot-path guard is armed");
  }
  size_t bytes = (size_t)info[0].As<Napi::Number>().DoubleValue();
  int iters = info[1].As<Napi::Number>().Int32Value();
  double gbps = 0;
  int rc = nerva_copy_bandwidth(bytes, iters, &gbps, &allocCalls_, &freeCalls_);
  if (rc != 0) {
    cudaGetLastError();
    throw cudaErr(env, rc, "copyBandwidth");
  }
  return Napi::Number::New(env, gbps);
}

Napi::Value Context::Dispose(const Napi::CallbackInfo& info) {
  nerva_trace_dump();
  Release();
  return info.Env().Undefined();
}

// NCCL (nccl_dl.cc): a rank on this context's device; send/recv on one of its streams.
Napi::Value Context::NcclCommInit(const Napi::CallbackInfo& info) {
  Live(info.Env());
  return nerva_nccl::CommInit(info, device_);
}

Napi::Value Context::NcclSend(const Napi::CallbackInfo& info) {
  Live(info.Env());
  return nerva_nccl::SendRecv(info, true, device_, Stream(info.Env(), info[5]));
}

Napi::Value Context::NcclRecv(const Napi::CallbackInfo& info) {
  Live(info.Env());
  return nerva_nccl::SendRecv(info, false, device_, Stream(info.Env(), info[5]));
}

}  // namespace nerva::addon
