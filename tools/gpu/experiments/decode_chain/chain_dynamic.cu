// Proof of concept: a decode layer chain (Qwen3-8B shapes, bf16 weights) run by one persistent
// kernel whose weight stream does not wait for the computation's dependencies. One block an SM:
// a producer warp copies the block's share of every phase's weights, in order, into a ring of
// shared-memory slots (cp.async.bulk, mbarrier completion), as far ahead as the ring allows;
// eight consumer warps wait for each phase's input (a global counter of blocks done with the
// phase before), multiply the slots' rows by it and release the slots. An "attention" phase
// between qkv and o spins a fixed time, standing in for the attention's latency, during which
// the ring keeps filling. The question: what fraction of the copy roofline a layer chain reaches
// when the weight stream is decoupled from the dependencies, against ~0.85 for the engine's
// kernel-per-op decode (docs/results/decode.md).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

constexpr int CW = 8;                 // consumer warps
constexpr int CT = 32 * CW;           // consumer threads
constexpr int THREADS = CT + 32;      // + the producer warp
constexpr int SLOT = 32768;           // bytes a ring slot
constexpr int MAX_SLOTS = 5;
constexpr int XS_BYTES = 12288 * 4;   // the largest input (down's) staged in shared memory
constexpr int MAX_ROWS_BLOCK = 1280;  // rows of one phase a block (the LM head: 1,151)

struct Phase {
  const uint16_t* w;  // [rows, K] bf16 (null: the attention stand-in)
  const float* x;     // input [K]
  float* y;           // output [rows]
  int rows, K;
};

