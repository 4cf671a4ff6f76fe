// Standalone check of native/host/host_attention.cc (no CUDA) against a float64 reference: f32, bf16
// and f16 caches, GQA groups of 1, 4 and 12 (more than one pass of 8 heads), head dims 32, 80
// and 128, windows, blocks missing from this cache (negative entries: partial attention with
// lse), rows with no position left, pools of 1 and 4 threads (bitwise equal), out-of-range block
// ids (NaN rows, counted), no allocation once reserved. Built and run by
// test/host-attention-native.test.ts:
//   g++ -O2 -std=c++17 -pthread -DNERVA_HOST_ATTN_NO_CUDA -Inative/host -Inative/common test/native/host_attention_test.cc
//     native/host/host_attention.cc native/host/host_pool.cc native/host/isa.cc native/common/knobs.cc
// Prints one JSON line per case and a summary line; exits 1 when a case fails.
//
// Error bound. The kernel rounds each score s_p to f32 (a dot of hd terms: error <= hd u
// sum|q_i k_i|, Higham 3.1, u = 2^-24), each weight exp(s_p - m) within a few ulp (exp's
// relative error is |ds| plus ~2u), and sums n weighted values in f32 (error <= n u sum|w v|). So
// |out - ref| <= (hd * scale * max_p sum_i |q_i k_ip| + n + 8) u * max|v| * 2 to first order
// (the weights sum to 1 after normalization and a score error ds moves a weight by ~ds); lse
// moves by the same score error plus n u. The test allows 4x that. A dropped or doubled key
// moves out by ~ its weight times |v|, ~1/n of max|v|, far above the bound for these sizes.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "host_attention.h"
#include "host_pool.h"

#define NERVA_TEST_SEED 0x243f6a8885a308d3ull
#include "test_util.h"

namespace {

uint16_t toBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}
float fromBf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// f16 of values in the normal range used here (|x| in [2^-14, 2^15)), round to nearest even.
uint16_t toF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  int exp = (int)((u >> 23) & 0xff) - 127 + 15;
  uint32_t man = u & 0x7fffff;
  if (exp <= 0) return (uint16_t)sign;  // flush the tiny ones (not generated)
  uint32_t h = sign | (uint32_t)exp << 10 | man >> 13;
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return (uint16_t)h;
}
float fromF16(uint16_t h) {
  int exp = (h >> 10) & 0x1f;
  float m = (float)(h & 0x3ff);
  float v = exp == 0 ? std::ldexp(m, -24) : std::ldexp(1024.f + m, exp - 25);
  return (h & 0x8000) ? -v : v;
}

int gFailures = 0;
void fail(const std::string& why) {
  gFailures++;
  std::printf("{\"fail\":\"%s\"}\n", why.c_str());
}

struct Case {
  const char* name;
  int dtype, rows, H, KVH, hd, bs, mbps, window;
  double missing;  // fraction of table entries that are -1 (partial attention)
  bool lse;
};

struct Built {
  std::vector<float> q, out, lse;
  std::vector<uint16_t> k16, v16;
  std::vector<float> k32, v32;
  std::vector<int> tables, rowSeq, positions;
  std::vector<double> kd, vd;  // the stored values, as the kernel sees them
  int numSeqs = 0;
  long long numBlocks = 0;
};

