// Decode attention for batches of many rows (included by kernels.cu after attnArrive). One block
// per (split, KV head, row) serves the G q heads that share the KV head, so every key and value
// row is read once for all of them (the split-KV kernel reads it once per q head). Tiles of 32
// keys are copied from the paged cache with cp.async, 16 bytes a copy, into a double buffer while
// the previous tile is used; the block's four warps then score the tile for every head, run the
// online softmax (warp w owns heads w and w + 4), and each thread accumulates one output column
// of every head. Partials go through attnArrive like the split-KV kernel's: the last live split
// of a (row, head) merges them. headDim 128, exact numerics, f32 or bf16 caches, no window.

constexpr int DG_KEYS = 32;
constexpr int DG_HD = 128;

template <typename KT>
__host__ __device__ constexpr int dgRowElems() {
  return DG_HD + (sizeof(KT) == 4 ? 4 : 8);  // padded rows: score reads fall in distinct banks
}
template <typename KT>
constexpr size_t dgSmemBytes() {
  return (size_t)2 /*stages*/ * 2 /*K, V*/ * DG_KEYS * dgRowElems<KT>() * sizeof(KT);
}

__device__ __forceinline__ float dgLoad(const float* p) { return *p; }
__device__ __forceinline__ float dgLoad(const uint16_t* p) { return bf2f(*p); }