__device__ __forceinline__ void mbarInit(uint32_t a, uint32_t n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(n) : "memory"); }
__device__ __forceinline__ bool mbarTry(uint32_t a, uint32_t par) {
  uint32_t ok;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n" : "=r"(ok) : "r"(a), "r"(par) : "memory");
  return ok != 0;
}
__device__ __forceinline__ uint64_t gtime();
// A wait past the deadline traps: a hang in this experiment becomes a launch error.
__device__ __forceinline__ void mbarWait(uint32_t a, uint32_t par, uint64_t deadline) {
  while (!mbarTry(a, par)) {
    if (gtime() > deadline) __trap();
  }
}
__device__ __forceinline__ void mbarArriveTx(uint32_t a, uint32_t tx) { asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(tx) : "memory"); }
__device__ __forceinline__ void mbarArrive(uint32_t a) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory"); }
__device__ __forceinline__ void bulkCopy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ uint64_t gtime() { uint64_t t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned ldAcq(const unsigned* p) { unsigned v; asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void consumerSync() { asm volatile("bar.sync 1, %0;" ::"n"(CT) : "memory"); }

__device__ __forceinline__ void rowsOf(int rows, int b, int nb, int& r0, int& r1) {
  r0 = (int)((long long)b * rows / nb);
  r1 = (int)((long long)(b + 1) * rows / nb);
}

__global__ void __launch_bounds__(THREADS, 1) kChain(const Phase* __restrict__ ph, int nPh, unsigned* cnt, int slots, int spinNs, int* err, int mode, int grab, unsigned* tileNext) {
  // Tiles are taken dynamically: a block's producer takes phase p's next tile from tileNext[p]
  // (an atomic counter) and passes its id to the consumers in the slot's tag; -1 ends its phase.
  // mode bit 0: no dependency waits; bit 1: no multiplies (the slots are waited for and released).
  extern __shared__ __align__(128) unsigned char dyn[];
  float4* const xs = reinterpret_cast<float4*>(dyn);  // the phase's input, up to XS_BYTES
  unsigned char* const ring = dyn + XS_BYTES;
  __shared__ __align__(8) unsigned long long fullB[MAX_SLOTS], emptyB[MAX_SLOTS];
  __shared__ float rowAcc[MAX_ROWS_BLOCK];
  __shared__ int tag[MAX_SLOTS];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int b = blockIdx.x, nb = gridDim.x;
  const uint32_t ringA = (uint32_t)__cvta_generic_to_shared(ring);  // (after xs)
  if (tid == 0) {
    for (int s = 0; s < slots; s++) {
      mbarInit((uint32_t)__cvta_generic_to_shared(&fullB[s]), 1);
      mbarInit((uint32_t)__cvta_generic_to_shared(&emptyB[s]), CW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  for (int i = tid; i < MAX_ROWS_BLOCK; i += THREADS) rowAcc[i] = 0.f;
  __syncthreads();
  const uint64_t deadline = gtime() + 2000000000ull;  // 2 s: a hang becomes an error
  if (warp == CW) {
    // Producer: every phase's tiles of this block, in order, as far ahead as the ring allows.
    if (lane != 0) return;
    int t = 0;
    for (int p = 0; p < nPh; p++) {
      const Phase P = ph[p];
      if (!P.w) continue;
      const int rowBytes = P.K * 2, rps = min(4, max(1, SLOT / rowBytes));
      const int nTiles = (P.rows + rps - 1) / rps;
      // Tiles claimed GRAB at a time, the next claim issued one batch ahead (its atomic's latency
      // off the copies' path).
      int cur = (int)atomicAdd(&tileNext[p], (unsigned)grab), nxt = (int)atomicAdd(&tileNext[p], (unsigned)grab), used = 0;
      for (;; t++) {
        const int s = t % slots, k = t / slots;
        const uint32_t eb = (uint32_t)__cvta_generic_to_shared(&emptyB[s]), fb = (uint32_t)__cvta_generic_to_shared(&fullB[s]);
        while (!mbarTry(eb, (k & 1) ^ 1)) {
          if (gtime() > deadline) __trap();
        }
        if (used == grab) {
          cur = nxt;
          nxt = cur < nTiles ? (int)atomicAdd(&tileNext[p], (unsigned)grab) : nTiles;
          used = 0;
        }
        const int tile = cur + used++;
        if (tile >= nTiles) {
          // The phase's end for this block: a slot with no bytes, tagged -1.
          tag[s] = -1;
          mbarArrive(fb);
          t++;
          break;
        }
        const int r = tile * rps, n = min(rps, P.rows - r);
        tag[s] = tile;
        const uint32_t total = (uint32_t)(n * rowBytes), piece = total;
        mbarArriveTx(fb, total);
        const unsigned char* src = reinterpret_cast<const unsigned char*>(P.w + (size_t)r * P.K);
        for (uint32_t o = 0; o < total; o += piece) bulkCopy(ringA + (uint32_t)s * SLOT + o, src + o, min(piece, total - o), fb);
      }
    }
    return;
  }
  // Consumers.
  int t = 0;
  for (int p = 0; p < nPh; p++) {
    const Phase P = ph[p];
    if (p > 0 && !(mode & 1)) {
      // Phase p - 1 is done when every block has passed it (the attention stand-in: nb) or every
      // warp of every block has added its tiles' sums (a GEMV: nb x CW arrivals, one a warp after
      // its last tile of the phase).
      const unsigned want = (unsigned)nb * (ph[p - 1].w ? CW : 1);
      if (tid == 0) {
        while (ldAcq(&cnt[p - 1]) < want) {
          if (gtime() > deadline) __trap();
        }
      }
      consumerSync();
    }
    int r0, r1;
    rowsOf(P.rows, b, nb, r0, r1);
    if (!P.w) {
      // The attention stand-in: its latency, then its output (a copy of its input's first rows).
      if (tid == 0) {
        const uint64_t until = gtime() + (uint64_t)spinNs;
        while (gtime() < until) {
        }
      }
      consumerSync();
      for (int i = r0 + tid; i < r1; i += CT) P.y[i] = P.x[i];
    } else {
      // The phase's input into shared memory once, then each warp takes one eighth of every row
      // of a slot (the input chunk read once for all the slot's rows, one reduction a row at the
      // end of the slot).
      const int K8 = P.K >> 3, rps = min(4, max(1, SLOT / (P.K * 2)));
      const float4* xg = reinterpret_cast<const float4*>(P.x);
      for (int i = tid; i < (P.K >> 2); i += CT) xs[i] = xg[i];
      consumerSync();
      const int per = K8 / CW;  // chunks of a row a warp
      for (;; t++) {
        const int s = t % slots, k = t / slots;
        mbarWait((uint32_t)__cvta_generic_to_shared(&fullB[s]), k & 1, deadline);
        const int tile = tag[s];
        if (tile < 0) {
          __syncwarp();
          if (lane == 0) mbarArrive((uint32_t)__cvta_generic_to_shared(&emptyB[s]));
          t++;
          break;
        }
        const int r = tile * rps, n = min(rps, P.rows - r);
        const uint4* sw = reinterpret_cast<const uint4*>(ring + (size_t)s * SLOT);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int c = warp * per + lane; !(mode & 2) && c < (warp + 1) * per; c += 32) {
          const float4 a = xs[2 * c], bb = xs[2 * c + 1];
#pragma unroll
          for (int i = 0; i < 4; i++) {
            if (i < n) {
              const uint4 q = sw[i * K8 + c];
              acc[i] += __uint_as_float(q.x << 16) * a.x + __uint_as_float(q.x & 0xffff0000u) * a.y +
                        __uint_as_float(q.y << 16) * a.z + __uint_as_float(q.y & 0xffff0000u) * a.w +
                        __uint_as_float(q.z << 16) * bb.x + __uint_as_float(q.z & 0xffff0000u) * bb.y +
                        __uint_as_float(q.w << 16) * bb.z + __uint_as_float(q.w & 0xffff0000u) * bb.w;
            }
          }
        }
        __syncwarp();
        if (lane == 0) mbarArrive((uint32_t)__cvta_generic_to_shared(&emptyB[s]));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
          for (int i = 0; i < 4; i++) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
        if (lane == 0)
#pragma unroll
          for (int i = 0; i < 4; i++)
            if (i < n) atomicAdd(&P.y[r + i], acc[i]);
      }
      // This warp's sums are in: one arrival (release) for the phase.
      __syncwarp();
      if (lane == 0) {
        __threadfence();
        atomicAdd(&cnt[p], 1u);
      }
      continue;
    }
    consumerSync();
    if (tid == 0) {
      __threadfence();
      atomicAdd(&cnt[p], 1u);
    }
  }
}

// The kernel-per-op baseline, as the engine's decode runs it: a GEMV kernel a projection (a warp
// a row, 16 rows a block, four 16-byte chunks a lane in flight, the first ones loaded before the
// programmatic-dependent-launch wait), an attention stand-in kernel, launched with PDL in a graph.
__global__ void __launch_bounds__(512) kGemvPdl(const uint16_t* __restrict__ w, const float* x, float* y, int rows, int K) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int r = blockIdx.x * 16 + warp;
  const bool live = r < rows;
  if (!live) r = rows - 1;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)r * K);
  const int K8 = K >> 3;
  constexpr int P = 4;
  uint4 q[P];
#pragma unroll
  for (int u = 0; u < P; u++)
    if (lane + u * 32 < K8) q[u] = __ldcs(wr + lane + u * 32);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float acc = 0.f;
  for (int k = lane;; ) {
#pragma unroll
    for (int u = 0; u < P; u++) {
      const int c = k + u * 32;
      if (c < K8) {
        const float4 a = x4[2 * c], bb = x4[2 * c + 1];
        acc += __uint_as_float(q[u].x << 16) * a.x + __uint_as_float(q[u].x & 0xffff0000u) * a.y +
               __uint_as_float(q[u].y << 16) * a.z + __uint_as_float(q[u].y & 0xffff0000u) * a.w +
               __uint_as_float(q[u].z << 16) * bb.x + __uint_as_float(q[u].z & 0xffff0000u) * bb.y +
               __uint_as_float(q[u].w << 16) * bb.z + __uint_as_float(q[u].w & 0xffff0000u) * bb.w;
      }
    }
    k += P * 32;
    if (k >= K8) break;
#pragma unroll
    for (int u = 0; u < P; u++)
      if (k + u * 32 < K8) q[u] = __ldcs(wr + k + u * 32);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (live && lane == 0) y[r] = acc;
}
__global__ void kSpinPdl(const float* x, float* y, int rows, int spinNs) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0) {
    const uint64_t until = gtime() + (uint64_t)spinNs;
    while (gtime() < until) {
    }
  }
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += gridDim.x * blockDim.x) y[i] = x[i];
}

