// Op decoder_layers: the whole stack of dense decoder layers of a decode step as one persistent
// kernel. Included by kernels.cu (inside its anonymous namespace, after the per-op kernels and
// launchers, whose helpers it uses).
//
// Why: at batch 1 a small model's layer is six kernels of a few microseconds each, and the
// kernel boundaries (drain, launch, ramp-up) cost as much as the weights take to stream. Here one
// block per SM runs every layer; the phases of a layer (qkv, attention, o, gate_up, down) are
// separated by grid-wide barriers, and each thread issues its first weight copies of the next
// phase before it waits at the barrier, so the barrier hides behind the weight stream.
// Status: correct (conformance) but slower than the per-layer kernels on the H100 so far, so it
// runs only when the backend is created with decoder: 'persistent'; docs/results has the
// measurements and the next steps (dataflow counters instead of full barriers).
//
// The arithmetic is the per-op path's (op fused_matmul, rope_append, attention): warp-per-output
// GEMV with fp32 accumulation over lane-strided 16-byte weight chunks, the rows normalized once
// per block, split-KV online-softmax attention merged by the last split to arrive.
//
// Activations written by one block and read by another in a later phase are read with __ldcg
// (L2, never a possibly stale L1 line); the barrier orders them (fence, then counter).

constexpr int DL_MAX_LAYERS = 32;  // per launch: the layer table travels as a kernel parameter
constexpr int DL_WARPS = 32;
constexpr int DL_THREADS = DL_WARPS * 32;
constexpr int DL_MAXQ = 8;  // q heads per KV head
constexpr int DL_EPL = 4;   // head elements per lane: headDim <= 128
constexpr int DL_QG = 2;    // q heads a warp keeps in registers at once (64 registers a thread)
constexpr int DL_KB = 1;    // keys each warp has in flight
constexpr int DL_MIN_CHUNK = 16;

struct DlLayer {
  const uint16_t* qkv;
  const uint16_t* o;
  const uint16_t* gateUp;
  const uint16_t* down;
  const void* attnNorm;
  const void* mlpNorm;
  const void* qNorm;
  const void* kNorm;
  const void* qkvBias;
  const void* oBias;
  void* kc;
  void* vc;
};

struct DlParams {
  float* x;
  float* qkv;
  float* attn;
  float* mlp;
  float* part;
  int* counters;
  unsigned* bar;
  const int* positions;
  const int* slots;
  const int* bt;
  const int* rowSeq;
  const float* invFreq;
  int rows, hidden, nq, nkv, hd, inter, bs, mbps, nLayers, S;
  int normBf, qkNormBf, biasDt;
  int ksQkv, ksO, ksGu, ksDown;
  int last;  // 1 when this launch ends the stack (it releases the next kernel early)
  int ringOffset;  // bytes into dynamic shared memory where the cp.async rings start
  int deep;  // 1: prefetch a layer's o, gate_up and down rows into L2 together (they fit)
  float eps, scale;
  DlLayer L[DL_MAX_LAYERS];
};

__device__ __forceinline__ float dlW(const void* p, int bf, int i) {
  return bf ? bf2f(((const uint16_t*)p)[i]) : ((const float*)p)[i];
}

__device__ __forceinline__ unsigned dlAcquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Grid-wide barrier over a monotonically growing arrival counter; `target` is this block's
// running count of expected arrivals (gridDim.x per barrier passed).
__device__ __forceinline__ void dlGridSync(unsigned* bar, unsigned& target) {
  __syncthreads();
  target += gridDim.x;
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(bar, 1u);
    while (dlAcquire(bar) < target) {
    }
    __threadfence();
  }
  __syncthreads();
}

// Rows of src [rows, K] (row stride ld) into shared memory in the GEMV's interleaved layout
// (float4 j of row r at xs[r * n4 + (j & 1) * n8 + (j >> 1)]), normalized with nw when given.
template <int R>
__device__ void dlStage(const float* src, int ld, int K, int rows, float4* xs, const void* nw, int nwbf, float eps,
                        float* ssw) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n4 = K >> 2, n8 = K >> 3;
  float ss[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    ss[r] = 0.f;
    if (r < rows) {
      const float4* xr = reinterpret_cast<const float4*>(src + (size_t)r * ld);
      for (int j = threadIdx.x; j < n4; j += blockDim.x) {
        float4 v = __ldcg(xr + j);
        ss[r] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        xs[r * n4 + (j & 1) * n8 + (j >> 1)] = v;
      }
    }
  }
  if (!nw) {
    __syncthreads();
    return;
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    float t = warpSum(ss[r]);
    if (lane == 0) ssw[warp * R + r] = t;
  }
  __syncthreads();
  if (threadIdx.x < R) {
    float t = 0.f;
    for (int j = 0; j < DL_WARPS; j++) t += ssw[j * R + threadIdx.x];
    ssw[DL_WARPS * R + threadIdx.x] = rsqrtf(t / (float)K + eps);
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < R; r++) {
    if (r >= rows) continue;
    float inv = ssw[DL_WARPS * R + r];
    for (int j = threadIdx.x; j < n4; j += blockDim.x) {
      normScale4(xs[r * n4 + (j & 1) * n8 + (j >> 1)], inv, nw, nwbf, j);
    }
  }
  __syncthreads();
}

