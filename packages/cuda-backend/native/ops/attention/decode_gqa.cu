// Decode attention for batches of many rows (k_attn_decode_gqa). One block
// per (split, KV head, row) serves the G q heads that share the KV head, so every key and value
// row is read once for all of them (the split-KV kernel reads it once per q head). Tiles of 32
// keys are copied from the paged cache with cp.async, 16 bytes a copy, into a double buffer while
// the previous tile is used; the block's four warps then score the tile for every head, run the
// online softmax (warp w owns heads w and w + 4), and each thread accumulates one output column
// of every head. Partials go through attnArriveGroup (the split-KV kernel's attnArrive, one count
// for the G heads): the last live split of a (row, KV head) merges them. headDim 128, exact
// numerics, f32 or bf16 caches, no window.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/attention/attn_common.cuh"
#include "ops/ops.h"

namespace nerva::ops {

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
static_assert(sizeof(AttnWideScratch) <= dgSmemBytes<uint16_t>(), "attnArrive's merge borrows the tile buffer");
// Blocks an SM of the bf16-cache kernels (registers and shared memory sized for it): a 32-row
// batch-invariant step's grid of 3 splits x 8 KV heads x 32 rows is 768 blocks, one wave at six
// blocks on 132 SMs; at five (91 registers, a static q and merge scratch) 108 blocks ran in a
// second wave. H200, 32 forks: 0.6B step 2.636-2.639 against 2.659-2.660 ms, 8B equal (7.53).
constexpr int DG_BLOCKS_PER_SM = 6;

// What both forms of the kernel (k_attn_decode_gqa, k_attn_decode_gqa_tc) take the same way from
// their launch: split s's keys [start, end] of row r (chunk keys a split, nAct live splits) and
// where its pages lie; slots() and issue() stage a 32-key tile of K and V.
struct DgBlock {
  int s, kvh, rl, r;  // split, KV head, row of the launch, row
  int start, end, nAct;
  const int* btr;
  size_t width;
  int bs, tid;
  // Split s's partial of q head kvh G + g: m, l, then DG_HD sums.
  template <int G>
  __device__ __forceinline__ float* partial(float* part, int H, int S, int g) const {
    return part + (((size_t)rl * H + kvh * G + g) * S + s) * ((size_t)DG_HD + 2);
  }
  // The split's partials of its G heads counted once (attnArriveGroup): the last live split of
  // the KV head merges every head's. wide: the merge's shared memory, the tile buffer's (every
  // copy into it landed and was read).
  template <int G>
  __device__ __forceinline__ void arrive(float* part, float* out, int* counters, int H, int S, AttnWideScratch& wide,
                                         uint16_t* outHi, size_t loOff) const {
    if (!counters) return;
    attnArriveGroup(part, out, counters, rl, r, kvh * G, G, H, DG_HD, S, nAct, nullptr, wide, outHi, loOff);
  }
  // Where keys k0 .. k0 + 31 of this KV head start in the cache, in elements (-1 past `end` or in
  // a missing block): the address math done once a key here, not once a 16-byte copy in issue().
  __device__ __forceinline__ void slots(int k0, long long* sl) const {
    if (tid < DG_KEYS) {
      const int p = k0 + tid;
      long long v = -1;
      if (p <= end) {
        const int e = btr[p / bs];
        if (e >= 0) v = ((long long)e * bs + p % bs) * (long long)width + (long long)kvh * DG_HD;
      }
      sl[tid] = v;
    }
  }
  // The tile's K rows to kd and V rows to kd + DG_KEYS LD, 16 bytes a cp.async (zeros where the
  // offset is -1): each thread copies one 16-byte column c of every RPI-th key row.
  template <typename KT, int LD>
  __device__ __forceinline__ void issue(const long long* sl, KT* kd, const KT* kc, const KT* vc) const {
    constexpr int CPR = DG_HD * (int)sizeof(KT) / 16;  // 16-byte copies per key row
    constexpr int RPI = 128 / CPR;                       // key rows a pass of the block's threads
    constexpr int EPC = 16 / (int)sizeof(KT);            // elements a copy
    KT* vd = kd + DG_KEYS * LD;
    const int e = tid % CPR * EPC, j0 = tid / CPR;
#pragma unroll
    for (int it = 0; it < DG_KEYS / RPI; it++) {
      const int j = j0 + it * RPI;
      const long long off = sl[j];
      const bool ok = off >= 0;
      const size_t o = (size_t)(ok ? off : 0ll) + (size_t)e;
      pfCopy16(kd + j * LD + e, kc + o, ok);
      pfCopy16(vd + j * LD + e, vc + o, ok);
    }
  }
  // The tile loop's pipeline at tile k0, iteration it (stage it & 1, `buf` holding both stages):
  // the next tile's slots and copies go to the other stage, then this tile's copies are waited
  // for. Returns this tile's stage.
  template <typename KT, int LD>
  __device__ __forceinline__ int advance(int k0, int it, long long (*sl)[DG_KEYS], KT* buf, const KT* kc, const KT* vc) const {
    const int cur = it & 1;
    if (k0 + DG_KEYS <= end) {
      slots(k0 + DG_KEYS, sl[cur ^ 1]);
      __syncthreads();
      issue<KT, LD>(sl[cur ^ 1], buf + (size_t)(cur ^ 1) * 2 * DG_KEYS * LD, kc, vc);
    }
    pfCommit();
    pfWaitPrev();
    __syncthreads();
    return cur;
  }
};

// The block's DgBlock, and its G q heads (times scale) in qs. False when split s starts past the
// row's last key: its partials then say "empty" (where no counters merge, which count only live
// splits), and the block has nothing more to do.
template <int G>
__device__ __forceinline__ bool dgBegin(DgBlock& b, float (*qs)[DG_HD], const float* q, const int* bt, const int* rowSeq,
                                        const int* positions, float* part, int H, int KVH, int bs, int mbps, int qStride,
                                        int qOff, float scale, int S, int rowBase, const int* counters, int minChunk) {
  const int s = blockIdx.x, kvh = blockIdx.y, rl = blockIdx.z, r = rowBase + rl, tid = threadIdx.x;
  b.s = s;
  b.kvh = kvh;
  b.rl = rl;
  b.r = r;
  const int last = positions[r];
  const int chunk = max(minChunk, (last + S) / S);
  b.nAct = last / chunk + 1;
  b.start = s * chunk;
  if (b.start > last) {
    if (!counters && tid < G) {
      float* dst = b.partial<G>(part, H, S, tid);
      dst[0] = -INFINITY;
      dst[1] = 0.f;
    }
    return false;
  }
  b.end = min(b.start + chunk - 1, last);
  b.btr = bt + (size_t)rowSeq[r] * mbps;
  b.width = (size_t)KVH * DG_HD;
  b.bs = bs;
  b.tid = tid;
  for (int i = tid; i < G * DG_HD; i += 128) {
    const int g = i / DG_HD, d = i % DG_HD;
    qs[g][d] = q[(size_t)r * qStride + qOff + (size_t)(kvh * G + g) * DG_HD + d] * scale;
  }
  return true;
}

// The online softmax of one tile, the same in both kernels: sc[g][k] holds the scores of the
// tile's keys for head g and gets their probabilities; warp w takes heads w and w + 4, one key a
// lane; m and l are those heads' running max and sum, corr[g] the factor the head's output so far
// is scaled by.
template <int G>
__device__ __forceinline__ void dgSoftmaxTile(float (*sc)[DG_KEYS], float* corr, float* m, float* l, int warp, int lane) {
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
}

// The split's final (m, l) of each head, from the warp that ran its softmax (heads warp and
// warp + 4) to mFin / lFin, for the threads that write the partials.
template <int G>
__device__ __forceinline__ void dgPublishStats(const float* m, const float* l, float* mFin, float* lFin, int warp, int lane) {
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
}

__device__ __forceinline__ float dgLoad(const float* p) { return *p; }
__device__ __forceinline__ float dgLoad(const uint16_t* p) { return bf2f(*p); }

template <typename KT, int G>
__global__ void __launch_bounds__(128, sizeof(KT) == 2 ? DG_BLOCKS_PER_SM : 1) k_attn_decode_gqa(const float* q, const KT* kc, const KT* vc, const int* bt,
                                                        const int* rowSeq, const int* positions, float* part, int H,
                                                        int KVH, int bs, int mbps, int qStride, int qOff, float scale,
                                                        int S, int rowBase, float* out, int* counters, int minChunk,
                                                        uint16_t* outHi, size_t loOff) {
  constexpr int LD = dgRowElems<KT>();
  constexpr int TILE = DG_KEYS * LD;  // elements of one K (or V) tile
  extern __shared__ __align__(16) unsigned char dgsm[];
  KT* const buf = (KT*)dgsm;  // stage st: K at buf + 2 st TILE, V after it
  __shared__ float qs[G][DG_HD];
  __shared__ float sc[G][DG_KEYS];
  __shared__ float corr[G];
  __shared__ float mFin[G], lFin[G];
  __shared__ long long slot[2][DG_KEYS];

  NERVA_TRACE_KERNEL_AT(200000);  // trace_timeline.py: decode_gqa.cu:200000
  PDL_ENTER();  // q and the new key were written by rope_append, the kernel before
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  DgBlock blk;
  if (!dgBegin<G>(blk, qs, q, bt, rowSeq, positions, part, H, KVH, bs, mbps, qStride, qOff, scale, S, rowBase, counters,
                  minChunk))
    return;
  const int start = blk.start, end = blk.end;
  float acc[G];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // heads warp and warp + 4 (warp-uniform)
#pragma unroll
  for (int g = 0; g < G; g++) acc[g] = 0.f;
  blk.slots(start, slot[0]);
  __syncthreads();  // slots and q
  blk.issue<KT, LD>(slot[0], buf, kc, vc);
  pfCommit();
  const int key = tid >> 2, qtr = tid & 3;  // scoring: 4 threads per key, dims qtr, qtr + 4, ...
  for (int k0 = start, it = 0; k0 <= end; k0 += DG_KEYS, it++) {
    const int cur = blk.advance<KT, LD>(k0, it, slot, buf, kc, vc);
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
    dgSoftmaxTile<G>(sc, corr, m, l, warp, lane);
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
  dgPublishStats<G>(m, l, mFin, lFin, warp, lane);
#pragma unroll
  for (int g = 0; g < G; g++) {
    float* dst = blk.partial<G>(part, H, S, g);
    dst[2 + tid] = acc[g];
    if (tid == 0) {
      dst[0] = mFin[g];
      dst[1] = lFin[g];
    }
  }
  blk.arrive<G>(part, out, counters, H, S, *reinterpret_cast<AttnWideScratch*>(dgsm), outHi, loOff);
}

// k_attn_decode_gqa for bf16 caches on the tensor cores. The same blocks, splits, tiles and online
// softmax; the two products are bf16 mma.sync m16n8k16 with float32 accumulation, the float32
// operand (q, then the probabilities) split as hi + lo in bf16 (pa2Split: ~16 bits of its
// mantissa, the exact numerics' split-bf16 grade, as k_attn_prefill2 and the GEMMs take it; one
// cvt for two values where the software rounding before it took ~50 instructions a pair). The
// MMA's 16 rows are the hi (row g) and lo (row 8 + g) parts of the G heads, so a thread's
// accumulators hold both halves of its head and add them without a shuffle. Scores: warp w takes
// keys 8w..8w+7 over all 128 dims (K through ldmatrix); output: warp w takes dims 32w..32w+31
// (V through ldmatrix.trans). The CUDA-core form spent ~575 instructions a warp on a 32-key tile
// (shared-memory operands for every FMA); this one ~150. (f32 caches keep the CUDA-core form:
// their keys and values would need splitting too.)
template <int G>
__global__ void __launch_bounds__(128, DG_BLOCKS_PER_SM) k_attn_decode_gqa_tc(const float* q, const uint16_t* kc, const uint16_t* vc,
                                                           const int* bt, const int* rowSeq, const int* positions,
                                                           float* part, int H, int KVH, int bs, int mbps, int qStride,
                                                           int qOff, float scale, int S, int rowBase, float* out,
                                                           int* counters, int minChunk, uint16_t* outHi, size_t loOff) {
  static_assert(G >= 1 && G <= 8, "the MMA's 16 rows hold hi and lo of at most 8 heads");
  constexpr int LD = DG_HD + 8;  // padded rows: ldmatrix's eight row addresses fall in distinct banks
  constexpr int TILE = DG_KEYS * LD;
  extern __shared__ __align__(16) unsigned char dgsm[];
  uint16_t* const buf = (uint16_t*)dgsm;  // stage st: K at buf + 2 st TILE, V after it
  // q (times scale) lies in stage 1 until its fragments are in registers: the first copy into
  // stage 1 comes after the loop's first barrier.
  float(*const qs)[DG_HD] = reinterpret_cast<float(*)[DG_HD]>(buf + 2 * TILE);
  static_assert(G * DG_HD * sizeof(float) <= 2 * TILE * sizeof(uint16_t), "q fits a stage");
  __shared__ __align__(16) float sc[G][DG_KEYS];
  __shared__ float corr[G];
  __shared__ float mFin[G], lFin[G];
  __shared__ long long slot[2][DG_KEYS];

  NERVA_TRACE_KERNEL();
  PDL_ENTER();  // q and the new key were written by rope_append, the kernel before
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gq = lane >> 2, cq = (lane & 3) * 2;  // the MMA fragments' row group and column pair
  DgBlock blk;
  if (!dgBegin<G>(blk, qs, q, bt, rowSeq, positions, part, H, KVH, bs, mbps, qStride, qOff, scale, S, rowBase, counters,
                  minChunk))
    return;
  const int start = blk.start, end = blk.end;
  blk.slots(start, slot[0]);
  __syncthreads();  // slots and q
  blk.issue<uint16_t, LD>(slot[0], buf, kc, vc);
  pfCommit();
  // q as A fragments for the 8 k-steps of 16 dims: rows gq (hi) and 8 + gq (lo) of head gq.
  uint32_t qa[DG_HD / 16][4];
#pragma unroll
  for (int ks = 0; ks < DG_HD / 16; ks++) {
    const int d = ks * 16 + cq;
    if (gq < G) {
      pa2Split(qs[gq][d], qs[gq][d + 1], qa[ks][0], qa[ks][1]);
      pa2Split(qs[gq][d + 8], qs[gq][d + 9], qa[ks][2], qa[ks][3]);
    } else {
      qa[ks][0] = qa[ks][1] = qa[ks][2] = qa[ks][3] = 0u;
    }
  }
  float acc[4][4];  // dims 32 warp + 8 nt + cq + {0, 1}: [0..1] hi rows, [2..3] lo rows of head gq
#pragma unroll
  for (int nt = 0; nt < 4; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // heads warp and warp + 4 (warp-uniform)
  for (int k0 = start, it = 0; k0 <= end; k0 += DG_KEYS, it++) {
    const int cur = blk.advance<uint16_t, LD>(k0, it, slot, buf, kc, vc);
    const uint16_t* K = buf + (size_t)cur * 2 * TILE;
    const uint16_t* V = K + TILE;
    // Scores of keys 8 warp .. 8 warp + 7 for every head: four ldmatrix of 32 dims, eight MMAs.
    float d4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kk = 0; kk < DG_HD / 32; kk++) {
      uint32_t b[4];
      pfLdsm4<false>(b, K + (8 * warp + (lane & 7)) * LD + kk * 32 + (lane >> 3) * 8);
      pfMma(d4, qa[2 * kk], b[0], b[1]);
      pfMma(d4, qa[2 * kk + 1], b[2], b[3]);
    }
    if (gq < G) {
      const int key = 8 * warp + cq;
      sc[gq][key] = slot[cur][key] >= 0 ? d4[0] + d4[2] : -INFINITY;  // (also -inf past `end`)
      sc[gq][key + 1] = slot[cur][key + 1] >= 0 ? d4[1] + d4[3] : -INFINITY;
    }
    __syncthreads();
    dgSoftmaxTile<G>(sc, corr, m, l, warp, lane);
    __syncthreads();
    // out[g][dims of this warp] = corr[g] out + P V: two k-steps of 16 keys, four n-tiles of 8 dims.
    if (gq < G) {
      const float c = corr[gq];
#pragma unroll
      for (int nt = 0; nt < 4; nt++) {
        acc[nt][0] *= c;
        acc[nt][1] *= c;
        acc[nt][2] *= c;
        acc[nt][3] *= c;
      }
    }
#pragma unroll
    for (int ks = 0; ks < DG_KEYS / 16; ks++) {
      uint32_t pa[4] = {0u, 0u, 0u, 0u};
      if (gq < G) {
        const float2 p0 = *reinterpret_cast<const float2*>(&sc[gq][16 * ks + cq]);
        const float2 p1 = *reinterpret_cast<const float2*>(&sc[gq][16 * ks + cq + 8]);
        pa2Split(p0.x, p0.y, pa[0], pa[1]);
        pa2Split(p1.x, p1.y, pa[2], pa[3]);
      }
      const int mtx = lane >> 3;  // ldmatrix.trans: keys (mtx & 1) * 8 + .., dims (mtx >> 1) * 8 + ..
#pragma unroll
      for (int np = 0; np < 2; np++) {
        uint32_t b[4];
        pfLdsm4<true>(b, V + (16 * ks + (mtx & 1) * 8 + (lane & 7)) * LD + 32 * warp + 16 * np + (mtx >> 1) * 8);
        pfMma(acc[2 * np], pa, b[0], b[1]);
        pfMma(acc[2 * np + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // this stage and sc are reused
  }
  dgPublishStats<G>(m, l, mFin, lFin, warp, lane);
  if (gq < G) {
    float* dst = blk.partial<G>(part, H, S, gq);
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
      const int d = 32 * warp + 8 * nt + cq;
      dst[2 + d] = acc[nt][0] + acc[nt][2];
      dst[3 + d] = acc[nt][1] + acc[nt][3];
    }
  }
  if (tid < G) {
    float* dst = blk.partial<G>(part, H, S, tid);
    dst[0] = mFin[tid];
    dst[1] = lFin[tid];
  }
  blk.arrive<G>(part, out, counters, H, S, *reinterpret_cast<AttnWideScratch*>(dgsm), outHi, loOff);
}

// Decode batches of at least this many rows run k_attn_decode_gqa, which reads each key once for
// the G q heads of its KV head (fewer rows: the split-KV kernel, which fills the GPU better).
constexpr int GQA_MIN_ROWS = 16;
// So do rows the caller promises at least this many keys (op decoder_layers' minKeys): there the
// split-KV kernel's blocks, one a q head, read each key G times through L2, and the GQA kernel is
// ahead. One 8B row on the H200, f32 KV, GQA against split-KV: 4000 keys 164.5 against 178.0
// tok/s, 6000 161.4 against 162.1, 8000 155.1 against 147.4, 11000 150.3 against 127.7, 16000
// 138.0 against 106.4 (0.6B: 8000 651 against 622, 16000 470 against 384).
constexpr int GQA_LONG_KEYS = 8192;

// Batch-invariant decode runs k_attn_decode_gqa at every row count, 1 included, with its splits
// sized as for one row (attnDecodeGqaRun): checked invariant at 2..64 rows on the H100, and
// faster there than the split-KV kernel for many rows.
bool attnDecodeGqaFits(const NervaExec* ex, int rows, int minKeys, int H, int KVH, int hd, int kdt, int vdt) {
  const int G = KVH > 0 && H % KVH == 0 ? H / KVH : 0;
  const bool shapes = hd == DG_HD && !ex->bf16act && kdt == vdt && (kdt == NV_F32 || kdt == NV_BF16) &&
                      (G == 1 || G == 2 || G == 4 || G == 8);
  // Batch-invariant decode: one kernel for every row count, chosen from the shapes alone.
  if (ex->batchInv) return shapes;
  return (rows >= GQA_MIN_ROWS || minKeys >= GQA_LONG_KEYS) && shapes;
}

// Many rows: every row's keys also go in splits of at most this many keys of the longest context,
// else a wide batch of long contexts runs one block per row and head over all its keys. On the
// H100 the 0.6B throughput workload went from 13136 to 13984 output tok/s with 512 (13733 with
// 256).
constexpr int GQA_MAX_KEYS = 512;

// Fewest keys a split of batch-invariant GQA decode attention takes. It fixes the bits of
// batch-invariant attention: larger chunks mean fewer partials to write and merge for a many-row
// batch, less parallelism for one row. On the H100 256 against 64 took the 0.6B throughput
// workload with --batch-invariant from 13176 to 14189 output tok/s.
constexpr int BI_ATTN_CHUNK = 256;

// Batch-invariant decode attention: rows a launch when S (a single row's splits) is fixed, so
// that every chunk's partials fit the workspace and merge through the counters (attnArrive),
// whatever the rows of the call: a row's merge path never depends on its neighbours.
int invRowChunk(const NervaExec* ex, int rows, int H, long long S, size_t perSplit) {
  size_t fit = ex->wsBytes / ((size_t)H * S * perSplit);
  if (ex->counters && (size_t)H <= ex->counterCount) fit = std::min(fit, ex->counterCount / (size_t)H);
  return (int)std::max<size_t>(1, std::min<size_t>((size_t)rows, fit));
}

template <typename KT, int G>
int attnDecodeGqaRun(NervaExec* ex, const float* q, Buf kc, Buf vc, float* out, Buf bt, Buf rowSeq, Buf pos, int rows,
                     int H, int KVH, int bs, int mbps, int qStride, int qOff, float scale, SplitHandoff* emit) {
  const long long maxLen = (long long)mbps * bs;
  const int minChunk = ex->batchInv ? BI_ATTN_CHUNK : 64;
  // Splits: about three blocks per SM in all, each at least minChunk keys. Batch-invariant
  // decode: as for one row whatever the rows (a row's key chunks and merge order fix its bits),
  // the rows in chunks the workspace and the combine counters cover, so every chunk merges the
  // same way (attnArrive) and S is never cut for the rows' sake.
  const bool inv = ex->batchInv;
  const long long sRows = inv ? 1 : rows;
  long long S = std::max<long long>(1, ((long long)ex->smCount * 3 + sRows * KVH - 1) / (sRows * KVH));
  // Many rows: at most GQA_MAX_KEYS keys a split.
  if (!inv) S = std::max<long long>(S, (maxLen + GQA_MAX_KEYS - 1) / GQA_MAX_KEYS);
  S = std::min<long long>(S, std::max<long long>(1, (maxLen + minChunk - 1) / minChunk));
  const size_t perSplit = (size_t)(DG_HD + 2) * sizeof(float);
  int rowChunk = rows;
  if (inv) rowChunk = invRowChunk(ex, rows, H, S, perSplit);
  while (rowChunk > 1 && (size_t)rowChunk * H * S * perSplit > ex->wsBytes) {
    if (S > 1) S = std::max<long long>(1, S / 2);
    else rowChunk = (rowChunk + 1) / 2;
  }
  if ((size_t)rowChunk * H * S * perSplit > ex->wsBytes) return bad(ex, "attention: workspace too small");
  constexpr size_t smem = dgSmemBytes<KT>();
  // bf16 caches of two or more query heads a KV head: k_attn_decode_gqa_tc. (With two, 4 of the
  // MMA's 16 rows hold heads; still, on the H200 a 32-row 0.6B step's attention took 37.2 us on
  // it against 44.4 on the CUDA-core kernel. One head: the CUDA-core kernel.)
  constexpr bool tc = sizeof(KT) == 2 && G >= 2;
  static_assert(!tc || dgRowElems<KT>() == DG_HD + 8, "k_attn_decode_gqa_tc's row stride");
  cudaError_t e = tc ? allowDynamicSmem(k_attn_decode_gqa_tc<G>, smem) : allowDynamicSmem(k_attn_decode_gqa<KT, G>, smem);
  // The most shared memory an SM has, so that DG_BLOCKS_PER_SM blocks fit it.
  if (e == cudaSuccess)
    e = tc ? allowKernelAttribute(k_attn_decode_gqa_tc<G>, cudaFuncAttributePreferredSharedMemoryCarveout, 100)
           : allowKernelAttribute(k_attn_decode_gqa<KT, G>, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  if (e != cudaSuccess) return check(ex, "k_attn_decode_gqa (shared memory opt-in)", e);
  float* part = (float*)ex->ws;
  // The output's bf16 split for the o projection's GEMM (emit), at the workspace's end: only where
  // the partials, as sized above, stay clear of it and every chunk merges through the counters.
  uint16_t* outHi = nullptr;
  size_t loOff = 0;
  if (emit) *emit = SplitHandoff();
  if (emit) {
    const bool lo = ex->gemmMode == GEMM_SPLIT_BF16 && !ex->bf16act;
    const size_t n = (size_t)rows * H * DG_HD, bytes = (lo ? 2 : 1) * n * sizeof(uint16_t);
    const size_t at = bytes < ex->wsBytes ? (ex->wsBytes - bytes) & ~(size_t)255 : 0;
    const bool counted = ex->counters && (size_t)rowChunk * H <= ex->counterCount;
    if (counted && at > 0 && (size_t)rowChunk * H * S * perSplit <= at) {
      outHi = (uint16_t*)(ex->ws + at);
      loOff = lo ? n : 0;
      *emit = SplitHandoff{outHi, rows, H * DG_HD, lo};
    }
  }
  for (int r0 = 0; r0 < rows; r0 += rowChunk) {
    const int nr = std::min(rowChunk, rows - r0);
    int* cnt = ex->counters && (size_t)nr * H <= ex->counterCount ? ex->counters : nullptr;
    if (tc)
      LAUNCH((k_attn_decode_gqa_tc<G>), dim3((unsigned)S, (unsigned)KVH, (unsigned)nr), 128, smem, q,
             (const uint16_t*)kc.p, (const uint16_t*)vc.p, (const int*)bt.p, (const int*)rowSeq.p, (const int*)pos.p, part,
             H, KVH, bs, mbps, qStride, qOff, scale, (int)S, r0, out, cnt, minChunk, outHi, loOff);
    else
      LAUNCH((k_attn_decode_gqa<KT, G>), dim3((unsigned)S, (unsigned)KVH, (unsigned)nr), 128, smem, q, (const KT*)kc.p,
             (const KT*)vc.p, (const int*)bt.p, (const int*)rowSeq.p, (const int*)pos.p, part, H, KVH, bs, mbps, qStride,
             qOff, scale, (int)S, r0, out, cnt, minChunk, outHi, loOff);
    if (!cnt) {
      int rc = launchAttnCombine(ex, DG_HD, nr, part, out, H, DG_HD, (int)S, r0, nullptr, nullptr);
      if (rc) return rc;
    }
  }
  return NERVA_OK;
}

int attnDecodeGqa(NervaExec* ex, const float* q, Buf kc, Buf vc, float* out, Buf bt, Buf rowSeq, Buf pos, int rows, int H,
                  int KVH, int bs, int mbps, int qStride, int qOff, float scale, SplitHandoff* emit) {
#define DG_RUN(KT, G) \
  return attnDecodeGqaRun<KT, G>(ex, q, kc, vc, out, bt, rowSeq, pos, rows, H, KVH, bs, mbps, qStride, qOff, scale, emit)
#define DG_G(KT)              \
  switch (H / KVH) {          \
    case 1: DG_RUN(KT, 1);    \
    case 2: DG_RUN(KT, 2);    \
    case 4: DG_RUN(KT, 4);    \
    default: DG_RUN(KT, 8);   \
  }
  if (kc.dt == NV_F32) {
    DG_G(float)
  }
  DG_G(uint16_t)
#undef DG_G
#undef DG_RUN
}

}  // namespace nerva::ops

int nerva_decode_long_keys(const NervaExec* ex) { return ex->bf16act || ex->batchInv ? 0 : nerva::ops::GQA_LONG_KEYS; }
