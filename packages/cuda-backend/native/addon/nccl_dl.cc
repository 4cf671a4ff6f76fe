// NCCL for the stage pipeline: hidden states pass between GPUs with ncclSend/ncclRecv on a stream
// of the receiving and sending contexts. libnccl.so.2 is loaded at run time (see nccl_dl.h), from
// NERVA_NCCL_PATH, the system's loader path, or directories JavaScript passes (the pip wheel's
// .../site-packages/nvidia/nccl/lib). Communicators live in one process-wide table: a
// ncclCommInitAll spans devices, so its ranks belong to several Contexts, and a communicator may
// outlive the Context that created it. Every NCCL failure becomes a JS exception naming the call,
// the ncclResult_t and ncclGetErrorString's text (properties ncclError, call, status).
#include "nccl_dl.h"

#include "knobs.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace nerva_nccl {
namespace {

constexpr const char* kLibName = "libnccl.so.2";
constexpr double MAX_SAFE = 9007199254740992.0;  // 2^53: addresses travel as JS numbers

struct CommEntry {
  Comm comm = nullptr;
  int device = -1;
  int nranks = 0;
  int rank = 0;
};

// Guards api while loading and the communicator table; never held across a blocking NCCL call
// (ncclCommInitRank waits for every rank, which other threads may be about to provide).
std::mutex mu;
Api api;
std::string libPath;
std::vector<CommEntry> comms;

const char* kTypeNames[kDataTypeCount] = {"int8",   "uint8",   "int32",   "uint32",  "int64",
                                          "uint64", "float16", "float32", "float64", "bfloat16"};

const char* ResultName(int r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    case ncclTimeout: return "ncclTimeout";
    default: return "ncclUnknownResult";
  }
}

// NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z after.
std::string VersionString(int code) {
  int major, minor, patch = code % 100;
  if (code >= 10000) {
    major = code / 10000;
    minor = (code % 10000) / 100;
  } else {
    major = code / 1000;
    minor = (code % 1000) / 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

Napi::Error NcclErr(Napi::Env env, int code, const std::string& call, Comm comm) {
  std::string name = ResultName(code);
  const char* desc = api.getErrorString ? api.getErrorString((Result)code) : nullptr;
  std::string msg = name + " (" + (desc ? desc : "no description") + ") in " + call;
  if (api.getLastError) {
    const char* last = api.getLastError(comm);
    if (last && *last) msg += ": " + std::string(last);
  }
  Napi::Error err = Napi::Error::New(env, msg);
  err.Value().Set("ncclError", Napi::String::New(env, name));
  err.Value().Set("call", Napi::String::New(env, call));
  err.Value().Set("status", Napi::Number::New(env, code));
  return err;
}

// Failures of ours rather than NCCL's: kind is NCCL_NOT_LOADED, NCCL_MISSING_SYMBOL or NERVA_BAD_ARGS.
Napi::Error UsageErr(Napi::Env env, const char* kind, const std::string& call, const std::string& msg) {
  Napi::Error err = Napi::Error::New(env, msg);
  err.Value().Set("ncclError", Napi::String::New(env, kind));
  err.Value().Set("call", Napi::String::New(env, call));
  return err;
}

// Makes `device` current for the NCCL call in scope (device -1: keeps the current one) and makes
// the previous device current again after, whatever the call left current: the Context's calls
// rely on the device its constructor made current.
struct DeviceScope {
  int prev = -1;
  DeviceScope(Napi::Env env, int device) {
    if (cudaGetDevice(&prev) != cudaSuccess) {
      cudaGetLastError();
      prev = -1;
    }
    if (device < 0 || prev == device) return;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::string call = "cudaSetDevice(" + std::to_string(device) + ")";
      Napi::Error err = Napi::Error::New(env, std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ") in " + call);
      err.Value().Set("cudaError", Napi::String::New(env, cudaGetErrorName(e)));
      err.Value().Set("call", Napi::String::New(env, call));
      err.Value().Set("status", Napi::Number::New(env, (int)e));
      throw err;
    }
  }
  ~DeviceScope() {
    if (prev < 0) return;
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur == prev) return;
    if (cudaSetDevice(prev) != cudaSuccess || e != cudaSuccess) cudaGetLastError();
  }
};

// The loaded library, or a NCCL_NOT_LOADED exception.
const Api& Need(Napi::Env env, const std::string& call) {
  std::lock_guard<std::mutex> lock(mu);
  if (!api.lib) throw UsageErr(env, "NCCL_NOT_LOADED", call, call + ": NCCL is not loaded (call ncclLoad first)");
  return api;
}

