// Node-API glue: one Context per backend. Memory is reserved up front (a device arena and a
// mapped pinned-host arena); JavaScript sub-allocates inside them and passes raw addresses to
// `launch`. Every CUDA failure becomes a JS exception carrying the CUDA error name and the call.
#include <napi.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "host_attention.h"
#include "host_channel.h"
#include "host_mlp.h"
#include "nccl_dl.h"
#include "nerva.h"

namespace {

constexpr double MAX_SAFE = 9007199254740992.0;  // 2^53: addresses travel as JS numbers
constexpr size_t kPinnedViewBytes = (size_t)1 << 31;

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

#define CU(call)                                                               \
  do {                                                                         \
    cudaError_t _e = (call);                                                   \
    if (_e != cudaSuccess) throw cudaErr(env, (int)_e, #call);                 \
  } while (0)

double addrOf(Napi::Env env, const void* p) {
  double d = (double)(uintptr_t)p;
  if (d >= MAX_SAFE) throw Napi::Error::New(env, "device address beyond 2^53 cannot travel as a JS number");
  return d;
}

class Context : public Napi::ObjectWrap<Context> {
 public:
  static Napi::Function Init(Napi::Env env) {
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
  Context(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Context>(info) {
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
    size_t total = devBytes_ + wsBytes + cbWs + kCounterCount * sizeof(int);
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
    CU(cudaMemset(ex_.counters, 0, kCounterCount * sizeof(int)));
    CU(cudaDeviceSynchronize());  // the streams are non-blocking: the zeroes land before any launch
    cudaStream_t s0;
    CU(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    streams_.push_back(s0);

    // Programmatic dependent launch: Hopper and later, kernels built with their PDL waits,
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

  ~Context() { Release(); }

 private:
  void Release() {
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

  // The pinned arena. Where it can, it is anonymous memory advised for transparent huge pages and
  // then registered (pinned and mapped) with CUDA: the host computes near data by streaming
  // gigabytes of weights out of it each token, and 4 KiB pages (what cudaHostAlloc gets once other
  // processes have fragmented memory) cut that streaming rate by about a quarter on the GPU
  // machine (hardware prefetchers stop at page boundaries; TLB misses). NERVA_PINNED_HUGEPAGES=0,
  // or a failed mmap/registration, falls back to cudaHostAlloc. The H2D path is the same either way.
  cudaError_t AllocPinned(size_t bytes) {
    const char* env = std::getenv("NERVA_PINNED_HUGEPAGES");
    if (!(env && std::strcmp(env, "0") == 0)) {
      const size_t huge = (size_t)2 << 20;
      size_t len = (bytes + huge - 1) & ~(huge - 1);
      void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p != MAP_FAILED) {
        bool advised = madvise(p, len, MADV_HUGEPAGE) == 0;
        cudaError_t e = cudaHostRegister(p, len, cudaHostRegisterMapped | cudaHostRegisterPortable);
        if (e == cudaSuccess) {
          pinBase_ = (char*)p;
          pinMapLen_ = len;
          pinPages_ = advised ? "anonymous, huge pages advised, registered" : "anonymous, registered (madvise failed)";
          return cudaSuccess;
        }
        cudaGetLastError();
        munmap(p, len);
        pinPages_ = std::string("cudaHostAlloc (cudaHostRegister failed: ") + cudaGetErrorName(e) + ")";
      } else {
        pinPages_ = "cudaHostAlloc (mmap failed)";
      }
    } else {
      pinPages_ = "cudaHostAlloc (NERVA_PINNED_HUGEPAGES=0)";
    }
    pinMapLen_ = 0;
    return cudaHostAlloc((void**)&pinBase_, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  }

  void FreePinned() {
    if (pinMapLen_) {
      cudaHostUnregister(pinBase_);
      munmap(pinBase_, pinMapLen_);
      pinMapLen_ = 0;
    } else {
      cudaFreeHost(pinBase_);
    }
  }

  void Live(Napi::Env env) {
    if (disposed_) throw Napi::Error::New(env, "CUDA context already disposed");
    // Several contexts (one per GPU: pipeline stages) live in one process: every call acts on
    // this context's device. Cheap when it is already current.
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != device_) CU(cudaSetDevice(device_));
  }

  cudaStream_t Stream(Napi::Env env, const Napi::Value& v) {
    int id = v.IsNumber() ? v.As<Napi::Number>().Int32Value() : 0;
    if (id < 0 || id >= (int)streams_.size() || !streams_[id]) throw Napi::Error::New(env, "unknown stream " + std::to_string(id));
    return streams_[id];
  }

  cudaEvent_t Event(Napi::Env env, const Napi::Value& v) {
    int id = v.As<Napi::Number>().Int32Value();
    if (id < 0 || id >= (int)events_.size() || !events_[id]) throw Napi::Error::New(env, "unknown event " + std::to_string(id));
    return events_[id];
  }

  Napi::Value Info(const Napi::CallbackInfo& info) {
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
    o.Set("decoder", "layers");
    o.Set("numerics", ex_.bf16act ? "bf16" : "exact");
    o.Set("batchInvariant", ex_.batchInv);
    o.Set("gemm", ex_.gemmMode == GEMM_SPLIT_BF16 ? "cublas-split-bf16" : ex_.gemmMode == GEMM_BF16 ? "cublas-bf16" : "gemv");
    o.Set("cublas", api_.lib ? api_.libName : "");
    o.Set("cublasNote", blasNote_);
    // The batch-invariant matmul: cuBLASLt with pinned algorithms, k_gemm_bi, or the GEMV.
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
    o.Set("decoderLayersEmbed", true);
    o.Set("sampleStepTail", true);
    return o;
  }

  // The whole pinned arena as one external ArrayBuffer: `peek` reads it with no CUDA call.
  Napi::Value PinnedArrayBuffer(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    // Node caps an ArrayBuffer below 4 GiB; a larger arena (host copies of paged weights) is
    // viewed up to 2 GiB, and peekPinned reads beyond it.
    return Napi::ArrayBuffer::New(env, pinBase_, std::min(pinBytes_, kPinnedViewBytes));
  }

  // peekPinned(offset, bytes) -> a copy of pinned-arena bytes, without any CUDA synchronization.
  Napi::Value PeekPinned(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    size_t off = (size_t)info[0].As<Napi::Number>().DoubleValue();
    size_t n = (size_t)info[1].As<Napi::Number>().DoubleValue();
    if (off > pinBytes_ || n > pinBytes_ - off) throw Napi::RangeError::New(env, "peekPinned: range outside the pinned arena");
    Napi::ArrayBuffer ab = Napi::ArrayBuffer::New(env, n);
    std::memcpy(ab.Data(), pinBase_ + off, n);
    return ab;
  }

  Napi::Value Launch(const Napi::CallbackInfo& info) {
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

  // copy(dstAddr, srcAddr, bytes, stream): any tier to any tier (unified addressing).
  Napi::Value Copy(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    void* dst = (void*)(uintptr_t)info[0].As<Napi::Number>().DoubleValue();
    const void* src = (const void*)(uintptr_t)info[1].As<Napi::Number>().DoubleValue();
    size_t bytes = (size_t)info[2].As<Napi::Number>().DoubleValue();
    cudaStream_t s = Stream(env, info[3]);
    if (bytes) CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    return env.Undefined();
  }

  // write(dstAddr, typedArray, stream, staged) -> whether the host waited for the device.
  // Staged (small writes to device memory): the bytes are copied into the pinned staging ring
  // and the copy is queued on the stream; an event per slot guards its reuse, so the host waits
  // only when the ring is full. Otherwise the copy is queued and the stream synchronized, since a
  // pageable source may be read by the copy engine until the stream reaches it.
  Napi::Value Write(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    void* dst = (void*)(uintptr_t)info[0].As<Napi::Number>().DoubleValue();
    Napi::TypedArray ta = info[1].As<Napi::TypedArray>();
    cudaStream_t s = Stream(env, info[2]);
    bool staged = info.Length() > 3 && info[3].ToBoolean().Value();
    const char* src = (const char*)ta.ArrayBuffer().Data() + ta.ByteOffset();
    size_t bytes = ta.ByteLength();
    bool waited = false;
    if (bytes && staged && bytes <= kStageMaxWrite) {
      size_t off = StageAlloc(env, (bytes + 255) & ~(size_t)255, &waited);
      memcpy(pinBase_ + stageOff_ + off, src, bytes);
      CU(cudaMemcpyAsync(dst, pinDev_ + stageOff_ + off, bytes, cudaMemcpyDefault, s));
      cudaEvent_t ev;
      if (stageEvents_.empty()) CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      else {
        ev = stageEvents_.back();
        stageEvents_.pop_back();
      }
      CU(cudaEventRecord(ev, s));
      staged_.push_back({off, (bytes + 255) & ~(size_t)255, ev});
    } else if (bytes) {
      CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
      CU(cudaStreamSynchronize(s));
      waited = true;
    }
    return Napi::Boolean::New(env, waited);
  }

  // A free range of `len` bytes in the staging ring. Live slots form one FIFO run
  // [front.off, head) that may wrap; completed slots are reclaimed from the front.
  size_t StageAlloc(Napi::Env env, size_t len, bool* waited) {
    for (;;) {
      while (!staged_.empty() && cudaEventQuery(staged_.front().ev) == cudaSuccess) {
        stageEvents_.push_back(staged_.front().ev);
        staged_.pop_front();
      }
      cudaGetLastError();  // a cudaErrorNotReady from the query is not an error
      if (staged_.empty()) {
        stageHead_ = len;
        return 0;
      }
      size_t tail = staged_.front().off;
      if (stageHead_ > tail) {
        if (stageHead_ + len <= kStageBytes) {
          size_t off = stageHead_;
          stageHead_ += len;
          return off;
        }
        if (len < tail) {
          stageHead_ = len;
          return 0;
        }
      } else if (stageHead_ + len < tail) {
        size_t off = stageHead_;
        stageHead_ += len;
        return off;
      }
      CU(cudaEventSynchronize(staged_.front().ev));
      *waited = true;
    }
  }

  // read(srcAddr, bytes): waits for the whole device, then copies back (a hard sync).
  Napi::Value Read(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    const void* src = (const void*)(uintptr_t)info[0].As<Napi::Number>().DoubleValue();
    size_t bytes = (size_t)info[1].As<Napi::Number>().DoubleValue();
    Napi::ArrayBuffer ab = Napi::ArrayBuffer::New(env, bytes);
    CU(cudaDeviceSynchronize());
    if (bytes) CU(cudaMemcpy(ab.Data(), src, bytes, cudaMemcpyDefault));
    return ab;
  }

  Napi::Value CreateStream(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams_.push_back(s);
    return Napi::Number::New(env, (double)(streams_.size() - 1));
  }

  Napi::Value DestroyStream(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    int id = info[0].As<Napi::Number>().Int32Value();
    if (id == 0) throw Napi::Error::New(env, "the default stream cannot be destroyed");
    cudaStream_t s = Stream(env, info[0]);
    CU(cudaStreamDestroy(s));
    streams_[id] = nullptr;
    return env.Undefined();
  }

  Napi::Value CreateEvent(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    cudaEvent_t e;
    CU(cudaEventCreate(&e));
    events_.push_back(e);
    return Napi::Number::New(env, (double)(events_.size() - 1));
  }

  Napi::Value DestroyEvent(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    cudaEvent_t e = Event(env, info[0]);
    CU(cudaEventDestroy(e));
    events_[info[0].As<Napi::Number>().Int32Value()] = nullptr;
    return env.Undefined();
  }

  Napi::Value Record(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    CU(cudaEventRecord(Event(env, info[0]), Stream(env, info[1])));
    return env.Undefined();
  }

  Napi::Value WaitEvent(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    CU(cudaStreamWaitEvent(Stream(env, info[0]), Event(env, info[1]), 0));
    return env.Undefined();
  }

  Napi::Value Elapsed(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, Event(env, info[0]), Event(env, info[1])));
    return Napi::Number::New(env, ms);
  }

  // synchronize(stream | -1 for the whole device)
  Napi::Value Synchronize(const Napi::CallbackInfo& info) {
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
  Napi::Value SynchronizeEvent(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    CU(cudaEventSynchronize(Event(env, info[0])));
    return env.Undefined();
  }

  // NERVA_CUDA_SYNC: spin (cudaStreamSynchronize under the default schedule), block (a
  // blocking-sync event), or auto (default): block once the context has host compute modules.
  bool BlockingWait() {
    static const int mode = [] {
      const char* v = getenv("NERVA_CUDA_SYNC");
      if (v && !strcmp(v, "spin")) return 0;
      if (v && !strcmp(v, "block")) return 1;
      return 2;  // auto (createCudaBackend has rejected anything else)
    }();
    if (mode != 2) return mode == 1;
    for (auto& m : hostMlps_)
      if (m) return true;
    for (auto& h : hostAttns_)
      if (h) return true;
    return false;
  }

  Napi::Value BeginCapture(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    cudaStream_t s = Stream(env, info[0]);
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    ex_.capturing = true;
    return env.Undefined();
  }

  // endCapture(stream) -> [graphId, nodeCount]
  Napi::Value EndCapture(const Napi::CallbackInfo& info) {
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

  Napi::Value Replay(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    int id = info[0].As<Napi::Number>().Int32Value();
    if (id < 0 || id >= (int)graphs_.size() || !graphs_[id].exec) throw Napi::Error::New(env, "unknown graph");
    CU(cudaGraphLaunch(graphs_[id].exec, Stream(env, info[1])));
    graphReplays_++;
    return env.Undefined();
  }

  Napi::Value DestroyGraph(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    int id = info[0].As<Napi::Number>().Int32Value();
    if (id < 0 || id >= (int)graphs_.size() || !graphs_[id].exec) throw Napi::Error::New(env, "unknown graph");
    CU(cudaGraphExecDestroy(graphs_[id].exec));
    CU(cudaGraphDestroy(graphs_[id].graph));
    graphs_[id] = {nullptr, nullptr};
    return env.Undefined();
  }

  Napi::Value SetHotPath(const Napi::CallbackInfo& info) {
    hotPath_ = info[0].As<Napi::Boolean>().Value();
    return info.Env().Undefined();
  }

  Napi::Value Counters(const Napi::CallbackInfo& info) {
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
  Napi::Value CopyBandwidth(const Napi::CallbackInfo& info) {
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

  Napi::Value Dispose(const Napi::CallbackInfo& info) {
    nerva_trace_dump();
    Release();
    return info.Env().Undefined();
  }

  // NCCL (nccl_dl.cc): a rank on this context's device; send/recv on one of its streams.
  Napi::Value NcclCommInit(const Napi::CallbackInfo& info) {
    Live(info.Env());
    return nerva_nccl::CommInit(info, device_);
  }
  Napi::Value NcclSend(const Napi::CallbackInfo& info) {
    Live(info.Env());
    return nerva_nccl::SendRecv(info, true, device_, Stream(info.Env(), info[5]));
  }
  Napi::Value NcclRecv(const Napi::CallbackInfo& info) {
    Live(info.Env());
    return nerva_nccl::SendRecv(info, false, device_, Stream(info.Env(), info[5]));
  }

  // Host MLP (host_mlp.cc): CPU-computed MLP channels of a streamed layer. The args live here,
  // at a stable address, for the host functions and graphs that reference them.
  struct HostMlp {
    HostMlpArgs args;
    HostMlpCounters counters;
  };

  HostMlp& HostMlpAt(Napi::Env env, const Napi::Value& v) {
    int id = v.IsNumber() ? v.As<Napi::Number>().Int32Value() : -1;
    if (id < 0 || id >= (int)hostMlps_.size() || !hostMlps_[id]) throw Napi::Error::New(env, "unknown host MLP " + std::to_string(id));
    return *hostMlps_[id];
  }

  // hostMlpCreate({ rows, hidden, inter, eps, x, normW, gateUp, down, y }) -> id
  Napi::Value HostMlpCreate(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    if (hotPath_) {
      hotPathRejected_++;
      throw Napi::Error::New(env, "HOT_PATH: hostMlpCreate allocates and the hot-path guard is armed");
    }
    Napi::Object o = info[0].As<Napi::Object>();
    const char* keys[9] = {"rows", "hidden", "inter", "eps", "x", "normW", "gateUp", "down", "y"};
    double v[9];
    for (int i = 0; i < 9; i++) v[i] = o.Has(keys[i]) ? o.Get(keys[i]).ToNumber().DoubleValue() : (i == 3 ? 1e-6 : 0);
    auto m = std::make_unique<HostMlp>();
    char why[160] = {0};
    if (!nerva_host_mlp_resolve(&m->args, v, {pinBase_, pinDev_, pinBytes_}, why, sizeof why))
      throw Napi::Error::New(env, std::string("hostMlpCreate: ") + why);
    m->args.counters = &m->counters;
    nerva_host_mlp_reserve(m->args.rows, m->args.hidden, m->args.inter);  // no allocation when it runs
    hostMlps_.push_back(std::move(m));
    return Napi::Number::New(env, (double)(hostMlps_.size() - 1));
  }

  // hostMlpEnqueue(id, stream): cudaLaunchHostFunc on the stream (capturable into a graph).
  Napi::Value HostMlpEnqueue(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    HostMlp& m = HostMlpAt(env, info[0]);
    int rc = nerva_host_mlp_enqueue(Stream(env, info[1]), &m.args);
    if (rc != 0) throw cudaErr(env, rc, "cudaLaunchHostFunc(host MLP " + std::to_string(info[0].As<Napi::Number>().Int32Value()) + ")");
    return env.Undefined();
  }

  // hostMlpRun(id): now, on this thread and the pool; no CUDA call.
  Napi::Value HostMlpRun(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    nerva_host_mlp(HostMlpAt(env, info[0]).args);
    return env.Undefined();
  }

  // hostMlpDestroy(id): waits for the device first, so no queued host function still reads it;
  // graphs captured with it must be destroyed before.
  Napi::Value HostMlpDestroy(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    HostMlpAt(env, info[0]);
    CU(cudaDeviceSynchronize());
    hostMlps_[info[0].As<Napi::Number>().Int32Value()].reset();
    return env.Undefined();
  }

  // hostMlpStats(id?) -> { calls, ns, threads, isa, pinned }: the process-wide pool, or one id's calls.
  Napi::Value HostMlpStats(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ::HostMlpStats s = nerva_host_mlp_stats();
    Napi::Object o = Napi::Object::New(env);
    if (info.Length() > 0 && !info[0].IsUndefined()) {
      const HostMlpCounters& c = HostMlpAt(env, info[0]).counters;
      o.Set("calls", (double)c.calls);
      o.Set("ns", (double)c.ns);
    } else {
      o.Set("calls", (double)s.calls);
      o.Set("ns", (double)s.ns);
    }
    o.Set("threads", s.threads);
    o.Set("isa", nerva_host_mlp_isa_name(s.isa));
    o.Set("pinned", s.pinned);
    return o;
  }

  // Host attention (host_attention.cc): the warm partial of tiered KV, computed by the CPU over
  // KV pages in the pinned arena. The args, the staging description and a pinned copy of the
  // int buffers (block tables, rowSeq, positions) live here for the host functions and graphs.
  struct HostAttn {
    HostAttnArgs args;
    HostAttnStage stage;
    HostAttnCounters counters;
    int* ints = nullptr;  // cudaHostAlloc: tables, then rowSeq, then positions
    HostChannel* channel = nullptr;  // the round trip's mechanism (host_channel.h), unless NERVA_HOST_CHANNEL=0
    ~HostAttn() {
      nerva_host_channel_destroy(channel);
      if (ints) cudaFreeHost(ints);
    }
  };

  // The device alias of a host pointer in the pinned arena (mapped when it was registered).
  char* PinnedDevView(const char* host) { return pinDev_ + (host - pinBase_); }

  HostAttn& HostAttnAt(Napi::Env env, const Napi::Value& v) {
    int id = v.IsNumber() ? v.As<Napi::Number>().Int32Value() : -1;
    if (id < 0 || id >= (int)hostAttns_.size() || !hostAttns_[id]) throw Napi::Error::New(env, "unknown host attention " + std::to_string(id));
    return *hostAttns_[id];
  }

  // The host view of `bytes` at a JS address that must lie in the pinned arena (device or host view).
  char* PinnedHostView(Napi::Env env, double addr, size_t bytes, const char* name) {
    char* p = (char*)(uintptr_t)addr;
    for (char* base : {pinDev_, pinBase_}) {
      if (!base || p < base || p >= base + pinBytes_) continue;
      if (bytes > (size_t)(base + pinBytes_ - p)) throw Napi::Error::New(env, std::string("hostAttnCreate: ") + name + " runs past the pinned arena");
      return pinBase_ + (p - base);
    }
    throw Napi::Error::New(env, std::string("hostAttnCreate: ") + name + " is not in the pinned arena (the CPU computes on it)");
  }

  // hostAttnCreate({ rows, numHeads, numKvHeads, headDim, blockSize, maxBlocksPerSeq, numSeqs,
  //   numBlocks, window, scale, kvDtype, k, v, qHost, outHost, lseHost, q, qStride, qOffset,
  //   tables, rowSeq, positions }) -> id. k, v, qHost, outHost, lseHost: pinned arena; q, tables,
  //   rowSeq, positions: any (copied on the stream before the host function).
  Napi::Value HostAttnCreate(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    if (hotPath_) {
      hotPathRejected_++;
      throw Napi::Error::New(env, "HOT_PATH: hostAttnCreate allocates and the hot-path guard is armed");
    }
    Napi::Object o = info[0].As<Napi::Object>();
    auto num = [&](const char* k) -> double {
      if (!o.Has(k)) throw Napi::Error::New(env, std::string("hostAttnCreate: missing ") + k);
      double d = o.Get(k).ToNumber().DoubleValue();
      if (!(d >= 0 && d < MAX_SAFE) && std::string(k) != "scale") throw Napi::Error::New(env, std::string("hostAttnCreate: bad ") + k);
      return d;
    };
    auto h = std::make_unique<HostAttn>();
    HostAttnArgs& a = h->args;
    a.rows = (int)num("rows");
    a.numHeads = (int)num("numHeads");
    a.numKvHeads = (int)num("numKvHeads");
    a.headDim = (int)num("headDim");
    a.blockSize = (int)num("blockSize");
    a.maxBlocksPerSeq = (int)num("maxBlocksPerSeq");
    a.numSeqs = (int)num("numSeqs");
    a.numBlocks = (long long)num("numBlocks");
    a.window = (int)num("window");
    a.scale = (float)num("scale");
    a.kvDtype = (int)num("kvDtype");
    {
      HostAttnArgs shape = a;  // the shape alone (rows 0 skips the pointer checks)
      shape.rows = 0;
      if (const char* why = nerva_host_attention_validate(shape)) throw Napi::Error::New(env, std::string("hostAttnCreate: ") + why);
    }
    const size_t eb = a.kvDtype == HOST_ATTN_F32 ? 4 : 2;
    const size_t kvBytes = (size_t)a.numBlocks * a.blockSize * a.numKvHeads * a.headDim * eb;
    const size_t qBytes = (size_t)a.rows * a.numHeads * a.headDim * 4;
    a.k = PinnedHostView(env, num("k"), kvBytes, "k");
    a.v = PinnedHostView(env, num("v"), kvBytes, "v");
    a.q = (const float*)PinnedHostView(env, num("qHost"), qBytes, "qHost");
    a.out = (float*)PinnedHostView(env, num("outHost"), qBytes, "outHost");
    a.lse = num("lseHost") ? (float*)PinnedHostView(env, num("lseHost"), (size_t)a.rows * a.numHeads * 4, "lseHost") : nullptr;
    const size_t nTables = (size_t)a.numSeqs * a.maxBlocksPerSeq;
    // The first pass of a shape may be the one being captured into a graph: a host allocation is
    // not a stream operation, so it is allowed (relaxed mode) without invalidating the capture.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t ae = cudaHostAlloc((void**)&h->ints, (nTables + 2 * (size_t)a.rows + 1) * sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable);
    int* intsDev = nullptr;
    if (ae == cudaSuccess) ae = cudaHostGetDevicePointer((void**)&intsDev, h->ints, 0);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (ae != cudaSuccess) throw cudaErr(env, (int)ae, "cudaHostAlloc(host attention staging)");
    a.tables = h->ints;
    a.rowSeq = h->ints + nTables;
    a.positions = h->ints + nTables + a.rows;
    a.counters = &h->counters;
    HostAttnStage& st = h->stage;
    st.qSrc = (const float*)(uintptr_t)num("q");
    st.qStride = (int)num("qStride");
    st.qOffset = (int)num("qOffset");
    st.tablesSrc = (const int*)(uintptr_t)num("tables");
    st.rowSeqSrc = (const int*)(uintptr_t)num("rowSeq");
    st.positionsSrc = (const int*)(uintptr_t)num("positions");
    st.outDst = (float*)(uintptr_t)num("out");
    st.lseDst = a.lse ? (float*)(uintptr_t)num("lse") : nullptr;
    if (!st.outDst || (a.lse && !st.lseDst)) throw Napi::Error::New(env, "hostAttnCreate: out (and lse with lseHost) must be device addresses");
    if (const char* why = nerva_host_attention_validate(a)) throw Napi::Error::New(env, std::string("hostAttnCreate: ") + why);
    if (nerva_host_channel_enabled()) {
      st.qDev = (float*)PinnedDevView((const char*)a.q);
      st.intsDev = intsDev;
      st.outHostDev = (const float*)PinnedDevView((const char*)a.out);
      st.lseHostDev = a.lse ? (const float*)PinnedDevView((const char*)a.lse) : nullptr;
      int ce = 0;
      h->channel = nerva_host_channel_create(nerva_host_attention_channel_fn, &h->args, &ce);
      if (!h->channel) throw cudaErr(env, ce, "host channel (host attention)");
      st.channel = h->channel;
    }
    nerva_host_attention_reserve(a.rows, a.numHeads, a.numKvHeads, a.headDim);  // no allocation when it runs
    hostAttns_.push_back(std::move(h));
    return Napi::Number::New(env, (double)(hostAttns_.size() - 1));
  }

  // hostAttnEnqueue(id, stream): staging copies + cudaLaunchHostFunc (capturable into a graph).
  Napi::Value HostAttnEnqueue(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    HostAttn& h = HostAttnAt(env, info[0]);
    int rc = nerva_host_attention_enqueue(Stream(env, info[1]), &h.args, &h.stage);
    if (rc != 0) throw cudaErr(env, rc, "host attention " + std::to_string(info[0].As<Napi::Number>().Int32Value()));
    return env.Undefined();
  }

  Napi::Value HostAttnDestroy(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env);
    HostAttnAt(env, info[0]);
    CU(cudaDeviceSynchronize());
    hostAttns_[info[0].As<Napi::Number>().Int32Value()].reset();
    return env.Undefined();
  }

  // hostAttnStats() -> { calls, ns, keys, badBlocks, threads } summed over every argument block.
  Napi::Value HostAttnStats(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    HostAttnCounters t;
    for (auto& h : hostAttns_)
      if (h) {
        t.calls += h->counters.calls;
        t.ns += h->counters.ns;
        t.keys += h->counters.keys;
        t.badBlocks += h->counters.badBlocks;
      }
    Napi::Object o = Napi::Object::New(env);
    o.Set("calls", (double)t.calls);
    o.Set("ns", (double)t.ns);
    o.Set("keys", (double)t.keys);
    o.Set("badBlocks", (double)t.badBlocks);
    o.Set("threads", nerva_host_attention_threads());
    const HostChannelStats cs = nerva_host_channel_stats();
    o.Set("channel", nerva_host_channel_enabled());
    o.Set("channelServed", (double)cs.served);
    o.Set("channelTimeouts", (double)cs.timeouts);
    o.Set("channelArms", (double)cs.arms);
    o.Set("channelWakeups", (double)cs.wakeups);
    return o;
  }

  struct Graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
  };

  struct Staged {
    size_t off, len;
    cudaEvent_t ev;
  };
  static constexpr size_t kStageBytes = 4u << 20;     // the pinned staging ring
  static constexpr size_t kStageMaxWrite = 1u << 20;  // larger writes synchronize instead
  static constexpr size_t kCounterCount = 16384;      // attention combine counters (rows x heads)
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

// probe() -> { ok, count, name?, computeCapability?, error? }: never throws.
Napi::Value Probe(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = Napi::Object::New(env);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    o.Set("ok", false);
    o.Set("count", 0);
    o.Set("error", std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
    return o;
  }
  o.Set("ok", n > 0);
  o.Set("count", n);
  if (n > 0) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) {
      o.Set("name", p.name);
      o.Set("computeCapability", std::to_string(p.major) + "." + std::to_string(p.minor));
    }
  } else {
    o.Set("error", "no CUDA device");
  }
  return o;
}

Napi::Object InitModule(Napi::Env env, Napi::Object exports) {
  exports.Set("Context", Context::Init(env));
  exports.Set("probe", Napi::Function::New(env, Probe));
  exports.Set("abiVersion", Napi::Number::New(env, 1));
  nerva_nccl::Register(env, exports);
  return exports;
}

}  // namespace

NODE_API_MODULE(nerva_cuda, InitModule)
