// Decode attention without a global merge (included by kernels.cu after k_attn_partial_rope).
// One thread block cluster per (row, KV head): its C blocks share the keys 0..last evenly, each
// serving the G q heads of the KV head. A block copies its keys and values into shared memory
// with cp.async before its dependency wait (they were written by earlier steps), so they arrive
// while qkv still runs; after the wait it takes q and the new key from the qkv rows (rope_append's
// arithmetic, as the split-KV kernel does), scores and folds its keys, and the cluster merges the
// blocks' partials through distributed shared memory: no fence, counter or L2 round trip between
// the keys and the output. Keys beyond a block's shared-memory tile are taken in further passes
// (loaded after the wait). headDim 128, exact numerics (f32 arithmetic), f32 or bf16 caches.

// (cooperative_groups.h: included at the top of kernels.cu, outside its namespace)

constexpr int SA_THREADS = 128;
constexpr int SA_HD = 128;
constexpr int SA_MAX_G = 4;
constexpr int SA_MAX_C = 16;  // cluster size (16: non-portable)

template <typename KT>
__host__ __device__ constexpr int saRowElems() {
  return SA_HD + 16 / (int)sizeof(KT);  // padded: a row starts 16 bytes on from the bank of the one before
}
template <typename KT>
size_t saSmemBytes(int cap) {
  return (size_t)cap * 2 * saRowElems<KT>() * sizeof(KT) + (size_t)cap * (sizeof(long long) + SA_MAX_G * sizeof(float));
}

__device__ __forceinline__ void saLoad8(const float* p, float (&v)[8]) {
  const float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void saLoad8(const uint16_t* p, float (&v)[8]) {
  const uint4 a = *(const uint4*)p;
  const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void saLoad4(const float* p, float (&v)[4]) {
  const float4 a = *(const float4*)p;
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}
__device__ __forceinline__ void saLoad4(const uint16_t* p, float (&v)[4]) {
  const uint2 a = *(const uint2*)p;
  v[0] = __uint_as_float(a.x << 16), v[1] = __uint_as_float(a.x & 0xffff0000u);
  v[2] = __uint_as_float(a.y << 16), v[3] = __uint_as_float(a.y & 0xffff0000u);
}
__device__ __forceinline__ void saCopy16(void* dst, const void* src, bool in) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(in ? 16 : 0) : "memory");
}
__device__ __forceinline__ void saCopyWait() { asm volatile("cp.async.wait_all;" ::: "memory"); }

