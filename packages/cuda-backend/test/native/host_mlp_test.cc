// Standalone check of native/host/host_mlp.cc (no CUDA): every vector path this CPU supports against a
// float64 reference, on odd sizes, rows 1/3/8/11, pools of 1 and 4 threads. Built and run by
// test/host-mlp-native.test.ts:
//   g++ -O2 -std=c++17 -pthread -DNERVA_HOST_MLP_NO_CUDA -Inative/host -Inative/common test/native/host_mlp_test.cc native/host/host_mlp.cc native/host/host_pool.cc native/host/isa.cc native/common/knobs.cc
// Prints one JSON line per case and a summary line; exits 1 when a case fails.
//
// Error bound. Per output h the f64 reference also computes
//   S_h = sum_j |down_hj| * (|a_j| + |silu'(g_j) u_j| G_j + |silu(g_j)| U_j),
//   G_j = sum_i |gate_ji xn_i|,  U_j = sum_i |up_ji xn_i|,
// the first-order sensitivity of y_h to relative perturbations of every product it is made of.
// An f32 dot product of n terms, summed in any order (vector lanes, then a tree), has an error
// below gamma_n * sum|terms| with gamma_n ~ n * u, u = 2^-24 (Higham, Accuracy and Stability,
// 3.1); xn carries <= 3u (inv rounded to f32, two f32 products); silu and silu*u add a few u (expf
// is within 1 ulp). So |y_h - ref_h| <= (H + c + 8) u S_h to first order; the test allows
// (H + c + 16) u S_h. The bound is rigorous-ish and far tighter than what a wrong kernel gives: a
// dropped or doubled term of the down sum is ~S_h / c, and of a gate row ~S_h / H, both well
// above (H + c) u S_h for the sizes here. Typical observed errors are ~1e-3 of the bound.
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

#include "host_mlp.h"

#define NERVA_TEST_SEED 0x9e3779b97f4a7c15ull
#include "test_util.h"