Built build(const Case& c) {
  Built b;
  b.numSeqs = 3;
  b.numBlocks = (long long)b.numSeqs * c.mbps + 2;
  const size_t slots = (size_t)b.numBlocks * c.bs, width = (size_t)c.KVH * c.hd;
  b.kd.resize(slots * width);
  b.vd.resize(slots * width);
  for (size_t i = 0; i < slots * width; i++) {
    float kf = (float)uniform(-1, 1), vf = (float)uniform(-2, 2);
    if (std::fabs(kf) < 1e-3f) kf = 1e-3f;
    if (std::fabs(vf) < 1e-3f) vf = 1e-3f;
    if (c.dtype == HOST_ATTN_BF16) {
      b.k16.push_back(toBf16(kf));
      b.v16.push_back(toBf16(vf));
      b.kd[i] = fromBf16(b.k16.back());
      b.vd[i] = fromBf16(b.v16.back());
    } else if (c.dtype == HOST_ATTN_F16) {
      b.k16.push_back(toF16(kf));
      b.v16.push_back(toF16(vf));
      b.kd[i] = fromF16(b.k16.back());
      b.vd[i] = fromF16(b.v16.back());
    } else {
      b.k32.push_back(kf);
      b.v32.push_back(vf);
      b.kd[i] = kf;
      b.vd[i] = vf;
    }
  }
  // Each sequence's table: a permutation of distinct blocks, some entries missing.
  std::vector<int> ids((size_t)b.numBlocks);
  for (int i = 0; i < (int)ids.size(); i++) ids[i] = i;
  for (int i = (int)ids.size() - 1; i > 0; i--) std::swap(ids[i], ids[(int)uniform(0, i + 1) % (i + 1)]);
  b.tables.resize((size_t)b.numSeqs * c.mbps);
  for (size_t i = 0; i < b.tables.size(); i++) b.tables[i] = uniform(0, 1) < c.missing ? -1 : ids[i];
  b.q.resize((size_t)c.rows * c.H * c.hd);
  for (float& x : b.q) x = (float)uniform(-1.5, 1.5);
  for (int r = 0; r < c.rows; r++) {
    b.rowSeq.push_back(r % b.numSeqs);
    int maxPos = c.mbps * c.bs - 1;
    b.positions.push_back(r == 0 ? maxPos : (int)uniform(0, maxPos + 1) % (maxPos + 1));
  }
  // A row whose positions are all missing (when partial): sequence 0's first block only.
  if (c.missing > 0 && c.rows > 1) {
    b.positions[1] = c.bs / 2;
    b.rowSeq[1] = 0;
    b.tables[0] = -1;
  }
  b.out.assign((size_t)c.rows * c.H * c.hd, -7.f);
  b.lse.assign((size_t)c.rows * c.H, -7.f);
  return b;
}

HostAttnArgs argsFor(const Case& c, Built& b) {
  HostAttnArgs a;
  a.rows = c.rows;
  a.numHeads = c.H;
  a.numKvHeads = c.KVH;
  a.headDim = c.hd;
  a.blockSize = c.bs;
  a.maxBlocksPerSeq = c.mbps;
  a.numSeqs = b.numSeqs;
  a.numBlocks = b.numBlocks;
  a.window = c.window;
  a.scale = (float)(1.0 / std::sqrt((double)c.hd));
  a.kvDtype = c.dtype;
  a.k = c.dtype == HOST_ATTN_F32 ? (const void*)b.k32.data() : (const void*)b.k16.data();
  a.v = c.dtype == HOST_ATTN_F32 ? (const void*)b.v32.data() : (const void*)b.v16.data();
  a.q = b.q.data();
  a.tables = b.tables.data();
  a.rowSeq = b.rowSeq.data();
  a.positions = b.positions.data();
  a.out = b.out.data();
  a.lse = c.lse ? b.lse.data() : nullptr;
  return a;
}