int IntArg(Napi::Env env, const Napi::Value& v, const std::string& call, const char* what, int lo, int hi) {
  double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1.0;
  if (!(d >= lo && d <= hi) || d != (double)(long long)d)
    throw UsageErr(env, "NERVA_BAD_ARGS", call,
                   call + ": " + what + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return (int)d;
}

double SizeArg(Napi::Env env, const Napi::Value& v, const std::string& call, const char* what) {
  double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
  if (!(d >= 0 && d < MAX_SAFE) || d != (double)(long long)d)
    throw UsageErr(env, "NERVA_BAD_ARGS", call, call + ": " + what + " must be a non-negative integer below 2^53");
  return d;
}

int AddComm(const CommEntry& e) {
  std::lock_guard<std::mutex> lock(mu);
  comms.push_back(e);
  return (int)comms.size() - 1;
}

CommEntry GetComm(Napi::Env env, const Napi::Value& v, const std::string& call) {
  int id = IntArg(env, v, call, "comm", 0, INT_MAX);
  std::lock_guard<std::mutex> lock(mu);
  if (id >= (int)comms.size() || !comms[id].comm)
    throw UsageErr(env, "NERVA_BAD_ARGS", call, call + ": unknown NCCL communicator #" + std::to_string(id));
  return comms[id];
}

bool IsDir(const char* p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

// dlopens one candidate and resolves every symbol; fills api on success (caller holds mu).
bool Open(const std::string& name, std::string* why) {
  dlerror();
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    *why = e ? e : "dlopen failed";
    return false;
  }
  Api a;
  a.lib = lib;
  const char* missing = nullptr;
  auto need = [&](auto& fn, const char* sym) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, sym));
    if (!fn && !missing) missing = sym;
  };
  auto want = [&](auto& fn, const char* sym) { fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, sym)); };
  need(a.getVersion, "ncclGetVersion");
  need(a.getUniqueId, "ncclGetUniqueId");
  need(a.commInitRank, "ncclCommInitRank");
  need(a.commDestroy, "ncclCommDestroy");
  need(a.commAbort, "ncclCommAbort");
  need(a.commCount, "ncclCommCount");
  need(a.commUserRank, "ncclCommUserRank");
  need(a.send, "ncclSend");
  need(a.recv, "ncclRecv");
  need(a.groupStart, "ncclGroupStart");
  need(a.groupEnd, "ncclGroupEnd");
  need(a.getErrorString, "ncclGetErrorString");
  want(a.commInitAll, "ncclCommInitAll");
  want(a.commCuDevice, "ncclCommCuDevice");
  want(a.commGetAsyncError, "ncclCommGetAsyncError");
  want(a.getLastError, "ncclGetLastError");
  int v = 0;
  if (missing) *why = std::string("lacks ") + missing + " (NCCL 2.7 or later is needed)";
  else if (a.getVersion(&v) != ncclSuccess) *why = "ncclGetVersion failed";
  if (missing || v == 0) {
    dlclose(lib);
    return false;
  }
  a.version = v;
  Dl_info di;
  libPath = dladdr(reinterpret_cast<void*>(a.getVersion), &di) && di.dli_fname && *di.dli_fname ? di.dli_fname : name;
  api = a;
  return true;
}

// ncclLoad(candidateDirs?: string[]) -> { ok, version, versionString, path, initAll } | { ok: false, error }.
// Tries NERVA_NCCL_PATH (a file, or a directory holding libnccl.so.2), the loader's own search
// for libnccl.so.2, then each candidate directory. Never throws; a loaded library stays loaded.
Napi::Value Load(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::vector<std::string> dirs;
  if (info.Length() > 0 && info[0].IsArray()) {
    Napi::Array a = info[0].As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); i++) {
      Napi::Value v = a.Get(i);
      if (v.IsString()) dirs.push_back(v.As<Napi::String>().Utf8Value());
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  std::string error;
  if (!api.lib) {
    std::vector<std::string> cands;
    const char* envPath = nerva::knobs::textValue("NERVA_NCCL_PATH");
    if (*envPath) cands.push_back(IsDir(envPath) ? std::string(envPath) + "/" + kLibName : std::string(envPath));
    cands.push_back(kLibName);
    for (const auto& d : dirs)
      if (!d.empty()) cands.push_back(d + "/" + kLibName);
    for (const auto& c : cands) {
      std::string why;
      if (Open(c, &why)) break;
      error += (error.empty() ? "" : "; ") + c + " (" + why + ")";
    }
  }
  Napi::Object o = Napi::Object::New(env);
  o.Set("ok", api.lib != nullptr);
  if (api.lib) {
    o.Set("version", api.version);
    o.Set("versionString", VersionString(api.version));
    o.Set("path", libPath);
    o.Set("initAll", api.commInitAll != nullptr);
  } else {
    o.Set("error", std::string(kLibName) + " not loadable: " + error);
  }
  return o;
}