// Weight chunks each thread keeps in flight through its shared-memory ring (cp.async): 64 KiB
// per block either way. Registers would cap this at a quarter (the kernel runs one block of 16
// warps per SM), and at a quarter the 8B shape streamed at ~60 % of copy bandwidth.
__host__ __device__ constexpr int dlDepth(int no) { return no == 1 ? 4 : 2; }
constexpr size_t DL_RING_BYTES = (size_t)4 * DL_THREADS * 16;

__device__ __forceinline__ void dlCopy16(void* smem, const void* gmem) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void dlCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void dlWaitGroups() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// One GEMV phase: out[r, o] (=|+=) W[o, :] . xs[r, :] (+ bias[o]) for o < N; with NO == 2 the
// rows o and N + o are gate and up and out = silu(gate) * up. KS warps of a block share one
// output (split over K, reduced in a fixed order). Each thread streams its lane-strided 16-byte
// chunks of its rows, over all rounds of the phase, through a private ring of D slots in shared
// memory (a lane reads back only what it copied, so cp.async.wait_group is the only sync). The
// first D chunks are issued before `prep` (the barrier wait and the staging of xs).
template <int R, int NO, typename Prep>
__device__ void dlGemv(const uint16_t* __restrict__ W, int N, int K, int KS, const float4* xs, float* out, int ldo,
                       int rows, const void* bias, int biasDt, bool accumulate, float* red, uint4* ring, Prep prep) {
  constexpr int D = dlDepth(NO);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int opb = DL_WARPS / KS;
  const int ks = warp % KS;
  const int n4 = K >> 2, n8 = K >> 3;
  const int ST = 32 * KS;
  const int k0 = lane + ks * 32;
  const int C = (n8 + ST - 1) / ST;  // chunks per row per lane (the last may be past the row)
  const int base0 = blockIdx.x * opb, stride = gridDim.x * opb;
  const int rounds = base0 < N ? (N - 1 - base0) / stride + 1 : 0;
  // The issue side walks the same stream as the compute side, D chunks ahead, incrementally.
  int iRound = 0, iC = 0;
  const uint4* iPtr[NO];
  auto rowPtrs = [&](int round, const uint4** p) {
    int o = min(base0 + round * stride + warp / KS, N - 1);
#pragma unroll
    for (int n = 0; n < NO; n++) p[n] = reinterpret_cast<const uint4*>(W + (size_t)(o + n * N) * K) + k0;
  };
  if (rounds > 0) rowPtrs(0, iPtr);
  auto issue = [&](int slot) {
    if (iRound < rounds) {
      if (k0 + iC * ST < n8) {
#pragma unroll
        for (int n = 0; n < NO; n++) dlCopy16(ring + (size_t)(slot * NO + n) * DL_THREADS + threadIdx.x, iPtr[n] + iC * ST);
      }
      if (++iC == C) {
        iC = 0;
        if (++iRound < rounds) rowPtrs(iRound, iPtr);
      }
    }
    dlCommit();
  };
#pragma unroll
  for (int j = 0; j < D; j++) issue(j);
  prep();

  float acc[NO][R];
  int slot = 0;
  for (int round = 0; round < rounds; round++) {
#pragma unroll
    for (int n = 0; n < NO; n++)
#pragma unroll
      for (int r = 0; r < R; r++) acc[n][r] = 0.f;
#pragma unroll 2
    for (int c = 0; c < C; c++) {
    dlWaitGroups<D - 1>();
    const int k = k0 + c * ST;
    if (k < n8) {
      uint4 qq[NO];
#pragma unroll
      for (int n = 0; n < NO; n++) qq[n] = ring[(size_t)(slot * NO + n) * DL_THREADS + threadIdx.x];
#pragma unroll
      for (int r = 0; r < R; r++) {
        if (r < rows) {
          const float4 a = xs[r * n4 + k], b = xs[r * n4 + n8 + k];
          const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
          for (int n = 0; n < NO; n++) acc[n][r] += dot8bf16(qq[n], xv);
        }
      }
    }
    issue(slot);  // into the slot just read (this thread's own: no barrier needed)
    if (++slot == D) slot = 0;
    }

    int o = base0 + round * stride + warp / KS;
    const bool live = o < N;
    if (!live) o = N - 1;
    auto finish = [&](int r, float g, float u) {
      float y = g + (bias ? ldf(bias, biasDt, o) : 0.f);
      if (NO == 2) y = y / (1.f + expf(-y)) * u;
      float* d = out + (size_t)r * ldo + o;
      *d = accumulate ? __ldcg(d) + y : y;
    };
#pragma unroll
    for (int r = 0; r < R; r++) {
      float v0 = warpSum(acc[0][r]);
      float v1 = NO == 2 ? warpSum(acc[NO - 1][r]) : 0.f;
      if (KS == 1) {
        if (live && lane == 0 && r < rows) finish(r, v0, v1);
      } else if (lane == 0) {
        red[(warp * 2 + 0) * R + r] = v0;
        red[(warp * 2 + 1) * R + r] = v1;
      }
    }
    if (KS > 1) {
      __syncthreads();
      if (ks == 0 && live && lane < R && lane < rows) {
        float g = 0.f, u = 0.f;
        for (int jj = 0; jj < KS; jj++) {
          g += red[((warp + jj) * 2 + 0) * R + lane];
          u += red[((warp + jj) * 2 + 1) * R + lane];
        }
        finish(lane, g, u);
      }
      __syncthreads();
    }
  }
  dlWaitGroups<0>();  // the ring is free for the next phase
}