// float64 reference of one case; returns the worst error as a fraction of the bound.
double check(const Case& c, const Built& b, const HostAttnArgs& a, int threads) {
  const int G = c.H / c.KVH;
  const size_t width = (size_t)c.KVH * c.hd;
  const double scale = (double)a.scale;
  double worst = 0;
  for (int r = 0; r < c.rows; r++) {
    const int pos = b.positions[r], lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
    const int* tb = b.tables.data() + (size_t)b.rowSeq[r] * c.mbps;
    for (int h = 0; h < c.H; h++) {
      const int kvh = h / G;
      const float* q = b.q.data() + (size_t)r * c.H * c.hd + (size_t)h * c.hd;
      std::vector<double> s;
      std::vector<size_t> at;
      double dotAbs = 0;
      for (int p = lo; p <= pos; p++) {
        int e = tb[p / c.bs];
        if (e < 0) continue;
        size_t o = ((size_t)e * c.bs + p % c.bs) * width + (size_t)kvh * c.hd;
        double d = 0, da = 0;
        for (int i = 0; i < c.hd; i++) {
          d += (double)(q[i] * a.scale) * b.kd[o + i];
          da += std::fabs((double)q[i] * scale * b.kd[o + i]);
        }
        s.push_back(d);
        at.push_back(o);
        dotAbs = std::max(dotAbs, da);
      }
      const float* got = b.out.data() + (size_t)r * c.H * c.hd + (size_t)h * c.hd;
      const double gotLse = c.lse ? b.lse[(size_t)r * c.H + h] : 0;
      std::string where = std::string(c.name) + " t" + std::to_string(threads) + " r" + std::to_string(r) + " h" + std::to_string(h);
      if (s.empty()) {
        for (int i = 0; i < c.hd; i++)
          if (got[i] != 0.f) fail(where + ": out must be 0 with no position");
        if (c.lse && !(std::isinf(gotLse) && gotLse < 0)) fail(where + ": lse must be -inf with no position");
        continue;
      }
      double m = *std::max_element(s.begin(), s.end()), l = 0;
      for (double x : s) l += std::exp(x - m);
      const double n = (double)s.size(), u = std::ldexp(1.0, -24);
      const double bound = 4 * 2 * (c.hd * dotAbs + n + 8) * u * 2.0;  // max|v| <= 2
      for (int i = 0; i < c.hd; i++) {
        double ref = 0;
        for (size_t j = 0; j < s.size(); j++) ref += std::exp(s[j] - m) / l * b.vd[at[j] + i];
        double err = std::fabs(got[i] - ref);
        if (!(err <= bound)) fail(where + ": out[" + std::to_string(i) + "] = " + std::to_string(got[i]) + " vs " + std::to_string(ref));
        worst = std::max(worst, err / bound);
      }
      if (c.lse) {
        double ref = m + std::log(l), err = std::fabs(gotLse - ref), lb = 4 * (c.hd * dotAbs + n + 8) * u * std::max(1.0, std::fabs(ref));
        if (!(err <= lb)) fail(where + ": lse " + std::to_string(gotLse) + " vs " + std::to_string(ref));
        worst = std::max(worst, err / lb);
      }
    }
  }
  return worst;
}

}  // namespace

