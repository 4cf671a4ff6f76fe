// The decode group: at one decode row (op decoder_layers, batch 1), a layer's qkv projection and
// its attention as one kernel of thread block clusters, a cluster per KV head. Included by
// kernels.cu after attentionRun, whose split-KV arithmetic (attnPartial, attnMergeHead) it runs.
//
// Why: traced on the H100 (sessions 17-21), the 0.6B's attention held 10.7 of a ~25 us layer,
// against under a microsecond of data. Most of it was dependent L2 round trips: qkv's rows out and
// back in across a kernel boundary (whose blocks left the SMs before the attention's became
// resident), then each split's partial fenced, counted and reloaded by the split that came last,
// while the next kernels' weight streams slowed every one of those round trips. Here the CS blocks
// of a cluster compute their KV head's q, k and v rows themselves (the weights stream into shared
// memory by bulk copies before the dependency wait, so they need no registers and no residency
// of a kernel of their own), hand the rows to each other through distributed shared memory, run
// the head's splits, and merge them in shared memory: between the layer input and the attention
// output there are two cluster barriers and no global round trip.
//
// Bits: each qkv row as k_gemv_bf16<1, 1, NORM> computes it (the norm's sums of squares in its
// 512-thread order, the lane chunks in ascending order, dot8bf16, the warp sum, the bias); the
// splits, their arithmetic and their merge are attentionRun's for a single row (the same S, chunk,
// attnPartial with the same block size, attnMergeHead): the same tokens as the two kernels.
//
// Shared memory (dynamic): the block's weight rows (rowsPerBlock * hidden bf16), the normalized
// input (hidden floats, k_gemv_bf16's interleaved layout), a full qkv row of which the group's
// rows are filled (qkvOut floats: attnPartial indexes q, k and v as in the global buffer), the
// partials of the head this block merges (S * (hd + 2) floats), the angles' (cos, sin) and the
// bulk copies' barrier. (<cooperative_groups.h> is included at the top of kernels.cu: this file
// is included inside its anonymous namespace.)


constexpr int DG_THREADS = 32 * ATT_WARPS;  // attnPartial's block: the splits' bits depend on it
constexpr int DG_NORM_THREADS = 512;        // k_gemv_bf16<1, 1, NORM>'s block, whose norm sums we take
constexpr int DG_MAX_SPLITS = 64;           // partials a block holds in shared memory

struct DecodeGroup {
  const float* x = nullptr;     // the layer input row (the residual stream)
  const uint16_t* w = nullptr;  // qkv weights, bf16 [(H + 2 KVH) * hd, hidden]
  const void* nw = nullptr;     // the attention norm's weight
  int nwbf = 0;
  const void* bias = nullptr;   // qkv bias (or null)
  int bdt = 0;
  int hidden = 0;
  int rowsPerBlock = 0;         // (G + 2) * hd / CS
  float eps = 0.f;
  int markAt = 3;               // traced builds: where NERVA_TRACE_MARK is taken (DG_MARK)
};
// Traced builds (-DNERVA_TRACE): the block's trace mark at point k of the kernel, chosen by the
// environment variable NERVA_DG_MARK (1 norm done, 2 weights in, 3 rows handed over (default),
// 4 first head's partial, 5 every head's partial, 6 partials in place).
#define DG_MARK(k)                     \
  do {                                 \
    if (dg.markAt == (k)) NERVA_TRACE_MARK(); \
  } while (0)

// The qkv output row of group-local row t of KV head kvh: its G q heads, then its k, then its v.
__device__ __forceinline__ int dgRow(int t, int kvh, int G, int H, int KVH, int hd) {
  if (t < G * hd) return kvh * G * hd + t;
  if (t < (G + 1) * hd) return H * hd + kvh * hd + (t - G * hd);
  return (H + KVH) * hd + kvh * hd + (t - (G + 1) * hd);
}