// Hint the L2 to fetch this block's rows of the next phase's weights (rows base.. of every round).
__device__ __forceinline__ void dlPrefetchRows(const uint16_t* W, int N, int K, int KS) {
  const int opb = DL_WARPS / KS;
  const size_t rowBytes = (size_t)K * 2;
  const int linesPerRow = (int)((rowBytes + 127) / 128);
  for (int base = blockIdx.x * opb; base < N; base += gridDim.x * opb) {
    int nRows = min(opb, N - base);
    const char* p = reinterpret_cast<const char*>(W + (size_t)base * K);
    for (int i = threadIdx.x; i < nRows * linesPerRow; i += blockDim.x)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p + (size_t)i * 128));
  }
}

template <typename KT>
__device__ __forceinline__ void dlStoreKv(KT* c, size_t i, float v);
template <>
__device__ __forceinline__ void dlStoreKv<float>(float* c, size_t i, float v) { c[i] = v; }
template <>
__device__ __forceinline__ void dlStoreKv<uint16_t>(uint16_t* c, size_t i, float v) { c[i] = f2bf(v); }

// Attention phase of one layer: work items (row, KV head, split). Each item applies QK-norm and
// RoPE to its q heads and to the new key (in shared memory), attends over its split of the
// context (the new key and value from shared memory, the rest from the cache), and writes one
// partial per q head; the split that arrives last merges them into attn. Split 0 appends the
// new key and value to the cache.
template <typename KT>
__device__ void dlAttention(const DlParams& P, const DlLayer& L, float* sm, int* lastFlag) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int hd = P.hd, half = hd >> 1, epl = hd >> 5, nq = P.nq, nkv = P.nkv, gq = nq / nkv, S = P.S;
  const int qkvOut = (nq + 2 * nkv) * hd;
  const size_t width = (size_t)nkv * hd;
  float* qs = sm;                      // [gq][hd], scaled
  float* kn = qs + DL_MAXQ * hd;       // [hd]
  float* vn = kn + hd;                 // [hd]
  float* pm = vn + hd;                 // [DL_WARPS][DL_MAXQ]
  float* pl = pm + DL_WARPS * DL_MAXQ; // [DL_WARPS][DL_MAXQ]
  float* pa = pl + DL_WARPS * DL_MAXQ; // [DL_WARPS][gq][hd]
  KT* kc = (KT*)L.kc;
  KT* vc = (KT*)L.vc;
  const int items = P.rows * nkv * S;
  for (int it = blockIdx.x; it < items; it += gridDim.x) {
    const int s = it % S, kvh = (it / S) % nkv, r = it / (S * nkv);
    const int last = P.positions[r], slot = P.slots[r];
    const float* row = P.qkv + (size_t)r * qkvOut;
    __syncthreads();  // shared memory of the previous item
    if (warp <= gq) {
      const bool isK = warp == gq;
      const float* src = isK ? row + (size_t)(nq + kvh) * hd : row + (size_t)(kvh * gq + warp) * hd;
      float v[DL_EPL];
#pragma unroll
      for (int j = 0; j < DL_EPL; j++) v[j] = j < epl ? __ldcg(src + j * 32 + lane) : 0.f;
      const void* nw = isK ? L.kNorm : L.qNorm;
      if (nw) {
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < DL_EPL; j++) ss += v[j] * v[j];
        ss = warpSum(ss);
        float inv = rsqrtf(ss / (float)hd + P.eps);
#pragma unroll
        for (int j = 0; j < DL_EPL; j++)
          if (j < epl) v[j] = v[j] * inv * dlW(nw, P.qkNormBf, j * 32 + lane);
      }
      const int e2 = epl >> 1;
#pragma unroll
      for (int j = 0; j < DL_EPL / 2; j++) {
        if (j >= e2) break;
        int i = j * 32 + lane;
        double ang = (double)__fmul_rn((float)last, P.invFreq[i]);
        double sn, cs;
        sincos(ang, &sn, &cs);
        float a = v[j], b = v[j + e2];
        float ra = (float)((double)a * cs - (double)b * sn), rb = (float)((double)b * cs + (double)a * sn);
        if (isK) {
          kn[i] = ra;
          kn[i + half] = rb;
          if (s == 0 && slot >= 0) {
            dlStoreKv<KT>(kc, (size_t)slot * width + (size_t)kvh * hd + i, ra);
            dlStoreKv<KT>(kc, (size_t)slot * width + (size_t)kvh * hd + i + half, rb);
          }
        } else {
          qs[warp * hd + i] = ra * P.scale;
          qs[warp * hd + i + half] = rb * P.scale;
        }
      }
    } else if (warp == gq + 1) {
      const float* src = row + (size_t)(nq + nkv + kvh) * hd;
      for (int t = lane; t < hd; t += 32) {
        float v = __ldcg(src + t);
        vn[t] = v;
        if (s == 0 && slot >= 0) dlStoreKv<KT>(vc, (size_t)slot * width + (size_t)kvh * hd + t, v);
      }
    }
    __syncthreads();

    const int chunk = max(DL_MIN_CHUNK, (last + S) / S);
    const int nAct = last / chunk + 1;
    const int start = s * chunk;
    if (start <= last) {
      const int end = min(start + chunk - 1, last);
      const int* btr = P.bt + (size_t)P.rowSeq[r] * P.mbps;
      // q heads in register groups of DL_QG (two passes over the keys for gq > DL_QG).
      for (int h0 = 0; h0 < gq; h0 += DL_QG) {
        const int ng = min(DL_QG, gq - h0);
        float qv[DL_QG][DL_EPL], acc[DL_QG][DL_EPL], m[DL_QG], l[DL_QG];
#pragma unroll
        for (int h = 0; h < DL_QG; h++) {
          m[h] = -INFINITY;
          l[h] = 0.f;
#pragma unroll
          for (int j = 0; j < DL_EPL; j++) {
            qv[h][j] = (h < ng && j < epl) ? qs[(h0 + h) * hd + j * 32 + lane] : 0.f;
            acc[h][j] = 0.f;
          }
        }
        for (int p0 = start + warp; p0 <= end; p0 += DL_WARPS * DL_KB) {
          float kv[DL_KB][DL_EPL], vv[DL_KB][DL_EPL];
          bool ok[DL_KB];
#pragma unroll
          for (int b = 0; b < DL_KB; b++) {
            int p = p0 + b * DL_WARPS;
            ok[b] = p <= end;
            if (ok[b] && p == last) {
#pragma unroll
              for (int j = 0; j < DL_EPL; j++) {
                // Rounded as the cache stores them (a bf16 cache under exact numerics).
                kv[b][j] = j < epl ? asStored(kc, kn[j * 32 + lane]) : 0.f;
                vv[b][j] = j < epl ? asStored(kc, vn[j * 32 + lane]) : 0.f;
              }
            } else {
              size_t sl = ok[b] ? (size_t)btr[p / P.bs] * P.bs + p % P.bs : 0;
              const KT* kr = kc + sl * width + (size_t)kvh * hd;
              const KT* vr = vc + sl * width + (size_t)kvh * hd;
#pragma unroll
              for (int j = 0; j < DL_EPL; j++) {
                bool in = ok[b] && j < epl;
                kv[b][j] = in ? ldk<KT>(kr, j * 32 + lane) : 0.f;
                vv[b][j] = in ? ldk<KT>(vr, j * 32 + lane) : 0.f;
              }
            }
          }
          float d[DL_KB][DL_QG];
#pragma unroll
          for (int b = 0; b < DL_KB; b++)
#pragma unroll
            for (int h = 0; h < DL_QG; h++) {
              d[b][h] = 0.f;
#pragma unroll
              for (int j = 0; j < DL_EPL; j++) d[b][h] += qv[h][j] * kv[b][j];
            }
#pragma unroll
          for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int b = 0; b < DL_KB; b++)
#pragma unroll
              for (int h = 0; h < DL_QG; h++) d[b][h] += __shfl_xor_sync(0xffffffffu, d[b][h], o);
#pragma unroll
          for (int h = 0; h < DL_QG; h++) {
            float mn = m[h];
#pragma unroll
            for (int b = 0; b < DL_KB; b++)
              if (ok[b]) mn = fmaxf(mn, d[b][h]);
            float corr = expf(m[h] - mn);
            l[h] *= corr;
#pragma unroll
            for (int j = 0; j < DL_EPL; j++) acc[h][j] *= corr;
#pragma unroll
            for (int b = 0; b < DL_KB; b++) {
              if (!ok[b]) continue;
              float e = expf(d[b][h] - mn);
              l[h] += e;
#pragma unroll
              for (int j = 0; j < DL_EPL; j++) acc[h][j] += e * vv[b][j];
            }
            m[h] = mn;
          }
        }
#pragma unroll
        for (int h = 0; h < DL_QG; h++) {
          if (h >= ng) break;
          if (lane == 0) {
            pm[warp * DL_MAXQ + h0 + h] = m[h];
            pl[warp * DL_MAXQ + h0 + h] = l[h];
          }
#pragma unroll
          for (int j = 0; j < DL_EPL; j++)
            if (j < epl) pa[(warp * gq + h0 + h) * hd + j * 32 + lane] = acc[h][j];
        }
      }
      __syncthreads();
      for (int t = threadIdx.x; t < gq * hd; t += blockDim.x) {
        const int h = t / hd, i = t % hd;
        float M = -INFINITY;
        for (int w = 0; w < DL_WARPS; w++) M = fmaxf(M, pm[w * DL_MAXQ + h]);
        float a = 0.f, Ls = 0.f;
        for (int w = 0; w < DL_WARPS; w++) {
          float lw = pl[w * DL_MAXQ + h];
          if (lw > 0.f) {
            float c = expf(pm[w * DL_MAXQ + h] - M);
            a += pa[(w * gq + h) * hd + i] * c;
            Ls += lw * c;
          }
        }
        float* dst = P.part + ((size_t)(r * nq + kvh * gq + h) * S + s) * (hd + 2);
        dst[2 + i] = a;
        if (i == 0) {
          dst[0] = M;
          dst[1] = Ls;
        }
      }
    }
    // Arrive (live splits only); the last of (row, KV head) merges the partials of its q heads.
    if (start > last) continue;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      int* c = P.counters + (size_t)r * nkv + kvh;
      int old = atomicAdd(c, 1);
      *lastFlag = old == nAct - 1;
      if (*lastFlag) *c = 0;
    }
    __syncthreads();
    if (*lastFlag) {
      __threadfence();
      for (int t = threadIdx.x; t < gq * hd; t += blockDim.x) {
        const int h = kvh * gq + t / hd, i = t % hd;
        const float* base = P.part + (size_t)(r * nq + h) * S * (hd + 2);
        float M = -INFINITY;
        for (int s2 = 0; s2 < nAct; s2++) M = fmaxf(M, __ldcg(base + (size_t)s2 * (hd + 2)));
        float Ls = 0.f, a = 0.f;
        for (int s2 = 0; s2 < nAct; s2++) {
          const float* ps = base + (size_t)s2 * (hd + 2);
          float lv = __ldcg(ps + 1);
          if (lv > 0.f) {
            float c = expf(__ldcg(ps) - M);
            Ls += lv * c;
            a += __ldcg(ps + 2 + i) * c;
          }
        }
        P.attn[(size_t)r * nq * hd + (size_t)h * hd + i] = Ls > 0.f ? a / Ls : 0.f;
      }
    }
  }
}