template <typename KT, int G>
__global__ void __launch_bounds__(SA_THREADS) k_attn_decode_short(const float* q, KT* kc, KT* vc, const int* bt,
                                                                 const int* rowSeq, const int* positions, float* out,
                                                                 int H, int KVH, int bs, int mbps, int qStride, int qOff,
                                                                 float scale, int cap, RopeFuse rf, int markAt, int trigAt) {
  namespace cg = cooperative_groups;
  constexpr int LD = saRowElems<KT>();
  constexpr int CPR = SA_HD * (int)sizeof(KT) / 16;  // 16-byte copies a row
  constexpr int NW = SA_THREADS / 32;
  extern __shared__ __align__(16) unsigned char sasm[];
  KT* const ks = (KT*)sasm;                  // cap rows of keys
  KT* const vs = ks + (size_t)cap * LD;      // then cap rows of values
  long long* const slotS = (long long*)(vs + (size_t)cap * LD);  // -1: not in this cache; -2: the new key
  float* const ps = (float*)(slotS + cap);   // [G][cap] scores, then probabilities
  __shared__ __align__(16) float qs[G][SA_HD];
  __shared__ __align__(16) float accW[NW][G][SA_HD];
  __shared__ float red[NW][G];
  __shared__ float mS[G], lS[G];             // this block's partial, read by the cluster
  __shared__ __align__(16) float accS[G][SA_HD];
  __shared__ double shcs[64][2];

  NERVA_TRACE_KERNEL_AT(300000);  // trace_timeline.py: attn_decode_short.cuh:300000
  cg::cluster_group cl = cg::this_cluster();
  const int C = (int)cl.num_blocks(), rank = (int)cl.block_rank();
  const int kvh = blockIdx.y, r = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int last = positions[r];
  const int chunk = (last + C) / C;  // keys 0..last over the C blocks
  const int start = rank * chunk, stop = min(start + chunk, last + 1);  // [start, stop)
  const int* btr = bt + (size_t)rowSeq[r] * mbps;
  const size_t width = (size_t)KVH * SA_HD;

  // Slots and copies of keys [t0, t0 + n). The first tile is copied before the wait, when the new
  // key (last) is not in the cache yet: the owner warp puts it in from registers (-2). A later tile
  // reads it back from the cache, where that warp has stored it.
  auto issue = [&](int t0, int n, bool first) {
    for (int i = tid; i < n; i += SA_THREADS) {
      const int p = t0 + i;
      long long s = -2;
      if (p != last || !first) {
        const int e = btr[p / bs];
        s = e >= 0 ? (long long)e * bs + p % bs : -1;  // a negative entry: the block lives in another cache
      }
      slotS[i] = s;
    }
    __syncthreads();
    for (int c = tid; c < n * CPR; c += SA_THREADS) {
      const int i = c / CPR, part = c % CPR;
      const long long s = slotS[i];
      const size_t off = (size_t)max(s, 0ll) * width + (size_t)kvh * SA_HD + (size_t)part * (16 / sizeof(KT));
      saCopy16(ks + (size_t)i * LD + part * (16 / sizeof(KT)), kc + off, s >= 0);
      saCopy16(vs + (size_t)i * LD + part * (16 / sizeof(KT)), vc + off, s >= 0);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };

  const int n0 = max(0, min(cap, stop - start));
  if (n0 > 0) issue(start, n0, true);
  if (tid < 64) sincos((double)__fmul_rn((float)last, rf.invFreq[tid]), &shcs[tid][1], &shcs[tid][0]);
  __syncthreads();
  pdlWait();
  if (trigAt == 0) pdlTrigger();

  // q heads (warps 0..G-1) and, in the block that holds key `last`, the new key and value.
  const bool owner = last >= start && last < stop;
  if (warp < G) {
    const float* qr = q + (size_t)r * qStride + qOff + (size_t)(kvh * G + warp) * SA_HD;
    float a[4];
#pragma unroll
    for (int j = 0; j < 4; j++) a[j] = qr[attnElem<true>(j, lane)];
    ropeHeadWarp<true>(a, rf.qn, rf.ndt, rf.eps, shcs, lane);
#pragma unroll
    for (int j = 0; j < 4; j++) qs[warp][attnElem<true>(j, lane)] = a[j] * scale;
  }
  if (owner && warp == G % NW) {  // (G = NW: warp 0, after its q head)
    const float* krow = q + (size_t)r * qStride + qOff + (size_t)(H + kvh) * SA_HD;
    const float* vrow = krow + width;
    float kr4[4], vr4[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      kr4[j] = krow[attnElem<true>(j, lane)];
      vr4[j] = vrow[attnElem<true>(j, lane)];
    }
    ropeHeadWarp<true>(kr4, rf.kn, rf.ndt, rf.eps, shcs, lane);
    const int sl = rf.slots[r];
    const int li = last - start;  // its row in the tile (the new key is in the first pass when it fits)
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int e = attnElem<true>(j, lane);
      if (sl >= 0) {
        stk(kc + (size_t)sl * width + (size_t)kvh * SA_HD, e, kr4[j]);
        stk(vc + (size_t)sl * width + (size_t)kvh * SA_HD, e, vr4[j]);
      }
      if (li < cap) {
        // As the cache stores it, so the row sees the same key whether it reads it back or not.
        if constexpr (std::is_same<KT, float>::value) {
          ks[(size_t)li * LD + e] = kr4[j];
          vs[(size_t)li * LD + e] = vr4[j];
        } else {
          ks[(size_t)li * LD + e] = f2bf(kr4[j]);
          vs[(size_t)li * LD + e] = f2bf(vr4[j]);
        }
      }
    }
  }

  float m[G], l[G], acc[G][4];
#pragma unroll
  for (int g = 0; g < G; g++) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) acc[g][j] = 0.f;
  }
  for (int t0 = start; t0 < stop; t0 += cap) {
    const int n = min(cap, stop - t0);
    if (t0 != start) {
      __syncthreads();  // the tile before is used up
      issue(t0, n, false);
    }
    saCopyWait();
    __syncthreads();
    if (t0 == start && markAt == 1) NERVA_TRACE_MARK();  // q, the new key and the first tile are in
    // Scores: a thread a key, every q head of the group.
    for (int i = tid; i < n; i += SA_THREADS) {
      float d[G];
#pragma unroll
      for (int g = 0; g < G; g++) d[g] = 0.f;
      const KT* kr = ks + (size_t)i * LD;
#pragma unroll 4
      for (int e = 0; e < SA_HD; e += 8) {
        float kv8[8];
        saLoad8(kr + e, kv8);
#pragma unroll
        for (int g = 0; g < G; g++) {
          const float4 qa = *(const float4*)&qs[g][e], qb = *(const float4*)&qs[g][e + 4];
          d[g] += qa.x * kv8[0] + qa.y * kv8[1] + qa.z * kv8[2] + qa.w * kv8[3] + qb.x * kv8[4] + qb.y * kv8[5] +
                  qb.z * kv8[6] + qb.w * kv8[7];
        }
      }
      const bool in = slotS[i] != -1;
#pragma unroll
      for (int g = 0; g < G; g++) ps[g * cap + i] = in ? d[g] : -INFINITY;
    }
    __syncthreads();
    if (t0 == start && markAt == 2) NERVA_TRACE_MARK();  // scored
    // The tile's maximum per head, then its probabilities under the running maximum.
    float mx[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
      float v = -INFINITY;
      for (int i = tid; i < n; i += SA_THREADS) v = fmaxf(v, ps[g * cap + i]);
      v = warpMax(v);
      if (lane == 0) red[warp][g] = v;
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < G; g++) {
      float v = m[g];
#pragma unroll
      for (int w = 0; w < NW; w++) v = fmaxf(v, red[w][g]);
      mx[g] = v;
    }
    __syncthreads();  // red is reused for the sums
#pragma unroll
    for (int g = 0; g < G; g++) {
      float s = 0.f;
      for (int i = tid; i < n; i += SA_THREADS) {
        const float e = mx[g] == -INFINITY ? 0.f : expf(ps[g * cap + i] - mx[g]);
        ps[g * cap + i] = e;
        s += e;
      }
      s = warpSum(s);
      if (lane == 0) red[warp][g] = s;
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < G; g++) {
      const float corr = m[g] == -INFINITY ? 0.f : expf(m[g] - mx[g]);
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < NW; w++) s += red[w][g];
      l[g] = l[g] * corr + s;
#pragma unroll
      for (int j = 0; j < 4; j++) acc[g][j] *= corr;
      m[g] = mx[g];
    }
    // Values: warp w folds keys w, w + NW, ..., lane its 4 columns.
    for (int i = warp; i < n; i += NW) {
      float v4[4];
      saLoad4(vs + (size_t)i * LD + 4 * lane, v4);
#pragma unroll
      for (int g = 0; g < G; g++) {
        const float p = ps[g * cap + i];
#pragma unroll
        for (int j = 0; j < 4; j++) acc[g][j] += p * v4[j];
      }
    }
  }
  if (markAt == 3) NERVA_TRACE_MARK();  // keys folded
  if (trigAt == 1) pdlTrigger();
  // The block's partial: the warps' columns summed in order.
