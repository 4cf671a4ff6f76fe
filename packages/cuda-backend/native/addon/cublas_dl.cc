// cuBLAS is loaded at run time: the addon then builds without cuBLAS headers or libraries and
// still runs (with the GEMV fallback for many-row matmuls) where cuBLAS is absent.
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "nerva.h"

// The first of `names` that loads (13, 12, unversioned); nullptr with `why` filled otherwise.
static void* openFirst(const char* const (&names)[3], const char** picked, const char* what, char* why, size_t whyLen) {
  for (const char* n : names) {
    if (void* lib = dlopen(n, RTLD_NOW | RTLD_LOCAL)) {
      *picked = n;
      return lib;
    }
  }
  snprintf(why, whyLen, "%s not found (%s)", what, dlerror());
  return nullptr;
}

bool nerva_load_cublas(CublasApi* api, char* why, size_t whyLen) {
  const char* const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  const char* picked = nullptr;
  void* lib = openFirst(names, &picked, "libcublas", why, whyLen);
  if (!lib) return false;
  api->create = (cublasCreate_t)dlsym(lib, "cublasCreate_v2");
  api->destroy = (cublasDestroy_t)dlsym(lib, "cublasDestroy_v2");
  api->setStream = (cublasSetStream_t)dlsym(lib, "cublasSetStream_v2");
  api->setWorkspace = (cublasSetWorkspace_t)dlsym(lib, "cublasSetWorkspace_v2");
  api->gemmEx = (cublasGemmEx_t)dlsym(lib, "cublasGemmEx");
  if (!api->create || !api->destroy || !api->setStream || !api->setWorkspace || !api->gemmEx) {
    snprintf(why, whyLen, "%s lacks a needed symbol", picked);
    dlclose(lib);
    *api = CublasApi();
    return false;
  }
  api->lib = lib;
  snprintf(api->libName, sizeof api->libName, "%s", picked);
  return true;
}

// ---- cuBLASLt with pinned algorithms (batch-invariant matmuls) ----------------------------------

#include <stdlib.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "cublaslt_abi.h"