// Shared memory of the attention phase, in floats.
inline size_t dlAttnSmemFloats(int hd, int gq) {
  return (size_t)DL_MAXQ * hd + 2 * (size_t)hd + 2 * (size_t)DL_WARPS * DL_MAXQ + (size_t)DL_WARPS * gq * hd;
}

template <int R, typename KT>
__global__ void __launch_bounds__(DL_THREADS, 1) k_decoder_layers(const __grid_constant__ DlParams P) {
  extern __shared__ float4 dsm[];
  __shared__ float red[DL_WARPS * 2 * R];
  __shared__ float ssw[DL_WARPS * R + R];
  __shared__ int lastFlag;
  unsigned target = 0;
  uint4* ring = reinterpret_cast<uint4*>(reinterpret_cast<char*>(dsm) + P.ringOffset);
  const int hidden = P.hidden, qw = P.nq * P.hd, qkvOut = (P.nq + 2 * P.nkv) * P.hd, rows = P.rows;
  for (int li = 0; li < P.nLayers; li++) {
    const DlLayer& L = P.L[li];
    dlGemv<R, 1>(L.qkv, qkvOut, hidden, P.ksQkv, dsm, P.qkv, qkvOut, rows, L.qkvBias, P.biasDt, false, red, ring, [&]() {
      if (li == 0) pdlWait();  // the embedding (or the previous launch) wrote x
      else dlGridSync(P.bar, target);
      dlStage<R>(P.x, hidden, hidden, rows, dsm, L.attnNorm, P.normBf, P.eps, ssw);
    });
    // The attention phase is latency-bound and leaves HBM idle: the o (and, when they fit in L2
    // beside it, gate_up and down) rows this block will read start streaming into L2 now.
    dlPrefetchRows(L.o, hidden, qw, P.ksO);
    if (P.deep) {
      dlPrefetchRows(L.gateUp, P.inter, hidden, P.ksGu);
      dlPrefetchRows(L.gateUp + (size_t)P.inter * hidden, P.inter, hidden, P.ksGu);
      dlPrefetchRows(L.down, hidden, P.inter, P.ksDown);
    }
    dlGridSync(P.bar, target);
    dlAttention<KT>(P, L, reinterpret_cast<float*>(dsm), &lastFlag);
    dlGemv<R, 1>(L.o, hidden, qw, P.ksO, dsm, P.x, hidden, rows, L.oBias, P.biasDt, true, red, ring, [&]() {
      dlGridSync(P.bar, target);
      dlStage<R>(P.attn, qw, qw, rows, dsm, nullptr, 0, 0.f, ssw);
    });
    const bool lastLayer = li == P.nLayers - 1;
    dlGemv<R, 2>(L.gateUp, P.inter, hidden, P.ksGu, dsm, P.mlp, P.inter, rows, nullptr, 0, false, red, ring, [&]() {
      // The next layer's qkv rows stream into L2 over this phase and the next.
      if (!lastLayer) dlPrefetchRows(P.L[li + 1].qkv, qkvOut, hidden, P.ksQkv);
      dlGridSync(P.bar, target);
      dlStage<R>(P.x, hidden, hidden, rows, dsm, L.mlpNorm, P.normBf, P.eps, ssw);
    });
    dlGemv<R, 1>(L.down, hidden, P.inter, P.ksDown, dsm, P.x, hidden, rows, nullptr, 0, true, red, ring, [&]() {
      dlGridSync(P.bar, target);
      if (lastLayer && P.last) pdlTrigger();  // the final norm may be scheduled now; it waits for us
      dlStage<R>(P.mlp, P.inter, P.inter, rows, dsm, nullptr, 0, 0.f, ssw);
    });
  }
  // The last block out re-arms the barrier for the next launch (every block has passed every
  // barrier once it exits, so nobody still reads the counter).
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned old = atomicAdd(P.bar + 1, 1u);
    if (old == gridDim.x - 1) {
      P.bar[0] = 0;
      P.bar[1] = 0;
      __threadfence();
    }
  }
}