#pragma unroll
  for (int g = 0; g < G; g++) *(float4*)&accW[warp][g][4 * lane] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
  __syncthreads();
  for (int c = tid; c < G * SA_HD; c += SA_THREADS) {
    const int g = c / SA_HD, d = c % SA_HD;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) s += accW[w][g][d];
    accS[g][d] = s;
  }
  if (tid < G) {
    mS[tid] = m[tid];
    lS[tid] = l[tid];
  }
  if (markAt == 4) NERVA_TRACE_MARK();  // partial in shared memory
  cl.sync();  // every block's partial is in its shared memory
  if (markAt == 5) NERVA_TRACE_MARK();  // the cluster's partials are in
  // Every block takes the C (m, l) pairs at once, then their weights; block `rank` writes its share
  // of the G * 128 outputs, the C accumulators of each loaded together (one DSMEM round trip).
  __shared__ float mAll[SA_MAX_C][G], wAll[SA_MAX_C][G], invL[G];
  if (tid < C * G) {
    const int b = tid / G, g = tid % G;
    const float lb = *cl.map_shared_rank(&lS[g], b);
    mAll[b][g] = lb > 0.f ? *cl.map_shared_rank(&mS[g], b) : -INFINITY;
    wAll[b][g] = lb;
  }
  __syncthreads();
  if (tid < G) {
    float M = -INFINITY;
    for (int b = 0; b < C; b++) M = fmaxf(M, mAll[b][tid]);
    float L = 0.f;
    for (int b = 0; b < C; b++) {
      const float w = mAll[b][tid] == -INFINITY ? 0.f : expf(mAll[b][tid] - M);
      L += wAll[b][tid] * w;
      wAll[b][tid] = w;
    }
    invL[tid] = L;
  }
  __syncthreads();
  const int per = (G * SA_HD + C - 1) / C;
  for (int c = rank * per + tid; c < min((rank + 1) * per, G * SA_HD); c += SA_THREADS) {
    const int g = c / SA_HD, d = c % SA_HD;
    float v[SA_MAX_C];
#pragma unroll
    for (int b = 0; b < SA_MAX_C; b++) v[b] = b < C ? *cl.map_shared_rank(&accS[g][d], b) : 0.f;
    float a = 0.f;
#pragma unroll
    for (int b = 0; b < SA_MAX_C; b++)
      if (b < C) a += v[b] * wAll[b][g];
    const float L = invL[g];
    out[(size_t)r * H * SA_HD + (size_t)(kvh * G + g) * SA_HD + d] = L > 0.f ? a / L : 0.f;
  }
  if (markAt == 6) NERVA_TRACE_MARK();  // merged
  if (trigAt == 2) pdlTrigger();
  cl.sync();  // no block leaves while another reads its shared memory
}

