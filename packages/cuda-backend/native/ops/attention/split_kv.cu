// Split-KV paged attention (decode rows, prefill seams): partials per key split, merged by the
// last split to arrive or by k_attn_combine.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/attention/attn_common.cuh"
#include "ops/ops.h"

namespace nerva::ops {

#define ATT_PARTIAL_PARAMS                                                                                  \
  const float* q, const KT* kc, const KT* vc, const int* bt, const int* rowSeq, const int* positions,   \
      float* part, int H, int KVH, int hd, int bs, int mbps, int qStride, int qOff, float scale, int minChunk, int S, \
      int rowBase, float* out, int* counters, int decodeOnly, RopeFuse rf, int window, float* lse, const unsigned char* covered
#define ATT_PARTIAL_ARGS                                                                                    \
  q, kc, vc, bt, rowSeq, positions, part, H, KVH, hd, bs, mbps, qStride, qOff, scale, minChunk, S, rowBase, out, \
      counters, decodeOnly, rf, window, lse, covered
template <typename KT, int W, int EPL, bool ROPE, bool PAIR>
__device__ __forceinline__ void attnPartial(ATT_PARTIAL_PARAMS) {
  // decodeOnly (op decoder_layers: every row its own sequence): the keys before a row's own
  // position were written by earlier steps, so the first batch of them streams in before the
  // dependency wait, overlapping the kernel before (rope_append, which writes q and the new key).
  // ROPE (decodeOnly, headDim 128): rope_append's work is done here instead. Each block rotates
  // its own q head; the warp that owns the row's new key (the last split) normalizes and rotates
  // it from the qkv rows, uses it from registers, and the first q head of each KV head's group
  // appends key and value to the cache. The angles' cos/sin only need the position, so they are
  // taken before the wait as well.
  if (!decodeOnly) PDL_ENTER();
  // Rows the prefill tile kernels took (covered: the tile plan's row flags; null: none ran).
  if (covered && covered[rowBase + (int)blockIdx.z]) return;
  __shared__ float shm[W], shl[W];
  __shared__ float sha[W][EPL * 32];
  const int h = blockIdx.y, rl = blockIdx.z, r = rowBase + rl;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int epl = (hd + 31) >> 5;
  const int last = positions[r];
  // ROPE: the angles' cos/sin are taken once per block, on its first live split.
  bool cosDone = false, waited = false;
  // S splits of the keys; a block takes splits blockIdx.x, + gridDim.x, ... in turn (gridDim.x <
  // S under batch-invariant decode: the split of a row's keys, and so its numerics, is the one
  // of a single-row call, while a many-row call launches fewer blocks per row).
  for (int s = blockIdx.x; s < S; s += gridDim.x) {
  if (s != (int)blockIdx.x) __syncthreads();  // the shared arrays of the split before are free
  float* dst = part + (((size_t)rl * H + h) * S + s) * (hd + 2);
  // A sliding window (window > 0) starts the keys at last - window + 1.
  int lo = window > 0 ? max(0, last - window + 1) : 0;
  // Splits are sized from the live length (read here, so a replayed graph adapts every step):
  // a short context uses few splits of at least minChunk keys, the rest exit at once.
  int chunk = max(minChunk, (last - lo + S) / S);
  int nAct = (last - lo) / chunk + 1;
  int start = lo + s * chunk;
  if (start > last) {
    if (!counters && threadIdx.x == 0) {
      dst[0] = -INFINITY;
      dst[1] = 0.f;
    }
    continue;
  }
  int end = min(start + chunk - 1, last);
  int kvh = h / (H / KVH);
  int seq = rowSeq[r];
  const float* qr = q + (size_t)r * qStride + qOff + (size_t)h * hd;
  float qv[EPL], acc[EPL];
  float m = -INFINITY, l = 0.f;
  const size_t width = (size_t)KVH * hd;
  const int* btr = bt + (size_t)seq * mbps;
  // ATT_KB keys per warp at a time: their block-table entries, then their key and value rows,
  // are loaded together, so a split pays the memory latency once per ATT_KB keys instead of
  // twice per key; the online softmax then folds the batch in with one rescale.
  long long slot[ATT_KB];  // -1: past the end of the split
#pragma unroll
  for (int b = 0; b < ATT_KB; b++) slot[b] = -1;
  float kv[ATT_KB][EPL], vv[ATT_KB][EPL];
  float kNew[EPL], vNew[EPL];  // ROPE: the new key and value (owner warp)
  long long pOf[ATT_KB] = {-1, -1, -1, -1};  // ATT_KB entries
  // bf16 caches with PAIR: a pair stays one packed 32-bit word in kv[b][j] (j even) from its load
  // until widen() just before use. Unpacking at the load made every thread wait for its first
  // keys before its dependency wait, which then released up to ~1 us late (bf16 KV
  // decoded slower than f32).
  constexpr bool PACKED = PAIR && std::is_same<KT, uint16_t>::value;
  auto widen = [&]() {
    if constexpr (PACKED) {
#pragma unroll
      for (int b = 0; b < ATT_KB; b++)
#pragma unroll
        for (int j = 0; j < EPL; j += 2) {
          const uint32_t kw = __float_as_uint(kv[b][j]), vw = __float_as_uint(vv[b][j]);
          kv[b][j] = __uint_as_float(kw << 16);
          kv[b][j + 1] = __uint_as_float(kw & 0xffff0000u);
          vv[b][j] = __uint_as_float(vw << 16);
          vv[b][j + 1] = __uint_as_float(vw & 0xffff0000u);
        }
    }
  };
  auto loadKey = [&](int b) {
    if (ROPE && pOf[b] == last) {
      // The new key and value from registers, rounded as the cache stores them, so a row sees the
      // same key whether it reads it back or not.
      if constexpr (PACKED) {
#pragma unroll
        for (int j = 0; j < EPL; j += 2) {
          kv[b][j] = __uint_as_float((uint32_t)f2bf(kNew[j]) | ((uint32_t)f2bf(kNew[j + 1]) << 16));
          vv[b][j] = __uint_as_float((uint32_t)f2bf(vNew[j]) | ((uint32_t)f2bf(vNew[j + 1]) << 16));
        }
      } else {
#pragma unroll
        for (int j = 0; j < EPL; j++) {
          kv[b][j] = asStored(kc, kNew[j]);
          vv[b][j] = asStored(kc, vNew[j]);
        }
      }
      return;
    }
    const KT* kr = kc + (size_t)max(slot[b], 0ll) * width + (size_t)kvh * hd;
    const KT* vr = vc + (size_t)max(slot[b], 0ll) * width + (size_t)kvh * hd;
    if constexpr (PACKED) {
#pragma unroll
      for (int j = 0; j < EPL; j += 2) {
        const bool in = slot[b] >= 0 && j < epl;
        const int e = attnElem<true>(j, lane);
        uint32_t kw = 0u, vw = 0u;
        if (in) {
          kw = *(const uint32_t*)(kr + e);
          vw = *(const uint32_t*)(vr + e);
        }
        kv[b][j] = __uint_as_float(kw);
        vv[b][j] = __uint_as_float(vw);
      }
    } else if constexpr (PAIR) {
#pragma unroll
      for (int j = 0; j < EPL; j += 2) {
        bool in = slot[b] >= 0 && j < epl;
        int e = attnElem<true>(j, lane);
        ldk2(kr + e, in, kv[b][j], kv[b][j + 1]);
        ldk2(vr + e, in, vv[b][j], vv[b][j + 1]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < EPL; j++) {
        bool in = slot[b] >= 0 && j < epl && j * 32 + lane < hd;
        kv[b][j] = in ? ldk<KT>(kr, j * 32 + lane) : 0.f;
        vv[b][j] = in ? ldk<KT>(vr, j * 32 + lane) : 0.f;
      }
    }
  };
  auto loadBatch = [&](int p0, bool skipOwn) {
#pragma unroll
    for (int b = 0; b < ATT_KB; b++) {
      int p = p0 + b * W;
      pOf[b] = p;
      // A negative entry: the block lives in another cache (partial attention); skipped.
      int e = p <= end ? btr[p / bs] : -1;
      slot[b] = e >= 0 ? (long long)e * bs + p % bs : -1;
    }
#pragma unroll
    for (int b = 0; b < ATT_KB; b++)
      if (!skipOwn || p0 + b * W != last) loadKey(b);
  };
  int p0 = start + warp;
  // ROPE: the warp that owns key `last` (it lies in the last split, which always exists).
  const bool owner = ROPE && last <= end && (last - start) % W == warp;
  // ROPE: the 64 angles' cos/sin, one per thread into shared memory, before anything else is
  // live (float64 sincos needs many registers; a per-lane copy cost the kernel ~30 more).
  __shared__ double shcs[ROPE ? 64 : 1][2];
  if (ROPE && !cosDone) {
    cosDone = true;
    if (threadIdx.x < 64)
      sincos((double)__fmul_rn((float)last, rf.invFreq[threadIdx.x]), &shcs[threadIdx.x][1], &shcs[threadIdx.x][0]);
    __syncthreads();
  }
  if (decodeOnly) {
    if (p0 <= end) loadBatch(p0, true);
    if (!waited) {
      waited = true;
      pdlWait();
      // (Triggering only once the split's partial is written, so o's and gate_up's weight streams
      // overlap the merge rather than the splits' loads, was slower.)
      pdlTrigger();
    }
    if (ROPE) {
      float a[4];
#pragma unroll
      for (int j = 0; j < 4; j++) a[j] = qr[attnElem<PAIR>(j, lane)];
      float kr4[4], vr4[4];
      if (owner) {
        const float* krow = q + (size_t)r * qStride + qOff + (size_t)(H + kvh) * hd;
        const float* vrow = krow + (size_t)KVH * hd;
#pragma unroll
        for (int j = 0; j < 4; j++) {
          kr4[j] = krow[attnElem<PAIR>(j, lane)];
          vr4[j] = vrow[attnElem<PAIR>(j, lane)];
        }
      }
      ropeHeadWarp<PAIR>(a, rf.qn, rf.ndt, rf.eps, shcs, lane);
#pragma unroll
      for (int j = 0; j < EPL; j++) {
        qv[j] = j < 4 ? a[j] * scale : 0.f;
        acc[j] = 0.f;
        kNew[j] = 0.f;
        vNew[j] = 0.f;
      }
      if (owner) {
        ropeHeadWarp<PAIR>(kr4, rf.kn, rf.ndt, rf.eps, shcs, lane);
#pragma unroll
        for (int j = 0; j < 4; j++) {
          kNew[j] = kr4[j];
          vNew[j] = vr4[j];
        }
        int sl = rf.slots[r];
        if (sl >= 0 && h % (H / KVH) == 0) {
          KT* kd = const_cast<KT*>(kc) + (size_t)sl * width + (size_t)kvh * hd;
          KT* vd = const_cast<KT*>(vc) + (size_t)sl * width + (size_t)kvh * hd;
#pragma unroll
          for (int j = 0; j < 4; j++) {
            stk(kd, attnElem<PAIR>(j, lane), kNew[j]);
            stk(vd, attnElem<PAIR>(j, lane), vNew[j]);
          }
        }
      }
    }
#pragma unroll
    for (int b = 0; b < ATT_KB; b++)
      if (p0 <= end && p0 + b * W == last) loadKey(b);  // ROPE: from registers; else written by rope_append
  }
  if (!ROPE) {
#pragma unroll
    for (int j = 0; j < EPL; j++) {
      const int e = attnElem<PAIR>(j, lane);
      qv[j] = (j < epl && e < hd) ? qr[e] * scale : 0.f;
      acc[j] = 0.f;
    }
  }
  for (bool first = true; p0 <= end; p0 += W * ATT_KB, first = false) {
    if (!(first && decodeOnly)) loadBatch(p0, false);
    widen();
    float d[ATT_KB];
#pragma unroll
    for (int b = 0; b < ATT_KB; b++) {
      d[b] = 0.f;
#pragma unroll
      for (int j = 0; j < EPL; j++) d[b] += qv[j] * kv[b][j];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int b = 0; b < ATT_KB; b++) d[b] += __shfl_xor_sync(0xffffffffu, d[b], o);
    float mn = m;
#pragma unroll
    for (int b = 0; b < ATT_KB; b++)
      if (slot[b] >= 0) mn = fmaxf(mn, d[b]);
    if (mn == -INFINITY) continue;  // every key of the batch is in another cache
    float corr = expf(m - mn);
    l *= corr;
#pragma unroll
    for (int j = 0; j < EPL; j++) acc[j] *= corr;
#pragma unroll
    for (int b = 0; b < ATT_KB; b++) {
      if (slot[b] < 0) continue;
      float e = expf(d[b] - mn);
      l += e;
#pragma unroll
      for (int j = 0; j < EPL; j++) acc[j] += e * vv[b][j];
    }
    m = mn;
  }
  if (lane == 0) {
    shm[warp] = m;
    shl[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < EPL; j++)
    if (j < epl && attnElem<PAIR>(j, lane) < hd) sha[warp][attnElem<PAIR>(j, lane)] = acc[j];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < W; w++) M = fmaxf(M, shm[w]);
  for (int t = threadIdx.x; t < hd; t += blockDim.x) {
    float a = 0.f;
    for (int w = 0; w < W; w++)
      if (shl[w] > 0.f) a += sha[w][t] * expf(shm[w] - M);
    dst[2 + t] = a;
  }
  if (threadIdx.x == 0) {
    float L = 0.f;
    for (int w = 0; w < W; w++)
      if (shl[w] > 0.f) L += shl[w] * expf(shm[w] - M);
    dst[0] = M;
    dst[1] = L;
  }
  if (counters) {
    __shared__ AttnWideScratch wide;
    attnArrive(part, out, counters, rl, r, h, H, hd, S, nAct, lse, wide);
  }
  }
}

template <typename KT, int W, int EPL, bool ROPE, bool PAIR>
__global__ void __launch_bounds__(32 * W) k_attn_partial(ATT_PARTIAL_PARAMS) {
  NERVA_TRACE_KERNEL();
  attnPartial<KT, W, EPL, ROPE, PAIR>(ATT_PARTIAL_ARGS);
}

// The decode kernel (rope fused, headDim 128) held to 112 registers a thread: at two blocks an SM
// that leaves room for a block of the o projection, which the attention launches early and which
// streams its weights meanwhile (at 121, the register count with attnMergeWide inlined, it did not
// fit and the 0.6B decoded about 0.7 % slower).
template <typename KT, int W, bool PAIR>
__global__ void __maxnreg__(112) k_attn_partial_rope(ATT_PARTIAL_PARAMS) {
  NERVA_TRACE_KERNEL();
#ifdef NERVA_ATTN_SKIP
  pdlWait();
  pdlTrigger();
  return;
#endif
  attnPartial<KT, W, 4, true, PAIR>(ATT_PARTIAL_ARGS);
}
#undef ATT_PARTIAL_PARAMS
#undef ATT_PARTIAL_ARGS

// Exact merge of the split partials (online-softmax combine), one block per (head, row).
__global__ void k_attn_combine(const float* part, float* out, int H, int hd, int S, int rowBase, float* lse,
                               const unsigned char* covered) {
  NERVA_TRACE_KERNEL();
  PDL_ENTER();
  int h = blockIdx.x, rl = blockIdx.y, r = rowBase + rl;
  if (covered && covered[r]) return;
  const float* base = part + ((size_t)rl * H + h) * S * (hd + 2);
  float M = -INFINITY;
  for (int s = 0; s < S; s++) M = fmaxf(M, base[(size_t)s * (hd + 2)]);
  float L = 0.f;
  for (int s = 0; s < S; s++) {
    const float* ps = base + (size_t)s * (hd + 2);
    if (ps[1] > 0.f) L += ps[1] * expf(ps[0] - M);
  }
  for (int t = threadIdx.x; t < hd; t += blockDim.x) {
    float a = 0.f;
    for (int s = 0; s < S; s++) {
      const float* ps = base + (size_t)s * (hd + 2);
      if (ps[1] > 0.f) a += ps[2 + t] * expf(ps[0] - M);
    }
    out[(size_t)r * H * hd + (size_t)h * hd + t] = L > 0.f ? a / L : 0.f;
  }
  if (lse && threadIdx.x == 0) lse[(size_t)r * H + h] = L > 0.f ? M + logf(L) : -INFINITY;
}

int launchAttnCombine(NervaExec* ex, int threads, int rows, const float* part, float* out, int H, int hd, int S, int rowBase,
                      float* lse, const unsigned char* covered) {
  LAUNCH(k_attn_combine, dim3(H, rows), threads, 0, part, out, H, hd, S, rowBase, lse, covered);
  return NERVA_OK;
}

// Blocks of the split-KV kernel attentionRun launches (rope fused or not, headDim, lane layout)
// that fit an SM at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor, taken once per kernel).
template <typename KT>
int attnResident(bool rope, int hd, bool pair) {
  if (rope && !pair) return 1;  // never launched: the fused rope needs headDim 128 (attentionRun rejects it)
  static int cache[6] = {-1, -1, -1, -1, -1, -1};
  const int v = rope ? 0 : (hd <= 128 ? 2 : 4) + (pair ? 0 : 1);
  if (cache[v] >= 0) return cache[v];
  int n = 0;
  cudaError_t e = cudaSuccess;
  const int threads = 32 * ATT_WARPS;
  switch (v) {
    case 0: e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_attn_partial_rope<KT, ATT_WARPS, true>, threads, 0); break;
    case 2: e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_attn_partial<KT, ATT_WARPS, 4, false, true>, threads, 0); break;
    case 3: e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_attn_partial<KT, ATT_WARPS, 4, false, false>, threads, 0); break;
    case 4: e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_attn_partial<KT, ATT_WARPS, ATT_MAX_EPL, false, true>, threads, 0); break;
    default: e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_attn_partial<KT, ATT_WARPS, ATT_MAX_EPL, false, false>, threads, 0); break;
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    n = 2;  // the fused decode kernel's figure on the H100
  }
  cache[v] = std::max(1, n);
  return cache[v];
}