// Warps per output for an N x K phase over G blocks: the split that leaves the fewest warps idle
// in the last round (ties: the smaller split; each lane keeps at least one 16-byte chunk).
int dlPickKs(int N, int K, int G) {
  int best = 1;
  double bestEff = -1;
  for (int ks = 1; ks <= DL_WARPS; ks *= 2) {
    if (K / 8 < 32 * ks) break;
    int opb = DL_WARPS / ks;
    long long perRound = (long long)G * opb;
    long long rounds = (N + perRound - 1) / perRound;
    double eff = (double)N / (double)(rounds * perRound);
    if (eff > bestEff + 1e-9) {
      bestEff = eff;
      best = ks;
    }
  }
  return best;
}

struct DlLayerBufs {
  Buf attnNorm, qkv, qkvBias, qNorm, kNorm, o, oBias, mlpNorm, gateUp, down, kc, vc;
};

template <int R, typename KT>
int dlLaunch(NervaExec* ex, DlParams& P, size_t smem, int G) {
  auto kern = k_decoder_layers<R, KT>;
  // Opt in to the dynamic size every time (static + dynamic above 48 KiB needs it; it is not a
  // stream operation, so it is allowed under capture).
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return check(ex, "k_decoder_layers (shared memory)", e);
  return check(ex, "k_decoder_layers", launchKernel(ex, kern, dim3(G), dim3(DL_THREADS), smem, P));
}