__global__ void kFill(uint16_t* w, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float v = ((h & 0xffff) / 65536.f - 0.5f) * 0.03f;
    w[i] = (uint16_t)(__float_as_uint(v) >> 16);
  }
}

int main(int argc, char** argv) {
  // argv[1]: 8b (Qwen3-8B shapes, 36 layers) or 0.6b (Qwen3-0.6B, 28 layers); each token ends
  // with the LM head (151,936 rows).
  const bool small = argc > 1 && argv[1][0] == '0';
  const int layers = small ? 28 : 36;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  double copyGBs = 0;
  {
    size_t n = 1ull << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemsetAsync(a, 1, n, st));
    for (int rep = 0; rep < 3; rep++) {
      CK(cudaEventRecord(e0, st));
      for (int i = 0; i < 10; i++) CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      copyGBs = std::max(copyGBs, 2.0 * n * 10 / (ms / 1e3) / 1e9);
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
  }
  // Qwen3-8B: hidden 4096, intermediate 12288, q 4096 + k/v 1024 each.
  // Qwen3-0.6B: hidden 1024, intermediate 3072, q 2048 + k/v 1024 each.
  const int H = small ? 1024 : 4096, I = small ? 3072 : 12288, QD = small ? 2048 : 4096, QKV = QD + (small ? 1024 : 2048);
  const int V = 151936;
  struct Sh { int rows, K; };
  const Sh mats[4] = {{H, QD}, {2 * I, H}, {H, I}, {QKV, H}};  // o, gate_up, down, qkv
  size_t wElems = 0;
  for (auto m : mats) wElems += (size_t)m.rows * m.K;
  wElems = wElems * layers + (size_t)V * H;
  uint16_t* W;
  CK(cudaMalloc(&W, wElems * 2));
  kFill<<<4 * sms, 256, 0, st>>>(W, wElems, 7);
  // Activations: one buffer per phase (never reread across phases, so no stale L1 lines).
  const int nPh = layers * 5 + 1;
  std::vector<Phase> hp(nPh);
  std::vector<float*> acts(nPh + 1);
  for (int i = 0; i <= nPh; i++) {
    CK(cudaMalloc(&acts[i], V * sizeof(float)));
    CK(cudaMemsetAsync(acts[i], 0, V * sizeof(float), st));
  }
  {
    std::vector<float> x0(2 * I);
    for (int i = 0; i < 2 * I; i++) x0[i] = (float)((i * 37) % 101) / 101.f - 0.5f;
    CK(cudaMemcpy(acts[0], x0.data(), x0.size() * 4, cudaMemcpyHostToDevice));
  }
  size_t off = 0;
  for (int l = 0, p = 0; l < layers; l++) {
    hp[p] = Phase{nullptr, acts[p], acts[p + 1], QD, QKV};  // attention stand-in: rows = its outputs
    p++;
    for (int m = 0; m < 4; m++, p++) {
      hp[p] = Phase{W + off, acts[p], acts[p + 1], mats[m].rows, mats[m].K};
      off += (size_t)mats[m].rows * mats[m].K;
    }
  }
  hp[nPh - 1] = Phase{W + off, acts[nPh - 1], acts[nPh], V, H};  // the LM head
  Phase* dph;
  CK(cudaMalloc(&dph, nPh * sizeof(Phase)));
  CK(cudaMemcpy(dph, hp.data(), nPh * sizeof(Phase), cudaMemcpyHostToDevice));
  unsigned *cnt, *tileNext;
  int* err;
  CK(cudaMalloc(&tileNext, nPh * sizeof(unsigned)));
  CK(cudaMalloc(&cnt, nPh * sizeof(unsigned)));
  CK(cudaMalloc(&err, sizeof(int)));
  CK(cudaMemset(err, 0, sizeof(int)));
  CK(cudaFuncSetAttribute(kChain, cudaFuncAttributeMaxDynamicSharedMemorySize, XS_BYTES + MAX_SLOTS * SLOT));
  const double bytes = (double)wElems * 2, idealUs = bytes / (copyGBs * 1e3);
  printf("{\"probe\":\"copy\",\"GBs\":%.1f,\"sms\":%d,\"weight_bytes\":%.0f,\"ideal_us\":%.1f}\n", copyGBs, sms, bytes, idealUs);
  const int spins[] = {0, 3000, 6000, 9000};
  for (int spin : {0, 6000}) {
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int p = 0; p < nPh; p++) {
      cudaLaunchConfig_t cfg = {};
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = at;
      cfg.numAttrs = 1;
      cfg.stream = st;
      const Phase& P = hp[p];
      if (P.w) {
        cfg.gridDim = dim3((P.rows + 15) / 16);
        cfg.blockDim = dim3(512);
        CK(cudaLaunchKernelEx(&cfg, kGemvPdl, P.w, P.x, P.y, P.rows, P.K));
      } else {
        cfg.gridDim = dim3(sms);
        cfg.blockDim = dim3(128);
        CK(cudaLaunchKernelEx(&cfg, kSpinPdl, P.x, P.y, P.rows, spin));
      }
    }
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    float best = 1e30f;
    for (int rep = 0; rep < 4; rep++) {
      CK(cudaEventRecord(e0, st));
      CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (rep > 0) best = std::min(best, ms);
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(gr));
    float yl[1];
    CK(cudaMemcpy(yl, acts[nPh], sizeof yl, cudaMemcpyDeviceToHost));
    const double us = best * 1e3;
    printf("{\"probe\":\"kernels_pdl\",\"layers\":%d,\"spin_ns\":%d,\"us\":%.1f,\"us_a_layer\":%.2f,\"fraction_of_copy\":%.3f,\"y0\":%g}\n",
           layers, spin, us, us / layers, idealUs / us, yl[0]);
    fflush(stdout);
  }
  for (int pieces : {1, 2, 4})
  for (int mode : {0})
  for (int slots : {3, 5}) {
    for (int spin : {0, 6000}) {
      float best = 1e30f;
      for (int rep = 0; rep < 4; rep++) {
        CK(cudaMemsetAsync(cnt, 0, nPh * sizeof(unsigned), st));
        CK(cudaMemsetAsync(tileNext, 0, nPh * sizeof(unsigned), st));
        for (int i = 1; i <= nPh; i++) CK(cudaMemsetAsync(acts[i], 0, V * sizeof(float), st));  // the sums add into y
        CK(cudaEventRecord(e0, st));
        kChain<<<sms, THREADS, XS_BYTES + slots * SLOT, st>>>(dph, nPh, cnt, slots, spin, err, mode, pieces, tileNext);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep > 0) best = std::min(best, ms);
      }
      int herr = 0;
      CK(cudaMemcpy(&herr, err, sizeof(int), cudaMemcpyDeviceToHost));
      float yl[4];
      CK(cudaMemcpy(yl, acts[nPh], sizeof yl, cudaMemcpyDeviceToHost));
      const double us = best * 1e3, spinUs = layers * spin / 1e3;
      printf("{\"probe\":\"chain\",\"pieces\":%d,\"mode\":%d,\"layers\":%d,\"slots\":%d,\"spin_ns\":%d,\"us\":%.1f,\"us_a_layer\":%.2f,\"fraction_of_copy\":%.3f,"
             "\"fraction_with_spin_free\":%.3f,\"err\":%d,\"y0\":%g}\n",
             pieces, mode, layers, slots, spin, us, us / layers, idealUs / us, (idealUs + spinUs) / us, herr, yl[0]);
      fflush(stdout);
      if (herr) return 1;
    }
  }
  return 0;
}