namespace {

struct LtApi {
  void* lib = nullptr;
  nlt::create_t create = nullptr;
  nlt::destroy_t destroy = nullptr;
  nlt::descCreate_t descCreate = nullptr;
  nlt::descDestroy_t descDestroy = nullptr;
  nlt::descSetAttr_t descSetAttr = nullptr;
  nlt::layoutCreate_t layoutCreate = nullptr;
  nlt::layoutDestroy_t layoutDestroy = nullptr;
  nlt::prefCreate_t prefCreate = nullptr;
  nlt::prefDestroy_t prefDestroy = nullptr;
  nlt::prefSetAttr_t prefSetAttr = nullptr;
  nlt::heuristic_t heuristic = nullptr;
  nlt::algoCheck_t algoCheck = nullptr;
  nlt::algoConfigGet_t algoConfigGet = nullptr;
  nlt::matmul_t matmul = nullptr;
};

// A pinned shape's algorithm for many rows (prompt chunks): the heuristic's own for LT_BIG_HINT
// rows, taken for calls of at least LT_BIG_MIN rows only once it gave the pin's bits.
enum class Big { none, unchecked, same, differs };

// An algorithm, the workspace its calls need, and its configuration (what nerva_lt_describe names).
struct LtChoice {
  nlt::Algo algo{};
  size_t wsBytes = 0;
  int id = -1, tile = -1, stages = -1;
};

// One pinned GEMM shape: the weight operand's layout, the algorithm (and the many-row one), and
// the layouts of x and out per row count met so far (a few: the decode batch buckets).
struct LtPin {
  bool ok = false;  // false: no algorithm qualified; the shape's matmuls take our kernels
  void* desc = nullptr;
  void* aLayout = nullptr;
  LtChoice pin;
  Big big = Big::none;
  LtChoice many;
  std::map<int, std::pair<void*, void*>> rowLayouts;  // n -> (x layout, out layout)
};

struct LtState {
  LtApi api;
  void* handle = nullptr;
  // (m, k) -> pin
  std::map<std::pair<int, int>, LtPin> pins;
};

// The row count the heuristic chooses each shape's algorithm for: a large decode batch. It fixes
// the bits of batch-invariant matmuls (the same for every row count of the process).
constexpr int LT_HINT_ROWS = 128;
int ltHintRows() { return LT_HINT_ROWS; }
// The many-row algorithm: chosen for LT_BIG_HINT rows, run from LT_BIG_MIN rows once it gave the
// pin's bits on LT_BIG_CHECK rows of the shape's first call of that size (the pin for 128 rows ran
// prompt chunks at 0.5-0.7 of cuBLAS's heuristic rate on the H200).
constexpr int LT_BIG_HINT = 4096;
constexpr int LT_BIG_MIN = 512;
constexpr int LT_BIG_CHECK = 64;

template <typename F>
bool sym(void* lib, const char* name, F* out) {
  *out = (F)dlsym(lib, name);
  return *out != nullptr;
}

int fail(NervaExec* ex, const char* call, int st) {
  snprintf(ex->errCall, sizeof ex->errCall, "%s (cuBLASLt status %d)", call, st);
  return NERVA_CUBLAS_FAILED;
}

// Layouts (column-major, as cuBLASLt sees them): W [m, k] row-major is A = [k, m] with op T;
// x [n, k] row-major is B = [k, n]; out [n, m] row-major is C = D = [m, n].
bool rowLayouts(LtState* s, LtPin& p, int m, int n, int k, std::pair<void*, void*>* out) {
  auto it = p.rowLayouts.find(n);
  if (it != p.rowLayouts.end()) {
    *out = it->second;
    return true;
  }
  void *b = nullptr, *c = nullptr;
  if (s->api.layoutCreate(&b, nlt::R_16BF, (uint64_t)k, (uint64_t)n, k) != 0) return false;
  if (s->api.layoutCreate(&c, nlt::R_32F, (uint64_t)m, (uint64_t)n, m) != 0) {
    s->api.layoutDestroy(b);
    return false;
  }
  p.rowLayouts[n] = {b, c};
  *out = {b, c};
  return true;
}

// The heuristic's first offer for `hintRows` rows with no split-K (a split's partial sums and their
// reduction would depend on the launch) that also runs `fewRows` and 4096 rows within the
// context's cuBLAS workspace: the workspace an algorithm asks may grow with the rows, and every
// call up to the largest must fit (a pin sized for the hint failed larger calls). False: none.
bool firstOffer(LtState* s, LtPin& p, int m, int k, int hintRows, int fewRows, void* pref, size_t wsMax, LtChoice* out) {
  const LtApi& a = s->api;
  std::pair<void*, void*> hint, few, big;
  if (!rowLayouts(s, p, m, hintRows, k, &hint) || !rowLayouts(s, p, m, fewRows, k, &few) || !rowLayouts(s, p, m, 4096, k, &big))
    return false;
  nlt::Heuristic res[16];
  int got = 0;
  if (a.heuristic(s->handle, p.desc, p.aLayout, hint.first, hint.second, hint.second, pref, 16, res, &got) != 0) return false;
  for (int i = 0; i < got; i++) {
    if (res[i].state != 0) continue;
    int32_t splitK = 1;
    size_t wr = 0;
    if (a.algoConfigGet(&res[i].algo, nlt::ALGO_CONFIG_SPLITK_NUM, &splitK, sizeof splitK, &wr) != 0 || splitK > 1) continue;
    nlt::Heuristic chkFew{}, chkBig{};
    if (a.algoCheck(s->handle, p.desc, p.aLayout, few.first, few.second, few.second, &res[i].algo, &chkFew) != 0) continue;
    if (a.algoCheck(s->handle, p.desc, p.aLayout, big.first, big.second, big.second, &res[i].algo, &chkBig) != 0) continue;
    const size_t need = std::max({res[i].workspaceSize, chkFew.workspaceSize, chkBig.workspaceSize});
    if (need > wsMax) continue;
    out->algo = res[i].algo;
    out->wsBytes = need;
    a.algoConfigGet(&out->algo, nlt::ALGO_CONFIG_ID, &out->id, sizeof out->id, &wr);
    a.algoConfigGet(&out->algo, nlt::ALGO_CONFIG_TILE_ID, &out->tile, sizeof out->tile, &wr);
    a.algoConfigGet(&out->algo, nlt::ALGO_CONFIG_STAGES_ID, &out->stages, sizeof out->stages, &wr);
    return true;
  }
  return false;
}

// Chooses the shape's algorithms once: the pin, the first offer for ltHintRows() rows (else for
// 1024) that qualifies down to one row (firstOffer); then the first for LT_BIG_HINT rows that
// qualifies down to LT_BIG_CHECK rows, a many-row candidate where it is not the pin itself
// (checkBig decides whether it is taken).
int pinShape(NervaExec* ex, LtState* s, LtPin& p, int m, int k) {
  const LtApi& a = s->api;
  int st = a.descCreate(&p.desc, nlt::COMPUTE_32F, nlt::R_32F);
  if (st != 0) return fail(ex, "cublasLtMatmulDescCreate", st);
  const int32_t opT = nlt::OP_T, opN = nlt::OP_N;
  a.descSetAttr(p.desc, nlt::DESC_TRANSA, &opT, sizeof opT);
  a.descSetAttr(p.desc, nlt::DESC_TRANSB, &opN, sizeof opN);
  st = a.layoutCreate(&p.aLayout, nlt::R_16BF, (uint64_t)k, (uint64_t)m, k);
  if (st != 0) return fail(ex, "cublasLtMatrixLayoutCreate", st);
  std::pair<void*, void*> one, big;
  if (!rowLayouts(s, p, m, 1, k, &one) || !rowLayouts(s, p, m, 4096, k, &big)) return fail(ex, "cublasLtMatrixLayoutCreate", -1);
  void* pref = nullptr;
  st = a.prefCreate(&pref);
  if (st != 0) return fail(ex, "cublasLtMatmulPreferenceCreate", st);
  const uint64_t wsMax = ex->cublasWsBytes;
  a.prefSetAttr(pref, nlt::PREF_MAX_WORKSPACE_BYTES, &wsMax, sizeof wsMax);
  // The hint's offers first; for few rows the heuristic may offer split-K only, so then those
  // for 1024 rows (a fixed sequence: the same process state always pins the same algorithm).
  for (int h : {ltHintRows(), 1024}) {
    if ((p.ok = firstOffer(s, p, m, k, h, 1, pref, wsMax, &p.pin))) break;
  }
  if (p.ok && firstOffer(s, p, m, k, LT_BIG_HINT, LT_BIG_CHECK, pref, wsMax, &p.many) &&
      memcmp(&p.many.algo, &p.pin.algo, sizeof p.pin.algo) != 0)
    p.big = Big::unchecked;
  a.prefDestroy(pref);
  return NERVA_OK;
}

// Whether the many-row algorithm gives the pin's bits: both run on the call's first LT_BIG_CHECK
// rows (its own weights and activations) into the cuBLASLt workspace, compared bit for bit on the
// host. Once per shape, outside graph capture (it synchronizes). Neither splits K, so each output
// is one sum over K whatever the row count; a kernel that sums in another order (another MMA
// shape, sliced K) gives other bits on nearly every output, and is refused. A shape whose two
// outputs do not fit the workspace is refused unchecked.
int checkBig(NervaExec* ex, LtState* s, LtPin& p, int m, int k, const void* w, const void* x) {
  p.big = Big::differs;
  auto align256 = [](size_t v) { return (v + 255) & ~(size_t)255; };
  const size_t ws = align256(std::max(p.pin.wsBytes, p.many.wsBytes));
  const size_t outBytes = (size_t)LT_BIG_CHECK * m * sizeof(float);
  if (ws + 2 * align256(outBytes) > ex->cublasWsBytes) return NERVA_OK;
  std::pair<void*, void*> lay;
  if (!rowLayouts(s, p, m, LT_BIG_CHECK, k, &lay)) return fail(ex, "cublasLtMatrixLayoutCreate", -1);
  float* o1 = (float*)(ex->cublasWs + ws);
  float* o2 = (float*)(ex->cublasWs + ws + align256(outBytes));
  const float one = 1.f, zero = 0.f;
  int st = s->api.matmul(s->handle, p.desc, &one, w, p.aLayout, x, lay.first, &zero, o1, lay.second, o1, lay.second, &p.pin.algo,
                         ex->cublasWs, p.pin.wsBytes, ex->stream);
  if (st != 0) return fail(ex, "cublasLtMatmul", st);
  st = s->api.matmul(s->handle, p.desc, &one, w, p.aLayout, x, lay.first, &zero, o2, lay.second, o2, lay.second, &p.many.algo,
                     ex->cublasWs, p.many.wsBytes, ex->stream);
  if (st != 0) return fail(ex, "cublasLtMatmul", st);
  std::vector<uint32_t> h1(outBytes / 4), h2(outBytes / 4);
  cudaError_t e = cudaMemcpyAsync(h1.data(), o1, outBytes, cudaMemcpyDeviceToHost, ex->stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(h2.data(), o2, outBytes, cudaMemcpyDeviceToHost, ex->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(ex->stream);
  if (e != cudaSuccess) {
    snprintf(ex->errCall, sizeof ex->errCall, "cuBLASLt many-row check: %s", cudaGetErrorString(e));
    return (int)e;
  }
  if (memcmp(h1.data(), h2.data(), outBytes) == 0) p.big = Big::same;
  return NERVA_OK;
}

void dropPin(LtState* s, LtPin& p) {
  for (auto& rl : p.rowLayouts) {
    s->api.layoutDestroy(rl.second.first);
    s->api.layoutDestroy(rl.second.second);
  }
  p.rowLayouts.clear();
  if (p.aLayout) s->api.layoutDestroy(p.aLayout);
  if (p.desc) s->api.descDestroy(p.desc);
  p.aLayout = p.desc = nullptr;
}

// The shape's pin, made at its first call (nullptr: cuBLASLt failed; errCall says why).
LtPin* pinFor(NervaExec* ex, LtState* s, int m, int k) {
  auto key = std::make_pair(m, k);
  auto it = s->pins.find(key);
  if (it != s->pins.end()) return &it->second;
  it = s->pins.emplace(key, LtPin()).first;
  if (pinShape(ex, s, it->second, m, k) != NERVA_OK) {
    dropPin(s, it->second);
    s->pins.erase(it);
    return nullptr;
  }
  // No algorithm qualified: nothing kept but the verdict.
  if (!it->second.ok) dropPin(s, it->second);
  return &it->second;
}

}  // namespace

bool nerva_lt_open(NervaExec* ex, char* why, size_t whyLen) {
  const char* const names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
  const char* picked = nullptr;
  void* lib = openFirst(names, &picked, "libcublasLt", why, whyLen);
  if (!lib) return false;
  LtState* s = new LtState();
  LtApi& a = s->api;
  a.lib = lib;
  bool ok = sym(lib, "cublasLtCreate", &a.create) && sym(lib, "cublasLtDestroy", &a.destroy) &&
            sym(lib, "cublasLtMatmulDescCreate", &a.descCreate) && sym(lib, "cublasLtMatmulDescDestroy", &a.descDestroy) &&
            sym(lib, "cublasLtMatmulDescSetAttribute", &a.descSetAttr) &&
            sym(lib, "cublasLtMatrixLayoutCreate", &a.layoutCreate) && sym(lib, "cublasLtMatrixLayoutDestroy", &a.layoutDestroy) &&
            sym(lib, "cublasLtMatmulPreferenceCreate", &a.prefCreate) &&
            sym(lib, "cublasLtMatmulPreferenceDestroy", &a.prefDestroy) &&
            sym(lib, "cublasLtMatmulPreferenceSetAttribute", &a.prefSetAttr) &&
            sym(lib, "cublasLtMatmulAlgoGetHeuristic", &a.heuristic) && sym(lib, "cublasLtMatmulAlgoCheck", &a.algoCheck) &&
            sym(lib, "cublasLtMatmulAlgoConfigGetAttribute", &a.algoConfigGet) && sym(lib, "cublasLtMatmul", &a.matmul);
  if (!ok) {
    snprintf(why, whyLen, "%s lacks a needed symbol", picked);
    dlclose(lib);
    delete s;
    return false;
  }
  int st = a.create(&s->handle);
  if (st != 0 || !s->handle) {
    snprintf(why, whyLen, "cublasLtCreate failed (status %d)", st);
    dlclose(lib);
    delete s;
    return false;
  }
  ex->lt = s;
  return true;
}

void nerva_lt_close(NervaExec* ex) {
  LtState* s = (LtState*)ex->lt;
  if (!s) return;
  for (auto& kv : s->pins) dropPin(s, kv.second);
  s->pins.clear();
  s->api.destroy(s->handle);
  dlclose(s->api.lib);
  delete s;
  ex->lt = nullptr;
}

int nerva_lt_pinned(NervaExec* ex, int m, int k) {
  LtState* s = (LtState*)ex->lt;
  if (!s) return 0;
  LtPin* p = pinFor(ex, s, m, k);
  return p ? (p->ok ? 1 : 0) : -1;
}

int nerva_lt_gemm(NervaExec* ex, int m, int n, int k, const void* w, const void* x, float* out, bool accumulate) {
  LtState* s = (LtState*)ex->lt;
  if (!s) return NERVA_CUBLAS_FAILED;
  LtPin* pp = pinFor(ex, s, m, k);
  if (!pp) return NERVA_CUBLAS_FAILED;
  if (!pp->ok) {
    snprintf(ex->errCall, sizeof ex->errCall, "cuBLASLt: no algorithm without split-K pinned for %d x %d", m, k);
    return NERVA_CUBLAS_FAILED;
  }
  LtPin& p = *pp;
  if (n >= LT_BIG_MIN && p.big == Big::unchecked && !ex->capturing) {
    int rc = checkBig(ex, s, p, m, k, w, x);
    if (rc) return rc;
  }
  const LtChoice& c = n >= LT_BIG_MIN && p.big == Big::same ? p.many : p.pin;
  std::pair<void*, void*> lay;
  if (!rowLayouts(s, p, m, n, k, &lay)) return fail(ex, "cublasLtMatrixLayoutCreate", -1);
  const float one = 1.f, zero = 0.f;
  int st = s->api.matmul(s->handle, p.desc, &one, w, p.aLayout, x, lay.first, accumulate ? &one : &zero, out, lay.second, out,
                         lay.second, &c.algo, ex->cublasWs, c.wsBytes, ex->stream);
  if (!ex->capturing) ex->launches++;
  return st == 0 ? NERVA_OK : fail(ex, "cublasLtMatmul", st);
}

void nerva_lt_describe(const NervaExec* ex, char* buf, size_t bytes) {
  buf[0] = 0;
  const LtState* s = (const LtState*)ex->lt;
  if (!s) return;
  size_t used = 0;
  for (const auto& kv : s->pins) {
    if (used + 1 >= bytes) break;
    const LtPin& p = kv.second;
    int w = p.ok ? snprintf(buf + used, bytes - used, "%s%dx%d: algo %d tile %d stages %d", used ? "; " : "", kv.first.first,
                            kv.first.second, p.pin.id, p.pin.tile, p.pin.stages)
                 : snprintf(buf + used, bytes - used, "%s%dx%d: none (k_gemm_bi)", used ? "; " : "", kv.first.first, kv.first.second);
    if (w < 0) break;
    used += (size_t)w;
    if (p.big != Big::none && used + 1 < bytes) {
      const char* verdict = p.big == Big::same ? "same bits, taken" : p.big == Big::differs ? "other bits, not taken" : "unchecked";
      w = snprintf(buf + used, bytes - used, ", from %d rows algo %d tile %d stages %d (%s)", LT_BIG_MIN, p.many.id, p.many.tile,
                   p.many.stages, verdict);
      if (w < 0) break;
      used += (size_t)w;
    }
  }
}
