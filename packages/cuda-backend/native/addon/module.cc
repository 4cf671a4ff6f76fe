// The addon's module: the Context class, probe(), the knob table and the NCCL functions.
#include <napi.h>

#include <cstring>
#include <string>

#include "context.h"
#include "knobs.h"
#include "nccl_dl.h"

namespace nerva::addon {
namespace {

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

const char* kindName(knobs::Kind k) {
  return k == knobs::Kind::Int ? "int" : k == knobs::Kind::OneOf ? "oneOf" : "path";
}

// knobs() -> [{ name, kind, default, min?, max?, values?, doc, value }]: the table, each knob's
// value as the native code reads it (the environment's when valid, else the default).
Napi::Value Knobs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t n = 0;
  const knobs::Knob* t = knobs::table(&n);
  Napi::Array out = Napi::Array::New(env, n);
  for (size_t i = 0; i < n; i++) {
    const knobs::Knob& k = t[i];
    Napi::Object o = Napi::Object::New(env);
    o.Set("name", k.name);
    o.Set("kind", kindName(k.kind));
    o.Set("default", k.dflt ? k.dflt : "");
    if (k.kind == knobs::Kind::Int) {
      o.Set("min", (double)k.min);
      o.Set("max", (double)k.max);
    }
    if (k.kind == knobs::Kind::OneOf) {
      Napi::Array vals = Napi::Array::New(env);
      std::string all = k.values ? k.values : "";
      uint32_t j = 0;
      for (size_t p = 0; p <= all.size();) {
        size_t q = all.find(',', p);
        if (q == std::string::npos) q = all.size();
        vals.Set(j++, all.substr(p, q - p));
        p = q + 1;
      }
      o.Set("values", vals);
    }
    o.Set("doc", k.doc ? k.doc : "");
    o.Set("value", knobs::textValue(k.name));
    out.Set((uint32_t)i, o);
  }
  return out;
}

// validateKnobs() -> null, or { name, message } for the first knob set to a value it does not
// accept (message names the variable, the value and what it accepts).
Napi::Value ValidateKnobs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  char why[512] = {0};
  if (knobs::validate(why, sizeof why)) return env.Null();
  Napi::Object o = Napi::Object::New(env);
  std::string name;
  size_t n = 0;
  const knobs::Knob* t = knobs::table(&n);
  for (size_t i = 0; i < n; i++)  // the knob the message is about: the longest name it contains
    if (std::strstr(why, t[i].name) && std::strlen(t[i].name) > name.size()) name = t[i].name;
  o.Set("name", name);
  o.Set("message", why);
  return o;
}

Napi::Object InitModule(Napi::Env env, Napi::Object exports) {
  exports.Set("Context", Context::Init(env));
  exports.Set("probe", Napi::Function::New(env, Probe));
  exports.Set("knobs", Napi::Function::New(env, Knobs));
  exports.Set("validateKnobs", Napi::Function::New(env, ValidateKnobs));
  exports.Set("abiVersion", Napi::Number::New(env, 3));
  nerva_nccl::Register(env, exports);
  return exports;
}

}  // namespace
}  // namespace nerva::addon

static Napi::Object InitNervaCuda(Napi::Env env, Napi::Object exports) { return nerva::addon::InitModule(env, exports); }

NODE_API_MODULE(nerva_cuda, InitNervaCuda)
