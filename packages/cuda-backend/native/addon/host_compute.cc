// The context's host compute modules (context.h): host MLP and host attention, computed by the
// CPU on data in the pinned arena, enqueued on the context's streams.
#include <cuda_runtime.h>

#include <string>

#include "context.h"

namespace nerva::addon {

Context::HostMlp& Context::HostMlpAt(Napi::Env env, const Napi::Value& v) {
  int id = v.IsNumber() ? v.As<Napi::Number>().Int32Value() : -1;
  if (id < 0 || id >= (int)hostMlps_.size() || !hostMlps_[id]) throw Napi::Error::New(env, "unknown host MLP " + std::to_string(id));
  return *hostMlps_[id];
}

// hostMlpCreate({ rows, hidden, inter, eps, x, normW, gateUp, down, y }) -> id
Napi::Value Context::HostMlpCreate(const Napi::CallbackInfo& info) {
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
Napi::Value Context::HostMlpEnqueue(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  HostMlp& m = HostMlpAt(env, info[0]);
  int rc = nerva_host_mlp_enqueue(Stream(env, info[1]), &m.args);
  if (rc != 0) throw cudaErr(env, rc, "cudaLaunchHostFunc(host MLP " + std::to_string(info[0].As<Napi::Number>().Int32Value()) + ")");
  return env.Undefined();
}

// hostMlpRun(id): now, on this thread and the pool; no CUDA call.
Napi::Value Context::HostMlpRun(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  nerva_host_mlp(HostMlpAt(env, info[0]).args);
  return env.Undefined();
}

// hostMlpDestroy(id): waits for the device first, so no queued host function still reads it;
// graphs captured with it must be destroyed before.
Napi::Value Context::HostMlpDestroy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  HostMlpAt(env, info[0]);
  CU(cudaDeviceSynchronize());
  hostMlps_[info[0].As<Napi::Number>().Int32Value()].reset();
  return env.Undefined();
}

// hostMlpStats(id?) -> { calls, ns, threads, isa, pinned }: the process-wide pool, or one id's calls.
Napi::Value Context::HostMlpStats(const Napi::CallbackInfo& info) {
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
  o.Set("isa", nerva_host_isa_name(s.isa));
  o.Set("pinned", s.pinned);
  return o;
}

Context::HostAttn& Context::HostAttnAt(Napi::Env env, const Napi::Value& v) {
  int id = v.IsNumber() ? v.As<Napi::Number>().Int32Value() : -1;
  if (id < 0 || id >= (int)hostAttns_.size() || !hostAttns_[id]) throw Napi::Error::New(env, "unknown host attention " + std::to_string(id));
  return *hostAttns_[id];
}

// hostAttnCreate({ rows, numHeads, numKvHeads, headDim, blockSize, maxBlocksPerSeq, numSeqs,
//   numBlocks, window, scale, kvDtype, k, v, qHost, outHost, lseHost, q, qStride, qOffset,
//   tables, rowSeq, positions }) -> id. k, v, qHost, outHost, lseHost: pinned arena; q, tables,
//   rowSeq, positions: any (copied on the stream before the host function).
Napi::Value Context::HostAttnCreate(const Napi::CallbackInfo& info) {
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
  // The round trip runs through a host channel (host_channel.h): kernels and a spinning server.
  st.qDev = (float*)PinnedDevView((const char*)a.q);
  st.intsDev = intsDev;
  st.outHostDev = (const float*)PinnedDevView((const char*)a.out);
  st.lseHostDev = a.lse ? (const float*)PinnedDevView((const char*)a.lse) : nullptr;
  int ce = 0;
  h->channel = nerva_host_channel_create(nerva_host_attention_channel_fn, &h->args, &ce);
  if (!h->channel) throw cudaErr(env, ce, "host channel (host attention)");
  st.channel = h->channel;
  nerva_host_attention_reserve(a.rows, a.numHeads, a.numKvHeads, a.headDim);  // no allocation when it runs
  hostAttns_.push_back(std::move(h));
  return Napi::Number::New(env, (double)(hostAttns_.size() - 1));
}

// hostAttnEnqueue(id, stream): staging copies + cudaLaunchHostFunc (capturable into a graph).
Napi::Value Context::HostAttnEnqueue(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  HostAttn& h = HostAttnAt(env, info[0]);
  int rc = nerva_host_attention_enqueue(Stream(env, info[1]), &h.args, &h.stage);
  if (rc != 0) throw cudaErr(env, rc, "host attention " + std::to_string(info[0].As<Napi::Number>().Int32Value()));
  return env.Undefined();
}

Napi::Value Context::HostAttnDestroy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Live(env);
  HostAttnAt(env, info[0]);
  CU(cudaDeviceSynchronize());
  hostAttns_[info[0].As<Napi::Number>().Int32Value()].reset();
  return env.Undefined();
}

// hostAttnStats() -> { calls, ns, keys, badBlocks, threads } summed over every argument block.
Napi::Value Context::HostAttnStats(const Napi::CallbackInfo& info) {
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
  o.Set("channel", true);
  o.Set("channelServed", (double)cs.served);
  o.Set("channelTimeouts", (double)cs.timeouts);
  o.Set("channelNaps", (double)cs.naps);
  return o;
}

}  // namespace nerva::addon