namespace {

uint16_t toBf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}
double fromBf16(uint16_t v) {
  uint32_t u = (uint32_t)v << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Problem {
  int rows, H, c;
  float eps;
  std::vector<float> x, normW, y;
  std::vector<uint16_t> gateUp, down;
  std::vector<double> ref, scale;  // f64 reference and S_h per output
  HostMlpArgs args() {
    HostMlpArgs a;
    a.rows = rows;
    a.hidden = H;
    a.inter = c;
    a.eps = eps;
    a.x = x.data();
    a.normW = normW.data();
    a.gateUp = c ? gateUp.data() : nullptr;
    a.down = c ? down.data() : nullptr;
    a.y = y.data();
    return a;
  }
};

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double siluPrime(double v) {
  double s = 1.0 / (1.0 + std::exp(-v));
  return s * (1.0 + v * (1.0 - s));
}

// gateScale sets |g| (large values exercise silu's saturation); one row of x is scaled by 1e3 and
// one by 1e-3 (RMSNorm removes the scale).
Problem make(int rows, int H, int c, double gateScale) {
  Problem p;
  p.rows = rows;
  p.H = H;
  p.c = c;
  p.eps = 1e-6f;
  p.x.resize((size_t)rows * H);
  p.normW.resize(H);
  p.gateUp.resize((size_t)2 * c * H);
  p.down.resize((size_t)H * c);
  p.y.assign((size_t)rows * H, std::nanf(""));
  for (int r = 0; r < rows; r++) {
    double s = r == 1 ? 1e3 : r == 2 ? 1e-3 : 1.0;
    for (int i = 0; i < H; i++) p.x[(size_t)r * H + i] = (float)(s * uniform(-2, 2));
  }
  for (auto& w : p.normW) w = (float)uniform(0.5, 1.5);
  for (size_t i = 0; i < (size_t)c * H; i++) p.gateUp[i] = toBf16((float)uniform(-gateScale, gateScale));
  for (size_t i = (size_t)c * H; i < p.gateUp.size(); i++) p.gateUp[i] = toBf16((float)uniform(-0.1, 0.1));
  for (auto& w : p.down) w = toBf16((float)uniform(-0.1, 0.1));

  p.ref.assign((size_t)rows * H, 0);
  p.scale.assign((size_t)rows * H, 0);
  std::vector<double> xn(H), a(c), A(c);
  for (int r = 0; r < rows; r++) {
    double ss = 0;
    for (int i = 0; i < H; i++) ss += (double)p.x[(size_t)r * H + i] * p.x[(size_t)r * H + i];
    double inv = 1.0 / std::sqrt(ss / H + (double)p.eps);
    for (int i = 0; i < H; i++) xn[i] = p.x[(size_t)r * H + i] * inv * p.normW[i];
    for (int j = 0; j < c; j++) {
      double g = 0, u = 0, G = 0, U = 0;
      for (int i = 0; i < H; i++) {
        double gw = fromBf16(p.gateUp[(size_t)j * H + i]) * xn[i];
        double uw = fromBf16(p.gateUp[((size_t)c + j) * H + i]) * xn[i];
        g += gw;
        u += uw;
        G += std::fabs(gw);
        U += std::fabs(uw);
      }
      a[j] = silu(g) * u;
      A[j] = std::fabs(a[j]) + std::fabs(siluPrime(g) * u) * G + std::fabs(silu(g)) * U;
    }
    for (int h = 0; h < H; h++) {
      double y = 0, s = 0;
      for (int j = 0; j < c; j++) {
        double d = fromBf16(p.down[(size_t)h * c + j]);
        y += d * a[j];
        s += std::fabs(d) * A[j];
      }
      p.ref[(size_t)r * H + h] = y;
      p.scale[(size_t)r * H + h] = s;
    }
  }
  return p;
}

int gFailures = 0, gCases = 0;

void fail(const std::string& what) {
  gFailures++;
  std::printf("{\"fail\":\"%s\"}\n", what.c_str());
}

// Runs p on the current pool configuration and checks y against the reference.
void check(Problem& p, int isa, int threads, const char* tag) {
  std::fill(p.y.begin(), p.y.end(), std::nanf(""));  // written, not accumulated
  HostMlpCounters counters;
  HostMlpArgs a = p.args();
  a.counters = &counters;
  nerva_host_mlp(a);
  const double u = std::ldexp(1.0, -24);
  const double bound = (p.H + p.c + 16) * u;
  double worst = 0, maxErr = 0, maxRef = 0;
  bool ok = counters.calls == 1;
  for (size_t i = 0; i < p.y.size(); i++) {
    double err = std::fabs((double)p.y[i] - p.ref[i]);
    if (p.c == 0) {
      if (!(p.y[i] == 0.0f)) ok = false;
      continue;
    }
    if (!std::isfinite(p.y[i])) {
      ok = false;
      continue;
    }
    double ratio = err / (bound * p.scale[i] + 1e-300);
    if (ratio > worst) worst = ratio;
    if (err > maxErr) maxErr = err;
    if (std::fabs(p.ref[i]) > maxRef) maxRef = std::fabs(p.ref[i]);
  }
  if (worst > 1.0) ok = false;
  gCases++;
  std::printf(
      "{\"case\":\"%s\",\"isa\":\"%s\",\"threads\":%d,\"rows\":%d,\"hidden\":%d,\"inter\":%d,\"boundUsed\":%.3g,"
      "\"normRelErr\":%.3g,\"ok\":%s}\n",
      tag, nerva_host_isa_name(isa), threads, p.rows, p.H, p.c, worst, maxRef > 0 ? maxErr / maxRef : 0.0,
      ok ? "true" : "false");
  if (!ok) fail(std::string(tag) + " " + nerva_host_isa_name(isa) + " rows " + std::to_string(p.rows) + " H " +
                std::to_string(p.H) + " c " + std::to_string(p.c));
}

}  // namespace