// Blocks of the persistent kernel that fit on the device at once (0: it cannot run).
template <int R, typename KT>
int dlResident(NervaExec* ex, size_t smem) {
  auto kern = k_decoder_layers<R, KT>;
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  int nb = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kern, DL_THREADS, smem) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return nb;
}

template <int R>
int dlDispatch(NervaExec* ex, DlParams& P, int cdt, size_t smem, int G, bool probe) {
  if (cdt == NV_F32) return probe ? dlResident<R, float>(ex, smem) : dlLaunch<R, float>(ex, P, smem, G);
  return probe ? dlResident<R, uint16_t>(ex, smem) : dlLaunch<R, uint16_t>(ex, P, smem, G);
}

int dlRun(NervaExec* ex, int R, DlParams& P, int cdt, size_t smem, int G, bool probe) {
  switch (R) {
    case 1: return dlDispatch<1>(ex, P, cdt, smem, G, probe);
    case 2: return dlDispatch<2>(ex, P, cdt, smem, G, probe);
    default: return dlDispatch<4>(ex, P, cdt, smem, G, probe);
  }
}

bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

// Op decoder_layers. The persistent kernel when the shapes fit it; otherwise the same
// composition as the per-op path, layer by layer (fused_matmul, rope_append, attention).
// NERVA_DECODE_EARLY (an A/B switch, default 3): bit 1, o triggers gate_up at its entry; bit 2,
// down triggers the next layer's qkv at its entry (see the per-layer path below).
int decodeEarlyMask() {
  static const int v = [] {
    const char* e = getenv("NERVA_DECODE_EARLY");
    return e && *e ? std::max(0, std::min(3, atoi(e))) : 3;
  }();
  return v;
}

