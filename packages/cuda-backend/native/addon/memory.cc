// The context's memory (context.h): the pinned arena's allocation, views of it, copies between
// tiers and the pinned staging ring of small writes.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "context.h"
#include "knobs.h"

namespace nerva::addon {

namespace {
constexpr size_t kPinnedViewBytes = (size_t)1 << 31;
}  // namespace

// The pinned arena. Where it can, it is anonymous memory advised for transparent huge pages and
// then registered (pinned and mapped) with CUDA: the host computes near data by streaming
// gigabytes of weights out of it each token, and 4 KiB pages (what cudaHostAlloc gets once other
// processes have fragmented memory) cut that streaming rate by about a quarter on the GPU
// machine (hardware prefetchers stop at page boundaries; TLB misses). NERVA_PINNED_HUGEPAGES=0,
// or a failed mmap/registration, falls back to cudaHostAlloc. The H2D path is the same either way.
cudaError_t Context::AllocPinned(size_t bytes) {
  if (std::strcmp(knobs::textValue("NERVA_PINNED_HUGEPAGES"), "0") != 0) {
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

void Context::FreePinned() {
  if (pinMapLen_) {
    cudaHostUnregister(pinBase_);
    munmap(pinBase_, pinMapLen_);
    pinMapLen_ = 0;
  } else {
    cudaFreeHost(pinBase_);
  }
}

// The whole pinned arena as one external ArrayBuffer: `peek` reads it with no CUDA call.
Napi::Value Context::PinnedArrayBuffer(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  // Node caps an ArrayBuffer below 4 GiB; a larger arena (host copies of paged weights) is
  // viewed up to 2 GiB, and peekPinned reads beyond it.
  return Napi::ArrayBuffer::New(env, pinBase_, std::min(pinBytes_, kPinnedViewBytes));
}

// peekPinned(offset, bytes) -> a copy of pinned-arena bytes, without any CUDA synchronization.
Napi::Value Context::PeekPinned(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  size_t off = (size_t)info[0].As<Napi::Number>().DoubleValue();
  size_t n = (size_t)info[1].As<Napi::Number>().DoubleValue();
  if (off > pinBytes_ || n > pinBytes_ - off) throw Napi::RangeError::New(env, "peekPinned: range outside the pinned arena");
  Napi::ArrayBuffer ab = Napi::ArrayBuffer::New(env, n);
  std::memcpy(ab.Data(), pinBase_ + off, n);
  return ab;
}

// copy(dstAddr, srcAddr, bytes, stream): any tier to any tier (unified addressing).
Napi::Value Context::Copy(const Napi::CallbackInfo& info) {
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
Napi::Value Context::Write(const Napi::CallbackInfo& info) {
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
size_t Context::StageAlloc(Napi::Env env, size_t len, bool* waited) {
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
Napi::Value Context::Read(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  const void* src = (const void*)(uintptr_t)info[0].As<Napi::Number>().DoubleValue();
  size_t bytes = (size_t)info[1].As<Napi::Number>().DoubleValue();
  Napi::ArrayBuffer ab = Napi::ArrayBuffer::New(env, bytes);
  CU(cudaDeviceSynchronize());
  if (bytes) CU(cudaMemcpy(ab.Data(), src, bytes, cudaMemcpyDefault));
  return ab;
}

// The device alias of a host pointer in the pinned arena (mapped when it was registered).
char* Context::PinnedDevView(const char* host) { return pinDev_ + (host - pinBase_); }

// The host view of `bytes` at a JS address that must lie in the pinned arena (device or host view).
char* Context::PinnedHostView(Napi::Env env, double addr, size_t bytes, const char* name) {
  char* p = (char*)(uintptr_t)addr;
  for (char* base : {pinDev_, pinBase_}) {
    if (!base || p < base || p >= base + pinBytes_) continue;
    if (bytes > (size_t)(base + pinBytes_ - p)) throw Napi::Error::New(env, std::string("hostAttnCreate: ") + name + " runs past the pinned arena");
    return pinBase_ + (p - base);
  }
  throw Napi::Error::New(env, std::string("hostAttnCreate: ") + name + " is not in the pinned arena (the CPU computes on it)");
}

}  // namespace nerva::addon