// ncclUniqueId() -> Uint8Array(128): rank 0's id, shared with every rank of a new communicator.
Napi::Value UniqueIdBytes(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const Api& a = Need(env, "ncclGetUniqueId");
  UniqueId id;
  std::memset(&id, 0, sizeof id);
  Result r = a.getUniqueId(&id);
  if (r != ncclSuccess) throw NcclErr(env, r, "ncclGetUniqueId", nullptr);
  Napi::Uint8Array out = Napi::Uint8Array::New(env, kUniqueIdBytes);
  std::memcpy(out.Data(), &id, kUniqueIdBytes);
  return out;
}

Napi::Value GroupStart(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Result r = Need(env, "ncclGroupStart").groupStart();
  if (r != ncclSuccess) throw NcclErr(env, r, "ncclGroupStart", nullptr);
  return env.Undefined();
}

// Issues every call queued since ncclGroupStart (communicator inits, sends, receives).
Napi::Value GroupEnd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const Api& a = Need(env, "ncclGroupEnd");
  Result r;
  {
    DeviceScope scope(env, -1);  // the group's work is launched on each communicator's device
    r = a.groupEnd();
  }
  if (r != ncclSuccess && r != ncclInProgress) throw NcclErr(env, r, "ncclGroupEnd", nullptr);
  return env.Undefined();
}

// ncclCommInitAll(devices: number[]) -> comm ids, rank i on devices[i], all in this process.
Napi::Value CommInitAll(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string call = "ncclCommInitAll";
  const Api& a = Need(env, call);
  if (!a.commInitAll) throw UsageErr(env, "NCCL_MISSING_SYMBOL", call, "this libnccl lacks ncclCommInitAll");
  if (info.Length() < 1 || !info[0].IsArray()) throw UsageErr(env, "NERVA_BAD_ARGS", call, call + ": expected an array of devices");
  Napi::Array arr = info[0].As<Napi::Array>();
  std::vector<int> devs;
  call += "(devices";
  for (uint32_t i = 0; i < arr.Length(); i++) {
    devs.push_back(IntArg(env, arr.Get(i), "ncclCommInitAll", "device", 0, INT_MAX));
    call += (i ? "," : " ") + std::to_string(devs.back());
  }
  call += ")";
  if (devs.empty()) throw UsageErr(env, "NERVA_BAD_ARGS", call, "ncclCommInitAll: no devices");
  std::vector<Comm> cs(devs.size(), nullptr);
  Result r;
  {
    DeviceScope scope(env, -1);
    r = a.commInitAll(cs.data(), (int)devs.size(), devs.data());
  }
  if (r != ncclSuccess) throw NcclErr(env, r, call, nullptr);
  Napi::Array ids = Napi::Array::New(env, devs.size());
  for (size_t i = 0; i < devs.size(); i++) ids.Set((uint32_t)i, AddComm({cs[i], devs[i], (int)devs.size(), (int)i}));
  return ids;
}

// ncclCommInfo(comm) -> { nranks, rank, device, asyncError? } as NCCL reports them.
Napi::Value CommInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const Api& a = Need(env, "ncclCommInfo");
  CommEntry c = GetComm(env, info[0], "ncclCommInfo");
  int n = 0, rank = 0, dev = c.device;
  Result r = a.commCount(c.comm, &n);
  if (r != ncclSuccess) throw NcclErr(env, r, "ncclCommCount", c.comm);
  r = a.commUserRank(c.comm, &rank);
  if (r != ncclSuccess) throw NcclErr(env, r, "ncclCommUserRank", c.comm);
  if (a.commCuDevice && (r = a.commCuDevice(c.comm, &dev)) != ncclSuccess) throw NcclErr(env, r, "ncclCommCuDevice", c.comm);
  Napi::Object o = Napi::Object::New(env);
  o.Set("nranks", n);
  o.Set("rank", rank);
  o.Set("device", dev);
  Result async = ncclSuccess;
  if (a.commGetAsyncError && a.commGetAsyncError(c.comm, &async) == ncclSuccess && async != ncclSuccess)
    o.Set("asyncError", ResultName(async));
  return o;
}

Napi::Value Destroy(const Napi::CallbackInfo& info, bool abort) {
  Napi::Env env = info.Env();
  const char* name = abort ? "ncclCommAbort" : "ncclCommDestroy";
  const Api& a = Need(env, name);
  CommEntry c = GetComm(env, info[0], name);
  int id = info[0].As<Napi::Number>().Int32Value();
  Result r;
  {
    DeviceScope scope(env, -1);
    r = abort ? a.commAbort(c.comm) : a.commDestroy(c.comm);
  }
  // A failed destroy leaves the entry: ncclCommAbort may still be tried on it.
  if (r != ncclSuccess) throw NcclErr(env, r, std::string(name) + "(comm #" + std::to_string(id) + ")", nullptr);
  std::lock_guard<std::mutex> lock(mu);
  comms[id].comm = nullptr;
  return env.Undefined();
}