int opDecoderLayers(NervaExec* ex, Args& A) {
  Buf x = buf(A), qkv = buf(A), attn = buf(A), mlp = buf(A), pos = buf(A), slots = buf(A), bt = buf(A),
      rowSeq = buf(A), inv = buf(A);
  int rows = A.num(), hidden = A.num(), nq = A.num(), nkv = A.num(), hd = A.num(), inter = A.num(), bs = A.num(),
      mbps = A.num();
  float eps = (float)A.next(), scale = (float)A.next();
  // An upper bound on every row's keys (position + 1) while this call, or a graph captured with
  // it, runs; 0: none known. Decode attention picks its kernel by it.
  const int maxKeys = A.num();
  int nL = A.num();
  if (!A.ok || nL < 0) return bad(ex, "decoder_layers: argument count");
  if (maxKeys < 0) return bad(ex, "decoder_layers: maxKeys must be >= 0");
  std::vector<DlLayerBufs> Ls((size_t)nL);
  for (auto& l : Ls) {
    l.attnNorm = buf(A);
    l.qkv = buf(A);
    l.qkvBias = buf(A);
    l.qNorm = buf(A);
    l.kNorm = buf(A);
    l.o = buf(A);
    l.oBias = buf(A);
    l.mlpNorm = buf(A);
    l.gateUp = buf(A);
    l.down = buf(A);
    l.kc = buf(A);
    l.vc = buf(A);
  }
  // embed: a flag, then the table and the ids (x := table[ids] before the layers).
  Buf etab{nullptr, 0}, eids{nullptr, 0};
  const int embed = A.num();
  if (embed) {
    etab = buf(A);
    eids = buf(A);
  }
  if (!A.ok) return bad(ex, "decoder_layers: argument count");
  if (embed && (!etab.p || !eids.p)) return bad(ex, "decoder_layers: embed needs a table and ids");
  if (nkv <= 0 || nq % nkv != 0) return bad(ex, "decoder_layers: numHeads must be a multiple of numKvHeads");
  if (hd <= 0 || hd % 2 != 0 || hd > 256) return bad(ex, "decoder_layers: headDim must be even and at most 256");
  for (auto& l : Ls)
    if (l.kc.dt != l.vc.dt) return bad(ex, "decoder_layers: kCache and vCache dtypes differ");
  // Nothing to fold the gather into: op embedding's kernel, then the layers (if any).
  if (embed && rows > 0 && (nL == 0 || rows != 1)) {
    LAUNCH(k_embedding, rows, 256, 0, etab.p, etab.dt, (const int*)eids.p, (float*)x.p, hidden, ex->bf16act ? 1 : 0);
    etab.p = nullptr;
  }
  if (rows <= 0 || nL == 0) return NERVA_OK;
  const int qkvOut = (nq + 2 * nkv) * hd, qw = nq * hd, gq = nq / nkv;

  // Can the persistent kernel take it? First its attention phase (head shape, uniform cache and
  // QK-norm dtypes across layers), then the rest (bf16 weights, alignment, uniform norm/bias).
  const bool qkNorm = Ls[0].qNorm.p != nullptr;
  bool attnOk = hd % 64 == 0 && hd <= 32 * DL_EPL && gq <= DL_MAXQ && gq + 2 <= DL_WARPS;
  for (auto& l : Ls) {
    if (l.kc.dt != Ls[0].kc.dt || (l.qNorm.p != nullptr) != qkNorm || (l.kNorm.p != nullptr) != qkNorm) attnOk = false;
    if (qkNorm && (l.qNorm.dt != Ls[0].qNorm.dt || l.kNorm.dt != Ls[0].qNorm.dt)) attnOk = false;
  }
  if (Ls[0].kc.dt != NV_F32 && Ls[0].kc.dt != NV_BF16) attnOk = false;
  if (qkNorm && Ls[0].qNorm.dt != NV_BF16 && Ls[0].qNorm.dt != NV_F32) attnOk = false;
  bool mega = attnOk && rows <= 4 && ex->gridSync && hidden % 8 == 0 && qw % 8 == 0 && inter % 8 == 0 && aligned16(x.p) && aligned16(attn.p) &&
              aligned16(mlp.p) && (size_t)rows * nkv <= ex->counterCount;
  const int normDt = Ls[0].attnNorm.dt, cdt = Ls[0].kc.dt;
  int biasDt = -1;
  for (auto& l : Ls) {
    for (const Buf* w : {&l.qkv, &l.o, &l.gateUp, &l.down})
      if (w->dt != NV_BF16 || !aligned16(w->p)) mega = false;
    if (l.attnNorm.dt != normDt || l.mlpNorm.dt != normDt || !aligned16(l.attnNorm.p) || !aligned16(l.mlpNorm.p))
      mega = false;
    for (const Buf* b : {&l.qkvBias, &l.oBias}) {
      if (!b->p) continue;
      if (biasDt >= 0 && b->dt != biasDt) mega = false;
      biasDt = b->dt;
    }
  }
  if (normDt != NV_BF16 && normDt != NV_F32) mega = false;
  const int R = rows == 1 ? 1 : rows == 2 ? 2 : 4;
  const size_t kMax = (size_t)std::max(hidden, std::max(qw, inter));
  const size_t front = align256(std::max((size_t)R * kMax, dlAttnSmemFloats(hd, gq)) * sizeof(float));
  const size_t smem = front + DL_RING_BYTES;
  if (smem + 2048 > (size_t)ex->smemOptin) mega = false;  // room for the static shared arrays
  if (!ex->persistentDecoder || ex->bf16act) mega = false;  // the persistent kernel rounds nothing
  if (ex->batchInv) mega = false;  // its GEMV and attention split differ from the per-layer path's
  int G = 0;
  if (mega) {
    DlParams probe;
    int nb = dlRun(ex, R, probe, cdt, smem, 0, true);
    G = ex->smCount * std::min(nb, 1);
    if (G <= 0) mega = false;
  }
  int S = 1;
  if (mega) {
    S = std::max(1, G / (rows * nkv));
    while (S > 1 && (size_t)rows * nq * S * (hd + 2) * sizeof(float) > ex->wsBytes) S /= 2;
    if ((size_t)rows * nq * S * (hd + 2) * sizeof(float) > ex->wsBytes) mega = false;
  }

  if (mega && etab.p) {
    LAUNCH(k_embedding, rows, 256, 0, etab.p, etab.dt, (const int*)eids.p, (float*)x.p, hidden, ex->bf16act ? 1 : 0);
    etab.p = nullptr;
  }
  if (mega) {
    DlParams P;
    memset(&P, 0, sizeof P);
    P.x = (float*)x.p;
    P.qkv = (float*)qkv.p;
    P.attn = (float*)attn.p;
    P.mlp = (float*)mlp.p;
    P.part = (float*)ex->ws;
    P.counters = ex->counters;
    P.bar = ex->gridSync;
    P.positions = (const int*)pos.p;
    P.slots = (const int*)slots.p;
    P.bt = (const int*)bt.p;
    P.rowSeq = (const int*)rowSeq.p;
    P.invFreq = (const float*)inv.p;
    P.rows = rows;
    P.hidden = hidden;
    P.nq = nq;
    P.nkv = nkv;
    P.hd = hd;
    P.inter = inter;
    P.bs = bs;
    P.mbps = mbps;
    P.S = S;
    P.normBf = normDt == NV_BF16;
    P.qkNormBf = qkNorm && Ls[0].qNorm.dt == NV_BF16;
    P.biasDt = biasDt < 0 ? NV_F32 : biasDt;
    P.ksQkv = dlPickKs(qkvOut, hidden, G);
    P.ksO = dlPickKs(hidden, qw, G);
    P.ksGu = dlPickKs(inter, hidden, G);
    P.ksDown = dlPickKs(hidden, inter, G);
    P.eps = eps;
    P.scale = scale;
    P.ringOffset = (int)front;
    // Deep prefetch while the o, gate_up and down matrices of a layer fit in about half the L2.
    const size_t mlpBytes = ((size_t)hidden * qw + 3 * (size_t)hidden * inter) * 2;
    P.deep = mlpBytes <= (size_t)ex->l2Bytes / 2;
    for (int l0 = 0; l0 < nL; l0 += DL_MAX_LAYERS) {
      P.nLayers = std::min(DL_MAX_LAYERS, nL - l0);
      P.last = l0 + P.nLayers == nL;
      for (int i = 0; i < P.nLayers; i++) {
        const DlLayerBufs& l = Ls[(size_t)(l0 + i)];
        DlLayer& d = P.L[i];
        d.qkv = (const uint16_t*)l.qkv.p;
        d.o = (const uint16_t*)l.o.p;
        d.gateUp = (const uint16_t*)l.gateUp.p;
        d.down = (const uint16_t*)l.down.p;
        d.attnNorm = l.attnNorm.p;
        d.mlpNorm = l.mlpNorm.p;
        d.qNorm = l.qNorm.p;
        d.kNorm = l.kNorm.p;
        d.qkvBias = l.qkvBias.p;
        d.oBias = l.oBias.p;
        d.kc = l.kc.p;
        d.vc = l.vc.p;
      }
      int rc = dlRun(ex, R, P, cdt, smem, G, false);
      if (rc) return rc;
    }
    return NERVA_OK;
  }

  // Per layer: the per-op path (fused_matmul, rope_append, attention), as separate kernels.
  for (auto& l : Ls) {
    Fuse fq;
    fq.nw = l.attnNorm;
    fq.eps = eps;
    if (&l == &Ls[0] && etab.p) {
      // The first qkv gathers the row from the table itself where it runs as one lean block
      // grid (the step's embedding kernel and its boundary gone), else launches k_embedding first.
      fq.embTable = etab.p;
      fq.embDt = etab.dt;
      fq.embIds = (const int*)eids.p;
    }
    int rc = gemvRows(ex, (const float*)x.p, l.qkv, (float*)qkv.p, rows, hidden, qkvOut, l.qkvBias, fq);
    // Many rows: the GQA kernel (each key read once for its q heads), after rope_append.
    const bool gqa = attnDecodeGqaFits(ex, rows, nq, nkv, hd, l.kc.dt, l.vc.dt);
    // Decode rows with headDim 128: rope_append's work is fused into the attention kernel.
    const bool fuseRope = !gqa && hd == 128 && !ex->bf16act && l.kc.dt == l.vc.dt &&
                          (!l.qNorm.p || !l.kNorm.p || l.qNorm.dt == l.kNorm.dt) && ex->counters &&
                          (size_t)rows * nq <= ex->counterCount;
    RopeFuse rf;
    if (fuseRope) {
      rf.invFreq = (const float*)inv.p;
      rf.qn = l.qNorm.p;
      rf.kn = l.kNorm.p;
      rf.ndt = l.qNorm.p ? l.qNorm.dt : l.kNorm.dt;
      rf.slots = (const int*)slots.p;
      rf.eps = eps;
    } else if (!rc) {
      rc = ropeAppendRun(ex, (float*)qkv.p, pos, inv, slots, l.kc, l.vc, l.qNorm, l.kNorm, rows, nq, nkv, hd, qkvOut, eps);
    }
    // Many rows on cuBLAS(Lt): the attention also splits its output into o's bf16 operand.
    SplitHandoff attnSplit;
    if (!rc && gqa)
      rc = attnDecodeGqa(ex, (const float*)qkv.p, l.kc, l.vc, (float*)attn.p, bt, rowSeq, pos, rows, nq, nkv, bs, mbps, qkvOut,
                         0, scale, &attnSplit);
    else if (!rc)
      // Decode rows: the attention streams its first keys in before waiting on rope_append.
      rc = attentionRun(ex, (const float*)qkv.p, l.kc, l.vc, (float*)attn.p, bt, rowSeq, pos, rows, nq, nkv, hd, bs, mbps,
                        qkvOut, 0, scale, 1, fuseRope ? &rf : nullptr, 0, nullptr, 0, maxKeys);
    // The residual x that o and down accumulate into was last written by down of the layer
    // before (three kernels back) and by o (two back): both read it before their wait.
    Fuse fo;
    fo.accumulate = true;
    fo.accPre = true;
    const int earlyMask = decodeEarlyMask();
    // o triggers gate_up at entry: gate_up (the layer's largest matrix) then streams its weights
    // during the attention. gate_up reads only weights before its wait, and down (accPre) still
    // starts after gate_up's wait, when o is complete.
    fo.early = (earlyMask & 1) != 0;
    fo.take = &attnSplit;
    if (!rc) rc = gemvRows(ex, (const float*)attn.p, l.o, (float*)x.p, rows, qw, hidden, l.oBias, fo);
    // Many rows on cuBLAS(Lt): gate_up's epilogue also splits its output into down's bf16 operand.
    SplitHandoff mlpSplit;
    Fuse fg;
    fg.nw = l.mlpNorm;
    fg.eps = eps;
    fg.glu = true;
    fg.emit = &mlpSplit;
    if (!rc) rc = gemvRows(ex, (const float*)x.p, l.gateUp, (float*)mlp.p, rows, hidden, inter, Buf{nullptr, 0}, fg);
    Fuse fd;
    fd.accumulate = true;
    fd.accPre = true;
    // down triggers the next layer's qkv at entry, for the same reason (qkv reads only weights
    // before its wait, and triggers the attention only after it).
    fd.early = (earlyMask & 2) != 0;
    fd.take = &mlpSplit;
    if (!rc) rc = gemvRows(ex, (const float*)mlp.p, l.down, (float*)x.p, rows, inter, hidden, Buf{nullptr, 0}, fd);
    if (rc) return rc;
  }
  return NERVA_OK;
}