__device__ __forceinline__ unsigned dgSmem(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

template <typename KT>
__global__ void __maxnreg__(112) k_decode_group(const KT* kc, const KT* vc, const int* bt, const int* rowSeq,
                                                const int* positions, float* out, int H, int KVH, int hd, int bs, int mbps,
                                                float scale, int minChunk, int S, RopeFuse rf, DecodeGroup dg) {
  NERVA_TRACE_KERNEL_AT(100000);  // trace_timeline.py: decode_group.cuh:100000
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  const int CS = (int)cl.num_blocks(), rank = (int)cl.block_rank();
  const int kvh = blockIdx.y, G = H / KVH, qkvOut = (H + 2 * KVH) * hd;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n8 = dg.hidden >> 3, n4 = dg.hidden >> 2, rpb = dg.rowsPerBlock;
  extern __shared__ uint4 dgSm[];
  const uint4* wS = dgSm;                                                // rpb rows of n8 chunks
  float4* xs = reinterpret_cast<float4*>(dgSm + (size_t)rpb * n8);       // float4 j at (j & 1) * n8 + (j >> 1)
  float* qkvS = reinterpret_cast<float*>(xs + n4);                       // qkvOut floats
  float* partS = qkvS + qkvOut;                                          // S * (hd + 2) floats
  double(*csS)[2] = reinterpret_cast<double(*)[2]>(partS + (size_t)S * (hd + 2) + ((S * (hd + 2)) & 1));
  unsigned long long* bar = reinterpret_cast<unsigned long long*>(csS + 64);
  __shared__ float ssw[DG_NORM_THREADS / 32];
  __shared__ float invS;

  // Before the dependency wait, nothing here depends on the kernel before: the block's weight rows
  // (bulk copies into shared memory, completing on `bar`), the rotary angles of the row's
  // position, and the first keys of the block's split pulled toward this SM (the keys before the
  // row's position were written by earlier steps).
  const int r0 = rank * rpb;
  const unsigned rowBytes = (unsigned)dg.hidden * 2u;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(dgSmem(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == 0) {
    if (lane == 0)
      asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(dgSmem(bar)),
                   "r"(rowBytes * (unsigned)rpb)
                   : "memory");
    __syncwarp();
    for (int t = lane; t < rpb; t += 32) {
      const uint16_t* src = dg.w + (size_t)dgRow(r0 + t, kvh, G, H, KVH, hd) * dg.hidden;
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       dgSmem(wS + (size_t)t * n8)),
                   "l"(src), "r"(rowBytes), "r"(dgSmem(bar))
                   : "memory");
    }
  }
  const int last = positions[0];
  if (threadIdx.x < 64) attnRopeAngle(last, rf.invFreq, threadIdx.x, csS[threadIdx.x]);
  {
    // The keys of split `rank` (attnPartial's chunking) into L1, the new key's excepted.
    const int chunk = max(minChunk, (last + S) / S);
    const int start = rank * chunk, end = min(start + chunk - 1, last - 1);
    const int* btr = bt + (size_t)rowSeq[0] * mbps;
    const size_t width = (size_t)KVH * hd, rowB = (size_t)hd * sizeof(KT);
    const int lines = (int)((rowB + 127) / 128);
    for (int i = threadIdx.x; i < (end - start + 1) * lines * 2; i += blockDim.x) {
      const int p = start + i / (2 * lines), l = (i / 2) % lines;
      const int e = btr[p / bs];
      if (e < 0) continue;
      const size_t slot = (size_t)e * bs + p % bs;
      const KT* base = (i & 1 ? vc : kc) + slot * width + (size_t)kvh * hd;
      asm volatile("prefetch.L1 [%0];" ::"l"(reinterpret_cast<const char*>(base) + l * 128));
    }
    // The q and k norms' weights, which the rope reads after the wait.
    const int nb = rf.ndt == NV_BF16 ? 2 : 4;
    if (threadIdx.x < 2 * ((hd * nb + 127) / 128)) {
      const int l = threadIdx.x >> 1;
      const void* nwp = threadIdx.x & 1 ? rf.kn : rf.qn;
      if (nwp) asm volatile("prefetch.L1 [%0];" ::"l"(reinterpret_cast<const char*>(nwp) + l * 128));
    }
  }
  // The qkv phase, run where the first head's attnPartial takes its dependency wait (its first
  // keys and their block-table entries already in flight), or after it where this block has no
  // live split: the wait, RMSNorm, the block's rows, and their hand-over.
  bool qkvDone = false;
  auto qkvPhase = [&]() {
    if (qkvDone) return;
    qkvDone = true;
    pdlWait();

    // RMSNorm of the row into xs, the sums of squares as k_gemv_bf16's 512 threads take them:
    // virtual thread v sums float4s v, v + 512, ...; its warp's sum lands in ssw[v / 32]; the 16
    // are added in order.
    const float4* xr = reinterpret_cast<const float4*>(dg.x);
    for (int v0 = 0; v0 < DG_NORM_THREADS; v0 += blockDim.x) {
      const int v = v0 + (int)threadIdx.x;
      float ss = 0.f;
      for (int j = v; j < n4; j += DG_NORM_THREADS) {
        float4 x4 = __ldcg(xr + j);
        ss += x4.x * x4.x + x4.y * x4.y + x4.z * x4.z + x4.w * x4.w;
        xs[(j & 1) * n8 + (j >> 1)] = x4;
      }
      ss = warpSum(ss);
      if (lane == 0) ssw[v >> 5] = ss;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = 0.f;
      for (int j = 0; j < DG_NORM_THREADS / 32; j++) t += ssw[j];
      invS = rsqrtf(t / (float)dg.hidden + dg.eps);
    }
    __syncthreads();
    const float inv = invS;
    for (int j = threadIdx.x; j < n4; j += blockDim.x) normScale4g(xs[(j & 1) * n8 + (j >> 1)], inv, loadNw4(dg.nw, dg.nwbf, j), 0);
    DG_MARK(1);
    {
      unsigned done = 0;
      while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(dgSmem(bar))
                     : "memory");
    }
    __syncthreads();
    DG_MARK(2);

    // A warp a row, as k_gemv_bf16<1, 1>: lane chunks lane, lane + 32, ... ascending; every block of
    // the cluster gets the value (lanes < CS write one block each).
    for (int t = warp; t < rpb; t += blockDim.x >> 5) {
      const uint4* wr = wS + (size_t)t * n8;
      float acc = 0.f;
      for (int k = lane; k < n8; k += 32) {
        const float4 a = xs[k], b = xs[n8 + k];
        const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        acc += dot8bf16(wr[k], xv);
      }
      acc = warpSum(acc);
      const int row = dgRow(r0 + t, kvh, G, H, KVH, hd);
      const float bo = dg.bias ? ldf(dg.bias, dg.bdt, row) : 0.f;
      const float y = acc + bo;
      for (int b = lane; b < CS; b += 32) *cl.map_shared_rank(qkvS + row, b) = y;
    }
    cl.sync();  // every block holds the group's q, k and v rows
    DG_MARK(3);
    // Only now the next kernels (o, then gate_up) start streaming their weights: released at the
    // wait they took the memory from this kernel's own weight copies (traced, session 22).
    pdlTrigger();
  };

  // The group's heads, each over the splits rank, rank + CS, ...; head g's partials go to block
  // g's shared memory (attnPartial writes partial s of head h at part + (h * S + s) * (hd + 2)).
  const size_t stride = (size_t)hd + 2;
  RopeFuse rfl = rf;
  rfl.cs = csS;
  for (int g = 0; g < G; g++) {
    const int h = kvh * G + g;
    float* part = cl.map_shared_rank(partS, g % CS) - (size_t)h * S * stride;
    if (g) __syncthreads();  // attnPartial's shared arrays are free
    if (g == 0)
      attnPartial<KT, ATT_WARPS, 4, true, true, true>(qkvS, kc, vc, bt, rowSeq, positions, part, H, KVH, hd, bs, mbps, qkvOut,
                                                      0, scale, minChunk, S, 0, out, nullptr, 1, rfl, 0, nullptr, 0,
                                                      AttnCoord{rank, CS, h, 0}, qkvPhase);
    else
      attnPartial<KT, ATT_WARPS, 4, true, true, true>(qkvS, kc, vc, bt, rowSeq, positions, part, H, KVH, hd, bs, mbps, qkvOut,
                                                      0, scale, minChunk, S, 0, out, nullptr, 1, rfl, 0, nullptr, 0,
                                                      AttnCoord{rank, CS, h, 0});
    qkvPhase();  // (a block without a live split of head 0)
    DG_MARK(4 + (g > 0));
  }
  cl.sync();  // every partial is in place; no block touches another's shared memory after this
  DG_MARK(6);
  const int chunk = max(minChunk, (last + S) / S);
  const int nAct = last / chunk + 1;
  for (int g = rank; g < G; g += CS) attnMergeHead<true>(partS, stride, out, 0, kvh * G + g, H, hd, nAct, nullptr, nullptr, 0);
}