Napi::Value CommDestroy(const Napi::CallbackInfo& info) { return Destroy(info, false); }
Napi::Value CommAbort(const Napi::CallbackInfo& info) { return Destroy(info, true); }

}  // namespace

void Register(Napi::Env env, Napi::Object exports) {
  exports.Set("ncclLoad", Napi::Function::New(env, Load));
  exports.Set("ncclUniqueId", Napi::Function::New(env, UniqueIdBytes));
  exports.Set("ncclGroupStart", Napi::Function::New(env, GroupStart));
  exports.Set("ncclGroupEnd", Napi::Function::New(env, GroupEnd));
  exports.Set("ncclCommInitAll", Napi::Function::New(env, CommInitAll));
  exports.Set("ncclCommInfo", Napi::Function::New(env, CommInfo));
  exports.Set("ncclCommDestroy", Napi::Function::New(env, CommDestroy));
  exports.Set("ncclCommAbort", Napi::Function::New(env, CommAbort));
  Napi::Object types = Napi::Object::New(env);
  for (int i = 0; i < kDataTypeCount; i++) types.Set(kTypeNames[i], i);
  exports.Set("ncclDataTypes", types);
  exports.Set("ncclUniqueIdBytes", kUniqueIdBytes);
}

Napi::Value CommInit(const Napi::CallbackInfo& info, int device) {
  Napi::Env env = info.Env();
  const char* name = "ncclCommInitRank";
  const Api& a = Need(env, name);
  int nranks = IntArg(env, info[0], name, "nranks", 1, INT_MAX);
  int rank = IntArg(env, info[1], name, "rank", 0, nranks - 1);
  if (info.Length() < 3 || !info[2].IsTypedArray() || info[2].As<Napi::TypedArray>().ByteLength() != kUniqueIdBytes)
    throw UsageErr(env, "NERVA_BAD_ARGS", name, std::string(name) + ": the unique id must be a typed array of 128 bytes");
  Napi::TypedArray ta = info[2].As<Napi::TypedArray>();
  UniqueId id;
  std::memcpy(&id, static_cast<const char*>(ta.ArrayBuffer().Data()) + ta.ByteOffset(), kUniqueIdBytes);
  std::string call = std::string(name) + "(nranks " + std::to_string(nranks) + ", rank " + std::to_string(rank) + ", device " +
                     std::to_string(device) + ")";
  Comm c = nullptr;
  Result r;
  {
    // The communicator's device is the one current at the call (inside a group too, where the
    // work itself happens at ncclGroupEnd).
    DeviceScope scope(env, device);
    r = a.commInitRank(&c, nranks, id, rank);
  }
  if (r != ncclSuccess && r != ncclInProgress) throw NcclErr(env, r, call, nullptr);
  return Napi::Number::New(env, AddComm({c, device, nranks, rank}));
}

Napi::Value SendRecv(const Napi::CallbackInfo& info, bool send, int device, cudaStream_t stream) {
  Napi::Env env = info.Env();
  const char* name = send ? "ncclSend" : "ncclRecv";
  const Api& a = Need(env, name);
  CommEntry c = GetComm(env, info[0], name);
  int id = info[0].As<Napi::Number>().Int32Value();
  if (c.device != device)
    throw UsageErr(env, "NERVA_BAD_ARGS", name,
                   std::string(name) + ": communicator #" + std::to_string(id) + " has its rank on device " + std::to_string(c.device) +
                       ", not on this context's device " + std::to_string(device));
  void* addr = reinterpret_cast<void*>((uintptr_t)SizeArg(env, info[1], name, "address"));
  size_t count = (size_t)SizeArg(env, info[2], name, "count");
  int dtype = IntArg(env, info[3], name, "dtype code", 0, kDataTypeCount - 1);
  int peer = IntArg(env, info[4], name, "peer", 0, c.nranks - 1);
  std::string call = std::string(name) + "(" + std::to_string(count) + " " + kTypeNames[dtype] + ", peer " + std::to_string(peer) +
                     ", comm #" + std::to_string(id) + " rank " + std::to_string(c.rank) + ")";
  Result r;
  {
    DeviceScope scope(env, device);
    r = send ? a.send(addr, count, (DataType)dtype, peer, c.comm, stream) : a.recv(addr, count, (DataType)dtype, peer, c.comm, stream);
  }
  if (r != ncclSuccess && r != ncclInProgress) throw NcclErr(env, r, call, c.comm);
  return env.Undefined();
}

}  // namespace nerva_nccl