int main() {
  // The default pool, as NERVA_HOST_THREADS / NERVA_HOST_ISA / NERVA_HOST_PIN made it.
  const HostMlpStats initial = nerva_host_mlp_stats();
  std::vector<int> isas;
  for (int i = HOST_ISA_SCALAR; i <= HOST_ISA_AVX512; i++)
    if (nerva_host_isa_supported(i)) isas.push_back(i);

  // Odd sizes: H and c not multiples of 8/16/32 (vector tails, masked tails), sizes below one
  // vector, one exactly at a multiple, and c = 0.
  struct Shape {
    int H, c;
    double gateScale;
  };
  const Shape shapes[] = {{1, 1, 0.1}, {5, 3, 0.1}, {37, 19, 0.1}, {64, 32, 0.1}, {129, 47, 1.0},
                          {1000, 300, 0.1}, {515, 1031, 1.0}, {517, 0, 0.1}};
  const int rowsList[] = {1, 3, 8};
  std::vector<Problem> problems;
  for (const Shape& s : shapes)
    for (int r : rowsList) problems.push_back(make(r, s.H, s.c, s.gateScale));
  problems.push_back(make(11, 131, 77, 1.0));  // more than 8 rows: two weight passes

  // y of the 1-thread pool per (isa, problem): the 4-thread pool must give the same bits (every
  // output is summed by one thread in a fixed order, whatever the chunking).
  std::vector<std::vector<float>> single(isas.size() * problems.size());
  int threadMismatches = 0;
  for (int threads : {1, 4}) {
    nerva_host_mlp_configure(threads, 0);
    for (size_t ii = 0; ii < isas.size(); ii++) {
      const int isa = isas[ii];
      if (nerva_host_mlp_set_isa(isa) != isa) fail(std::string("set_isa ") + nerva_host_isa_name(isa));
      for (size_t pi = 0; pi < problems.size(); pi++) {
        Problem& p = problems[pi];
        check(p, isa, threads, "random");
        std::vector<float>& one = single[ii * problems.size() + pi];
        if (threads == 1) one = p.y;
        else if (std::memcmp(one.data(), p.y.data(), one.size() * sizeof(float)) != 0) threadMismatches++;
      }
    }
  }
  if (threadMismatches) fail("1 and 4 threads differ on " + std::to_string(threadMismatches) + " cases");

  // Repeated calls give bitwise the same y (each output is summed by one thread in a fixed order,
  // whichever thread takes its chunk), and allocate nothing once the scratch is reserved.
  nerva_host_mlp_configure(4, 0);
  nerva_host_mlp_set_isa(isas.back());
  Problem& big = *std::find_if(problems.begin(), problems.end(), [](const Problem& p) { return p.H == 515 && p.rows == 8; });
  nerva_host_mlp_reserve(11, 1000, 1031);
  nerva_host_mlp(big.args());
  std::vector<float> first = big.y;
  HostMlpStats before = nerva_host_mlp_stats();
  gArmed = true;
  int mismatches = 0;
  for (int it = 0; it < 300; it++) {
    Problem& p = it % 3 ? big : problems[(size_t)it % problems.size()];
    nerva_host_mlp(p.args());
    if (&p == &big && std::memcmp(p.y.data(), first.data(), first.size() * sizeof(float)) != 0) mismatches++;
  }
  gArmed = false;
  HostMlpStats after = nerva_host_mlp_stats();
  long allocs = gAllocs.load();
  if (mismatches) fail("repeated calls differ: " + std::to_string(mismatches));
  if (allocs) fail("allocations during calls: " + std::to_string(allocs));
  if (after.calls - before.calls != 300) fail("stats.calls did not count 300 calls");
  if (after.threads != 4 || after.isa != isas.back()) fail("stats threads/isa");

  // Validation.
  HostMlpArgs bad = big.args();
  bad.rows = 0;
  if (!nerva_host_mlp_validate(bad)) fail("rows 0 accepted");
  bad = big.args();
  bad.down = nullptr;
  if (!nerva_host_mlp_validate(bad)) fail("null down accepted");
  bad.inter = 0;
  if (nerva_host_mlp_validate(bad)) fail("c = 0 without weights rejected");

  std::printf("{\"summary\":true,\"cases\":%d,\"failures\":%d,\"isas\":[", gCases, gFailures);
  for (size_t i = 0; i < isas.size(); i++) std::printf("%s\"%s\"", i ? "," : "", nerva_host_isa_name(isas[i]));
  std::printf("],\"allocsDuringCalls\":%ld,\"repeatMismatches\":%d,\"threadMismatches\":%d,\"ns\":%llu,", allocs, mismatches, threadMismatches,
              (unsigned long long)(after.ns - before.ns));
  std::printf("\"initial\":{\"threads\":%d,\"isa\":\"%s\",\"pinned\":%s}}\n", initial.threads,
              nerva_host_isa_name(initial.isa), initial.pinned ? "true" : "false");
  return gFailures ? 1 : 0;
}