// Cluster size for k_attn_decode_short (NERVA_ATTN_SHORT: 0 off, else 2, 4, 8 or 16) and its
// tile in keys (NERVA_ATTN_SHORT_CAP).
int attnShortSetting() {
  static const int v = [] {
    const char* e = getenv("NERVA_ATTN_SHORT");
    return e && *e ? atoi(e) : 0;
  }();
  return v;
}
int attnShortCap() {
  static const int v = [] {
    const char* e = getenv("NERVA_ATTN_SHORT_CAP");
    return e && *e ? std::max(8, atoi(e)) : 64;
  }();
  return v;
}

template <typename KT, int G>
cudaError_t attnShortLaunch(NervaExec* ex, int C, int cap, int rows, const float* q, KT* kc, KT* vc, const int* bt,
                            const int* rowSeq, const int* pos, float* out, int H, int KVH, int bs, int mbps, int qStride,
                            int qOff, float scale, const RopeFuse& rf) {
  int markAt = 1;
  static const int trigAt = [] {
    const char* e = getenv("NERVA_SA_TRIGGER");
    return e && *e ? atoi(e) : 0;
  }();
#ifdef NERVA_TRACE
  if (const char* m = getenv("NERVA_SA_MARK")) markAt = atoi(m);
#endif
  auto fn = k_attn_decode_short<KT, G>;
  const size_t smem = saSmemBytes<KT>(cap);
  static size_t granted = 0;
  if (smem > granted) {
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    if (C > 8 && (e = cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)) != cudaSuccess) return e;
    granted = smem;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)C, (unsigned)KVH, (unsigned)rows);
  cfg.blockDim = dim3(SA_THREADS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ex->stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)C;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (ex->pdl) {
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.numAttrs = 2;
  }
  return cudaLaunchKernelEx(&cfg, fn, q, kc, vc, bt, rowSeq, pos, out, H, KVH, bs, mbps, qStride, qOff, scale, cap, rf, markAt, trigAt);
}