// Split-KV sizing: the splits aim to fill ATTN_WAVES waves of the split kernel's resident blocks
// (more waves measured slower), each split at least ATTN_MIN_CHUNK keys (16 and 64 measured no
// better, 8 slower).
constexpr int ATTN_WAVES = 1;
constexpr int ATTN_MIN_CHUNK = 32;

// The split-KV kernel over `rows` (covered: the tile plan's row flags, rows the prefill tiles took
// are skipped; null: none ran). decodeOnly: every row is its own sequence (op decoder_layers), see k_attn_partial.
int attnSplitKv(NervaExec* ex, const float* qPtr, Buf kc, Buf vc, float* outPtr, Buf bt, Buf rowSeq, Buf pos, int rows, int H,
                int KVH, int hd, int bs, int mbps, int qStride, int qOff, float scale, int decodeOnly, const RopeFuse* rope,
                int window, float* lse, const unsigned char* covered) {
  long long maxLen = (long long)mbps * bs;
  size_t perSplit = (size_t)(hd + 2) * sizeof(float);
  const bool pair = hd % 64 == 0;  // lanes hold adjacent element pairs (attnElem)
  // Splits in whole waves of the split kernel's resident blocks (attnResident x SMs): the splits
  // of one wave (ATTN_WAVES) when rows*heads is small; a long context that
  // needs more (at most 1024 keys a block) takes the next whole number of waves, so no wave runs a
  // few stragglers. Bounded by the workspace. H100, batch 1: against the old 8 blocks an SM (four waves of the fused decode kernel), the 0.6B decoded
  // 1.27x faster at a 1536-token context, 1.35x at 4000, 1.14x at 16000; the 8B 1.10x at 2000,
  // 1.09x at 6000, 1.03x at 12000 (12 splits needed: two whole waves, 16, beat 12 by 11 %).
  // Short contexts do not change (minChunk decides); more waves were slower.
  int resident = 0;
  switch (kc.dt) {
    case NV_F32: resident = attnResident<float>(rope != nullptr, hd, pair); break;
    case NV_BF16: resident = attnResident<uint16_t>(rope != nullptr, hd, pair); break;
    case NV_F16: resident = attnResident<__half>(rope != nullptr, hd, pair); break;
    default: return bad(ex, "attention: unsupported cache dtype");
  }
  const long long slots = (long long)ex->smCount * std::max(1, resident);
  const long long target = slots * ATTN_WAVES;
  // Batch-invariant decode: the splits (and so each row's key chunks and merge order) as for one
  // row alone, whatever the number of rows; rows go in chunks the workspace and the combine
  // counters cover, never fewer splits.
  const bool inv = ex->batchInv;
  const long long sRows = inv ? 1 : rows;
  const long long perWave = std::max<long long>(1, slots / (sRows * H));
  long long S = perWave * ATTN_WAVES;
  // With prefill tiles the rows left are few (decode rows, short runs) and need no more splits,
  // except under batch invariance, where a row's splits are the ones it takes alone.
  if (!covered || inv) {
    const long long sMin = (maxLen + 1023) / 1024;  // long contexts: at most 1024 keys per block
    if (sMin > S) S = (sMin + perWave - 1) / perWave * perWave;
  }
  // At least minChunk keys per split: a split fewer keys than that costs more in merging than it
  // saves. (Capping S at maxLen/64 instead kept a short-context decode at 7 splits of ~55 keys,
  // 12 us per layer on the 0.6B shape.)
  const int minChunk = ATTN_MIN_CHUNK;
  S = std::min<long long>(S, std::max<long long>(1, (maxLen + minChunk - 1) / minChunk));
  S = std::min<long long>(S, 4096);
  int rowChunk = rows;
  if (inv) rowChunk = invRowChunk(ex, rows, H, S, perSplit);
  while (rowChunk > 1 && (size_t)rowChunk * H * S * perSplit > ex->wsBytes) {
    if (S > 1) S = std::max<long long>(1, S / 2);
    else rowChunk = (rowChunk + 1) / 2;
  }
  if ((size_t)rowChunk * H * S * perSplit > ex->wsBytes) return bad(ex, "attention: workspace too small");
  (void)maxLen;
  float* part = (float*)ex->ws;
  for (int r0 = 0; r0 < rows; r0 += rowChunk) {
    int nr = std::min(rowChunk, rows - r0);
    // Batch-invariant decode: S is a single row's split count; the blocks per row are what the
    // rows of this call need to fill the GPU, each taking every gridDim.x-th split (one row: S).
    long long sGrid = inv ? std::min<long long>(S, std::max<long long>(1, (target + (long long)nr * H - 1) / ((long long)nr * H))) : S;
    dim3 grid((unsigned)sGrid, (unsigned)H, (unsigned)nr);
    const float* qp = qPtr;
    const int *btp = (const int*)bt.p, *rsp = (const int*)rowSeq.p, *pp = (const int*)pos.p;
    // One kernel when the re-armed counters cover this chunk of rows; else a separate combine.
    int* cnt = ex->counters && (size_t)nr * H <= ex->counterCount ? ex->counters : nullptr;
    RopeFuse rf = rope ? *rope : RopeFuse();
#define ATT_K(KT, E, RP)                                                                                               \
  if (pair) {                                                                                                           \
    ATT_KP(KT, E, RP, true);                                                                                           \
  } else {                                                                                                             \
    ATT_KP(KT, E, RP, false);                                                                                          \
  }
#define ATT_KP(KT, E, RP, PR)                                                                                          \
  LAUNCH((k_attn_partial<KT, ATT_WARPS, E, RP, PR>), grid, 32 * ATT_WARPS, 0, qp, (const KT*)kc.p, (const KT*)vc.p, btp, rsp, pp, \
         part, H, KVH, hd, bs, mbps, qStride, qOff, scale, minChunk, (int)S, r0, outPtr, cnt, decodeOnly, rf, window, lse, \
         covered)
#define ATT_KR(KT)                                                                                                     \
  if (pair) {                                                                                                          \
    LAUNCH((k_attn_partial_rope<KT, ATT_WARPS, true>), grid, 32 * ATT_WARPS, 0, qp, (const KT*)kc.p, (const KT*)vc.p, btp, \
           rsp, pp, part, H, KVH, hd, bs, mbps, qStride, qOff, scale, minChunk, (int)S, r0, outPtr, cnt, decodeOnly, rf,   \
           window, lse, covered);                                                                                    \
  } else {                                                                                                             \
    return bad(ex, "attention: the fused rope needs headDim 128");                                                     \
  }
#define ATT_KT(KT)                     \
  if (rope) {                          \
    ATT_KR(KT)                         \
  } else if (hd <= 128) {              \
    ATT_K(KT, 4, false)                \
  } else {                             \
    ATT_K(KT, ATT_MAX_EPL, false)      \
  }
    switch (kc.dt) {
      case NV_F32: ATT_KT(float) break;
      case NV_BF16: ATT_KT(uint16_t) break;
      case NV_F16: ATT_KT(__half) break;
      default: return bad(ex, "attention: unsupported cache dtype");
    }
#undef ATT_KT
#undef ATT_KR
#undef ATT_K
#undef ATT_KP
    if (!cnt) {
      int rc = launchAttnCombine(ex, ((std::min(hd, 256) + 31) / 32) * 32, nr, part, outPtr, H, hd, (int)S, r0, lse, covered);
      if (rc) return rc;
    }
  }
  return NERVA_OK;
}

}  // namespace nerva::ops