// NERVA_DECODE_GROUP: 0 keeps one-row decode's qkv projection and attention two kernels; 8 or 16
// forces that cluster size; unset: 16 where the GPU can hold such clusters, else 8.
int decodeGroupSetting() {
  static const int v = [] {
    const char* e = getenv("NERVA_DECODE_GROUP");
    if (!e || !*e) return -1;
    return atoi(e);
  }();
  return v;
}

template <typename KT>
int decodeGroupLaunch(NervaExec* ex, int CS, bool probe, int* clusters, dim3 grid, size_t smem, const KT* kc, const KT* vc,
                      const int* bt, const int* rowSeq, const int* pos, float* out, int H, int KVH, int hd, int bs, int mbps,
                      float scale, int minChunk, int S, const RopeFuse& rf, const DecodeGroup& dg) {
  auto fn = k_decode_group<KT>;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(DG_THREADS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ex->stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)CS;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (ex->pdl) {
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.numAttrs = 2;
  }
  if (probe) {
    // Whether clusters of CS such blocks fit the GPU at all (the attributes are per kernel; the
    // dynamic shared memory allowed is what the static part leaves of the opt-in limit).
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, fn) != cudaSuccess || smem + fa.sharedSizeBytes > (size_t)ex->smemOptin ||
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, ex->smemOptin - (int)fa.sharedSizeBytes) != cudaSuccess ||
        cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess ||
        cudaOccupancyMaxActiveClusters(clusters, fn, &cfg) != cudaSuccess) {
      cudaGetLastError();
      *clusters = 0;
    }
    return NERVA_OK;
  }
  return check(ex, "k_decode_group", cudaLaunchKernelEx(&cfg, fn, kc, vc, bt, rowSeq, pos, out, H, KVH, hd, bs, mbps, scale,
                                                       minChunk, S, rf, dg));
}