template <typename KT, int G>
__global__ void __launch_bounds__(128) k_attn_decode_gqa(const float* q, const KT* kc, const KT* vc, const int* bt,
                                                        const int* rowSeq, const int* positions, float* part, int H,
                                                        int KVH, int bs, int mbps, int qStride, int qOff, float scale,
                                                        int S, int rowBase, float* out, int* counters, int minChunk,
                                                        uint16_t* outHi, size_t loOff) {
  constexpr int LD = dgRowElems<KT>();
  constexpr int TILE = DG_KEYS * LD;  // elements of one K (or V) tile
  constexpr int CPR = DG_HD * (int)sizeof(KT) / 16;  // 16-byte copies per key row
  extern __shared__ __align__(16) unsigned char dgsm[];
  KT* const buf = (KT*)dgsm;  // stage st: K at buf + 2 st TILE, V after it
  __shared__ float qs[G][DG_HD];
  __shared__ float sc[G][DG_KEYS];
  __shared__ float corr[G];
  __shared__ float mFin[G], lFin[G];
  __shared__ long long slot[2][DG_KEYS];

  NERVA_TRACE_KERNEL_AT(200000);  // trace_timeline.py: attn_decode_gqa.cuh:200000
  PDL_ENTER();  // q and the new key were written by rope_append, the kernel before
  const int s = blockIdx.x, kvh = blockIdx.y, rl = blockIdx.z, r = rowBase + rl;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int last = positions[r];
  const int chunk = max(minChunk, (last + S) / S);
  const int nAct = last / chunk + 1;
  const int start = s * chunk;
  const size_t stride = (size_t)DG_HD + 2;
  if (start > last) {
    if (!counters && tid < G) {
      float* dst = part + (((size_t)rl * H + kvh * G + tid) * S + s) * stride;
      dst[0] = -INFINITY;
      dst[1] = 0.f;
    }
    return;
  }
  const int end = min(start + chunk - 1, last);
  const int* btr = bt + (size_t)rowSeq[r] * mbps;
  const size_t width = (size_t)KVH * DG_HD;
  for (int i = tid; i < G * DG_HD; i += 128) {
    const int g = i / DG_HD, d = i % DG_HD;
    qs[g][d] = q[(size_t)r * qStride + qOff + (size_t)(kvh * G + g) * DG_HD + d] * scale;
  }
  auto slotsFor = [&](int k0, long long* sl) {
    if (tid < DG_KEYS) {
      const int p = k0 + tid;
      long long v = -1;
      if (p <= end) {
        const int e = btr[p / bs];
        if (e >= 0) v = (long long)e * bs + p % bs;
      }
      sl[tid] = v;
    }
  };
  auto issue = [&](const long long* sl, int st) {
    KT* kd = buf + (size_t)st * 2 * TILE;
    KT* vd = kd + TILE;
    for (int i = tid; i < DG_KEYS * CPR; i += 128) {
      const int j = i / CPR, c = i % CPR;
      const long long sv = sl[j];
      const size_t off = (size_t)max(sv, 0ll) * width + (size_t)kvh * DG_HD;
      const int e = c * (16 / (int)sizeof(KT));
      pfCopy16(kd + j * LD + e, kc + off + e, sv >= 0);
      pfCopy16(vd + j * LD + e, vc + off + e, sv >= 0);
    }
  };
  float acc[G];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // heads warp and warp + 4 (warp-uniform)
#pragma unroll
  for (int g = 0; g < G; g++) acc[g] = 0.f;
  slotsFor(start, slot[0]);
  __syncthreads();  // slots and q
  issue(slot[0], 0);
  pfCommit();
  const int key = tid >> 2, qtr = tid & 3;  // scoring: 4 threads per key, dims qtr, qtr + 4, ...
  for (int k0 = start, it = 0; k0 <= end; k0 += DG_KEYS, it++) {
    const int cur = it & 1;
    if (k0 + DG_KEYS <= end) {
      slotsFor(k0 + DG_KEYS, slot[cur ^ 1]);
      __syncthreads();
      issue(slot[cur ^ 1], cur ^ 1);
    }
    pfCommit();
    pfWaitPrev();
    __syncthreads();
    const KT* K = buf + (size_t)cur * 2 * TILE;
    const KT* V = K + TILE;
    // Scores of this thread's key over its quarter of the dims, for every head.
    float d[G];
#pragma unroll
    for (int g = 0; g < G; g++) d[g] = 0.f;
#pragma unroll 8
    for (int i = 0; i < DG_HD / 4; i++) {
      const int dim = i * 4 + qtr;
      const float kv = dgLoad(K + key * LD + dim);
#pragma unroll
      for (int g = 0; g < G; g++) d[g] += qs[g][dim] * kv;
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
      d[g] += __shfl_xor_sync(0xffffffffu, d[g], 1);
      d[g] += __shfl_xor_sync(0xffffffffu, d[g], 2);
    }
    if (qtr == 0) {
      const bool ok = slot[cur][key] >= 0;  // also false past `end`
#pragma unroll
      for (int g = 0; g < G; g++) sc[g][key] = ok ? d[g] : -INFINITY;
    }
    __syncthreads();
    // Online softmax: warp w takes heads w and w + 4, one key per lane.
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int g = warp + 4 * hh;
      if (g >= G) break;
      const float x = sc[g][lane];
      float mx = x;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float mn = fmaxf(m[hh], mx);
      const float base = mn == -INFINITY ? 0.f : mn;
      const float p = expf(x - base);
      float sum = p;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      const float c = expf(m[hh] - base);
      l[hh] = l[hh] * c + sum;
      m[hh] = mn;
      sc[g][lane] = p;
      if (lane == 0) corr[g] = c;
    }
    __syncthreads();
    // out[., tid] += sum_k p[g][k] v[k][tid]
#pragma unroll
    for (int g = 0; g < G; g++) acc[g] *= corr[g];
#pragma unroll 8
    for (int k = 0; k < DG_KEYS; k++) {
      const float v = dgLoad(V + k * LD + tid);
#pragma unroll
      for (int g = 0; g < G; g++) acc[g] += sc[g][k] * v;
    }
    __syncthreads();  // this stage and sc are reused
  }
  if (lane == 0) {
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int g = warp + 4 * hh;
      if (g < G) {
        mFin[g] = m[hh];
        lFin[g] = l[hh];
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int g = 0; g < G; g++) {
    float* dst = part + (((size_t)rl * H + kvh * G + g) * S + s) * stride;
    dst[2 + tid] = acc[g];
    if (tid == 0) {
      dst[0] = mFin[g];
      dst[1] = lFin[g];
    }
  }
  if (counters)
    for (int g = 0; g < G; g++) attnArrive(part, out, counters, rl, r, kvh * G + g, H, DG_HD, S, nAct, nullptr, outHi, loOff);
}
