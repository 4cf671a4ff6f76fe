// Phase hostattn: the host attention (packages/cuda-backend/native/host/host_attention.cc, tiered KV's
// warm partial) on the Qwen3-8B attention shape (32 heads, 8 KV heads, headDim 128), one decode
// row over W warm keys, f32 and bf16 caches, against the host's DRAM read rate measured in the
// same process (threads summing a 2 GiB buffer). One JSON line per probe on stdout.
// Built by tools/gpu/run.sh (phase hostattn) with native/host/host_attention.cc, the host pool,
// the ISA layer (native/host/isa.cc) and the knob table (native/common/knobs.cc).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "host_attention.h"

using Clock = std::chrono::steady_clock;
static double secs(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

// DRAM read rate: T threads each sum its slice of a buffer larger than any cache, repeatedly.
static double readGbps(const float* buf, size_t n, int T) {
  std::atomic<double> sink{0};
  double best = 0;
  for (int rep = 0; rep < 5; rep++) {
    auto t0 = Clock::now();
    std::vector<std::thread> th;
    for (int t = 0; t < T; t++)
      th.emplace_back([&, t] {
        size_t a = n * t / T, b = n * (t + 1) / T;
        float s[16] = {};
        for (size_t i = a; i + 16 <= b; i += 16)
          for (int k = 0; k < 16; k++) s[k] += buf[i + k];
        double tot = 0;
        for (float x : s) tot += x;
        double cur = sink.load();
        while (!sink.compare_exchange_weak(cur, cur + tot)) {
        }
      });
    for (auto& x : th) x.join();
    best = std::max(best, n * 4.0 / secs(t0) / 1e9);
  }
  return best;
}

int main() {
  const int H = 32, KVH = 8, hd = 128, bs = 16;
  int T = (int)std::thread::hardware_concurrency();
  const size_t big = (size_t)1 << 29;  // 2 GiB of floats
  std::vector<float> buf(big, 1.f);
  std::printf("{\"probe\":\"hostattn_dram\",\"threads\":%d,\"read_gbps\":%.1f}\n", T, readGbps(buf.data(), big, T));
  buf.clear();
  buf.shrink_to_fit();
  for (int dtype : {HOST_ATTN_F32, HOST_ATTN_BF16}) {
    for (int warm : {768, 3072, 12288}) {
      const int eb = dtype == HOST_ATTN_F32 ? 4 : 2;
      // Many layers' worth of pages so every call reads DRAM, not cache (rotate through them).
      const int layers = std::max(4, (int)((size_t)3 << 30) / (warm * KVH * hd * eb * 2));
      const int blocks = warm / bs;
      const size_t per = (size_t)blocks * bs * KVH * hd;
      std::vector<uint8_t> k((size_t)layers * per * eb, 0x3c), v((size_t)layers * per * eb, 0x3c);
      std::vector<float> q((size_t)H * hd, 0.01f), out((size_t)H * hd), lse(H);
      std::vector<int> tables(blocks);
      for (int i = 0; i < blocks; i++) tables[i] = i;
      int rowSeq = 0, pos = warm - 1;
      HostAttnArgs a;
      a.rows = 1;
      a.numHeads = H;
      a.numKvHeads = KVH;
      a.headDim = hd;
      a.blockSize = bs;
      a.maxBlocksPerSeq = blocks;
      a.numSeqs = 1;
      a.numBlocks = blocks;
      a.scale = 0.0884f;
      a.kvDtype = dtype;
      a.q = q.data();
      a.tables = tables.data();
      a.rowSeq = &rowSeq;
      a.positions = &pos;
      a.out = out.data();
      a.lse = lse.data();
      nerva_host_attention_reserve(1, H, KVH, hd);
      int calls = 0;
      auto t0 = Clock::now();
      std::vector<double> each;
      while (secs(t0) < 1.0 || calls < 20) {
        int L = calls % layers;
        a.k = k.data() + (size_t)L * per * eb;
        a.v = v.data() + (size_t)L * per * eb;
        auto t1 = Clock::now();
        nerva_host_attention(a);
        each.push_back(secs(t1));
        calls++;
      }
      std::sort(each.begin(), each.end());
      double mean = secs(t0) / calls, bytes = 2.0 * per * eb;
      std::printf("{\"probe\":\"hostattn\",\"dtype\":\"%s\",\"warm_keys\":%d,\"threads\":%d,\"bytes_per_call\":%.0f,\"ms_per_call\":%.4f,\"ms_median\":%.4f,\"gbps\":%.1f,\"gbps_median\":%.1f}\n",
                  dtype == HOST_ATTN_F32 ? "f32" : "bf16", warm, nerva_host_attention_threads(), bytes, mean * 1e3,
                  each[each.size() / 2] * 1e3, bytes / mean / 1e9, bytes / each[each.size() / 2] / 1e9);
    }
  }
  return 0;
}