int main() {
  const Case cases[] = {
      {"f32-mha", HOST_ATTN_F32, 3, 4, 4, 32, 16, 20, 0, 0.0, false},
      {"bf16-gqa4", HOST_ATTN_BF16, 5, 16, 4, 128, 16, 40, 0, 0.0, true},
      {"bf16-gqa4-partial", HOST_ATTN_BF16, 5, 16, 4, 128, 16, 40, 0, 0.3, true},
      {"f16-gqa12-hd80", HOST_ATTN_F16, 4, 24, 2, 80, 8, 30, 0, 0.2, true},
      {"f32-window", HOST_ATTN_F32, 6, 8, 2, 64, 4, 50, 37, 0.0, true},
      {"bf16-window-partial", HOST_ATTN_BF16, 6, 8, 8, 128, 16, 16, 100, 0.5, true},
      {"f32-one-row-long", HOST_ATTN_F32, 1, 8, 1, 32, 16, 256, 0, 0.1, true},
  };
  int count = 0, mismatches = 0;
  long allocs = 0;
  for (const Case& c : cases) {
    for (int threads : {1, 4}) {
      nerva_host_attention_configure(threads);
      Built b = build(c);
      HostAttnArgs a = argsFor(c, b);
      HostAttnCounters counters;
      a.counters = &counters;
      if (const char* why = nerva_host_attention_validate(a)) fail(std::string(c.name) + ": " + why);
      nerva_host_attention_reserve(c.rows, c.H, c.KVH, c.hd);
      gArmed = true;
      nerva_host_attention(a);
      gArmed = false;
      double worst = check(c, b, a, threads);
      if (counters.calls != 1 || counters.badBlocks != 0) fail(std::string(c.name) + ": counters");
      count++;
      std::printf("{\"case\":\"%s\",\"threads\":%d,\"rows\":%d,\"heads\":%d,\"kvHeads\":%d,\"headDim\":%d,\"boundUsed\":%.3g,\"keys\":%llu}\n",
                  c.name, threads, c.rows, c.H, c.KVH, c.hd, worst, (unsigned long long)counters.keys);
    }
  }
  // Thread-count independence: the same inputs, 1 and 4 threads, bitwise.
  for (const Case& c : cases) {
    uint64_t seed = gSeed;
    std::vector<float> outs[2], lses[2];
    for (int t = 0; t < 2; t++) {
      gSeed = seed;
      nerva_host_attention_configure(t == 0 ? 1 : 4);
      Built b = build(c);
      HostAttnArgs a = argsFor(c, b);
      nerva_host_attention_reserve(c.rows, c.H, c.KVH, c.hd);
      gArmed = true;
      nerva_host_attention(a);
      gArmed = false;
      outs[t] = b.out;
      lses[t] = b.lse;
    }
    if (std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * 4) != 0 ||
        std::memcmp(lses[0].data(), lses[1].data(), lses[0].size() * 4) != 0) {
      mismatches++;
      fail(std::string(c.name) + ": 1 and 4 threads differ");
    }
  }
  allocs = gAllocs.load();
  if (allocs) fail("allocations during calls: " + std::to_string(allocs));
  // A block id outside the cache: that row is NaN and counted; the other rows are computed.
  {
    const Case c = {"bad-block", HOST_ATTN_F32, 3, 4, 2, 32, 4, 8, 0, 0.0, true};
    Built b = build(c);
    b.tables[(size_t)b.rowSeq[2] * c.mbps] = (int)b.numBlocks + 5;
    b.positions[0] = 3;  // row 0: sequence 0, first block only (valid)
    HostAttnArgs a = argsFor(c, b);
    HostAttnCounters counters;
    a.counters = &counters;
    nerva_host_attention(a);
    bool nan2 = std::isnan(b.out[(size_t)2 * c.H * c.hd]) && std::isnan(b.lse[(size_t)2 * c.H]);
    bool fine0 = std::isfinite(b.out[0]) && std::isfinite(b.lse[0]);
    if (!nan2 || !fine0 || counters.badBlocks != 1) fail("bad-block: expected row 2 NaN, row 0 finite, one bad row");
    HostAttnArgs z = a;
    z.headDim = 300;
    if (!nerva_host_attention_validate(z)) fail("validate: headDim 300 accepted");
    z = a;
    z.numKvHeads = 3;
    if (!nerva_host_attention_validate(z)) fail("validate: numHeads 4 over numKvHeads 3 accepted");
  }
  // One pool for both modules: configuring through host attention configures it (the host MLP's
  // configure lands on it too), and the threads reported are its threads.
  const int threads = nerva_host_attention_threads();
  nerva_host_attention_configure(2);
  if (nerva_host_pool_threads() != 2 || nerva_host_attention_threads() != 2) fail("configure: the shared pool is not 2 threads");
  nerva_host_pool_configure(threads, -1);
  if (nerva_host_attention_threads() != threads) fail("configure: host attention does not see the shared pool's threads");
  std::printf("{\"summary\":true,\"cases\":%d,\"failures\":%d,\"allocsDuringCalls\":%ld,\"threadMismatches\":%d,\"threads\":%d,\"spinUs\":%d}\n",
              count, gFailures, allocs, mismatches, threads, nerva_host_pool_spin_us());
  return gFailures ? 1 : 0;
}