// One decode row of op decoder_layers with qkv and the attention as a decode group, where it
// applies: exact numerics, bf16 qkv weights, headDim 128 with the fused rope, an f32 or bf16
// cache, a group's rows dividing evenly over a cluster and fitting shared memory. Otherwise it
// launches nothing and leaves *done false: the caller runs the qkv GEMV and attentionRun.
// A forced cluster size (NERVA_DECODE_GROUP=8|16) that cannot run says so once on stderr.
void decodeGroupDeclined(const char* why, long long a = 0, long long b = 0) {
  static bool said = false;
  if (said || decodeGroupSetting() <= 0) return;
  said = true;
  fprintf(stderr, "nerva: NERVA_DECODE_GROUP=%d not used: %s (%lld, %lld)\n", decodeGroupSetting(), why, a, b);
}

int decodeGroupRun(NervaExec* ex, const DecodeGroup& dg0, Buf qkvW, Buf kc, Buf vc, float* out, Buf bt, Buf rowSeq, Buf pos,
                   int H, int KVH, int hd, int bs, int mbps, float scale, const RopeFuse& rf, bool* done) {
  *done = false;
  const int setting = decodeGroupSetting();
  if (setting == 0) return NERVA_OK;
  if (ex->bf16act || hd != 128 || KVH <= 0 || H % KVH != 0 || kc.dt != vc.dt || (kc.dt != NV_F32 && kc.dt != NV_BF16)) {
    decodeGroupDeclined("numerics, head size or cache", hd, kc.dt);
    return NERVA_OK;
  }
  if (qkvW.dt != NV_BF16 || dg0.hidden <= 0 || dg0.hidden % 8 != 0 || ((uintptr_t)qkvW.p & 15) || ((uintptr_t)dg0.x & 15)) {
    decodeGroupDeclined("qkv weights not bf16 or unaligned", qkvW.dt, dg0.hidden);
    return NERVA_OK;
  }
  // The rows as k_gemv_bf16<1, 1, NORM> computes them (one warp an output, the norm staged by
  // 512 threads): gemvRows' choice for one row of this shape.
  const int qkvOut = (H + 2 * KVH) * hd;
  const bool gemvSplit = (size_t)qkvOut < (size_t)ex->smCount * 16 && dg0.hidden >= 1024;
  if (gemvSplit || (size_t)dg0.hidden * sizeof(float) > 48 * 1024) {
    decodeGroupDeclined("the qkv GEMV splits its rows", qkvOut, dg0.hidden);
    return NERVA_OK;
  }
  const bool f32 = kc.dt == NV_F32;
  const int resident = f32 ? attnResident<float>(true, hd, true) : attnResident<uint16_t>(true, hd, true);
  const long long S = attnSplitCount(ex, resident, 1, H, (long long)mbps * bs, false);
  if (S > DG_MAX_SPLITS) {
    decodeGroupDeclined("too many splits", S, DG_MAX_SPLITS);
    return NERVA_OK;
  }
  const int G = H / KVH, rowsG = (G + 2) * hd;
  // Cluster sizes to try: the setting's, else 16 then 8.
  const int sizes[2] = {setting > 0 ? setting : 16, setting > 0 ? 0 : 8};
  for (int CS : sizes) {
    if (CS <= 0 || rowsG % CS != 0 || G > CS) continue;
    DecodeGroup dg = dg0;
#ifdef NERVA_TRACE
    if (const char* m = getenv("NERVA_DG_MARK")) dg.markAt = atoi(m);
#endif
    dg.w = (const uint16_t*)qkvW.p;
    dg.rowsPerBlock = rowsG / CS;
    const size_t smem = (size_t)dg.rowsPerBlock * dg.hidden * 2 + (size_t)dg.hidden * 4 + (size_t)qkvOut * 4 +
                        ((size_t)S * (hd + 2) + 1) * 4 + 64 * 16 + 16;
    if (smem > (size_t)ex->smemOptin) {
      decodeGroupDeclined("shared memory", (long long)smem, ex->smemOptin);
      continue;
    }
    // Occupancy, once per (cache dtype, cluster size, shared memory).
    static std::vector<std::pair<long long, int>> fits;
    const long long key = ((long long)smem << 8) | (CS << 1) | (f32 ? 1 : 0);
    int clusters = -1;
    for (auto& f : fits)
      if (f.first == key) clusters = f.second;
    dim3 grid((unsigned)CS, (unsigned)KVH);
    if (clusters < 0) {
      int rc = f32 ? decodeGroupLaunch<float>(ex, CS, true, &clusters, grid, smem, nullptr, nullptr, nullptr, nullptr, nullptr,
                                              nullptr, H, KVH, hd, bs, mbps, scale, 0, 0, rf, dg)
                   : decodeGroupLaunch<uint16_t>(ex, CS, true, &clusters, grid, smem, nullptr, nullptr, nullptr, nullptr,
                                                 nullptr, nullptr, H, KVH, hd, bs, mbps, scale, 0, 0, rf, dg);
      if (rc) return rc;
      fits.emplace_back(key, clusters);
    }
    // Every KV head's cluster at once when no setting forces the size (else at least one).
    if (clusters < (setting > 0 ? 1 : KVH)) {
      decodeGroupDeclined("clusters that fit the GPU at once, KV heads", clusters, KVH);
      continue;
    }
    const int minChunk = attnTune().minChunk;
    const int *btp = (const int*)bt.p, *rsp = (const int*)rowSeq.p, *pp = (const int*)pos.p;
    int rc = f32 ? decodeGroupLaunch<float>(ex, CS, false, nullptr, grid, smem, (const float*)kc.p, (const float*)vc.p, btp, rsp,
                                            pp, out, H, KVH, hd, bs, mbps, scale, minChunk, (int)S, rf, dg)
                 : decodeGroupLaunch<uint16_t>(ex, CS, false, nullptr, grid, smem, (const uint16_t*)kc.p, (const uint16_t*)vc.p,
                                               btp, rsp, pp, out, H, KVH, hd, bs, mbps, scale, minChunk, (int)S, rf, dg);
    if (rc) return rc;
    *done = true;
    return NERVA_OK;
  }
  return NERVA_OK;
}
