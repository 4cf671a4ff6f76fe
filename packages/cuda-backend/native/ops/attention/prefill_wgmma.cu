// Causal attention of prefill tiles on Hopper warpgroup MMA (k_attn_prefill_wgmma): the contract
// and arithmetic of k_attn_prefill3 (plain bf16 operands, two q heads of one KV head a block, head
// dim 128, bf16 cache), with wgmma.mma_async in place of mma.sync.
//
// - A block is two warpgroups over one 64-row tile: warpgroup i takes q head 2 * pair + i, all 64
//   rows (an m64 product), so the K/V tile the block loads feeds both heads.
// - Shared memory holds q (both heads) and PW_STAGES stages of K and V tiles, each a matrix of 64 rows x
//   128 dims of bf16 in the 128-byte swizzle wgmma reads: two panels (dims 0-63, 64-127) of 64 rows
//   of 128 bytes, the 16-byte chunk c of row r stored at chunk c ^ (r & 7), panels 1024-byte
//   aligned. K and V share the layout: S = Q K^T reads both Q and K K-major (dims contiguous), and
//   O += P V reads V N-major (dims contiguous along N) with the transpose flag.
// - S (m64n64, 32 f32 a thread) is in the mma.sync accumulator layout per warp, so P becomes the
//   A fragments of the second product in registers as k_attn_prefill3 builds them; O (m64n128) is
//   64 f32 a thread.
// - K/V tiles come by cp.async through the block table (k_attn_prefill3's slot scheme).
// - Per tile the products run serially, each waited for before the next step; two blocks a SM
//   interleave one's softmax with the other's products.
// Only an sm_90a image has the body (wgmma needs the arch-specific target); attnPrefillWgmmaRun
// takes a call only where the loaded image is that one.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/attention/attn_common.cuh"
#include "ops/ops.h"

namespace nerva::ops {

constexpr int PW_THREADS = 256;           // two warpgroups
constexpr int PW_PANEL = PF_KEYS * 128;   // bytes: 64 rows of one 64-dim half (128 bytes a row)
constexpr int PW_MAT = 2 * PW_PANEL;      // bytes: 64 rows x 128 dims of bf16
// Two stages (the next tile's copies in flight during this one's products) and the registers capped
// at 128, so that two blocks share an SM: one block's softmax runs while the other's products do.
// A pipelined form (each warpgroup's softmax overlapping its own next S product, one block a SM at
// ~190 registers, five stages) measured slower: docs/results/prefill.md.
constexpr int PW_STAGES = 2;
constexpr int PW_MIN_BLOCKS = 2;
// q of two heads, the K/V stages, and 1 KiB of slack to align the base to the swizzle's 1024 bytes.
constexpr size_t PW_SMEM = (size_t)(2 + 2 * PW_STAGES) * PW_MAT + 1024;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Byte offset of 16-byte chunk ch (dims 8 ch .. 8 ch + 7) of row r in a swizzled 64 x 128 matrix.
__device__ __forceinline__ uint32_t pwSwz(int r, int ch) {
  return (uint32_t)((ch >> 3) * PW_PANEL + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}

// Shared-memory matrix descriptors, split in 32-bit halves so that only the low half varies:
// low = start address >> 4 (bits 0-13) | leading byte offset >> 4 (bits 16-29); high = stride byte
// offset >> 4 (1024: the next 8 rows) | base offset 0 (every panel is 1024-byte aligned) | swizzle
// mode 1 (128 bytes) in bits 62-63. The leading offset is unused for K-major swizzled operands (1).
constexpr uint32_t PW_DESC_HI = (1024u >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t pwDescLo(uint32_t addr, uint32_t lbo) {
  return (addr >> 4) | ((lbo >> 4) << 16);  // shared addresses are below 2^18
}

__device__ __forceinline__ void pwCopy16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

__device__ __forceinline__ void pwFence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void pwCommit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void pwWaitAll() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Generic-proxy writes to shared memory (st.shared, cp.async) made visible to wgmma's async proxy.
__device__ __forceinline__ void pwProxyFence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Ties accumulator registers to this point: their reads stay after the wait before it.
template <int N>
__device__ __forceinline__ void pwKeep(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

#define PW_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define PW_W8(i) "=f"(d[i]), "=f"(d[i + 1]), "=f"(d[i + 2]), "=f"(d[i + 3]), "=f"(d[i + 4]), "=f"(d[i + 5]), "=f"(d[i + 6]), "=f"(d[i + 7])
#define PW_D32 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"

// d (64 x 64, f32) = A B (ACC: d + A B): A 64 x 16 and B (64 keys x 16 dims) both K-major in shared
// memory. The first k-step writes d without reading it, so the scores are not live across the
// rest of the tile's work (the P V product, the next tile's wait).
template <bool ACC>
__device__ __forceinline__ void pwMmaQK(float (&d)[32], uint32_t a, uint32_t b) {
  if (ACC)
    asm volatile("{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, 1, 0;\n"
                 "mov.b64 da, {%32, %34};\nmov.b64 db, {%33, %34};\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " PW_D32 ", da, db, p, 1, 1, 0, 0;\n}\n"
                 : PW_F8(0), PW_F8(8), PW_F8(16), PW_F8(24)
                 : "r"(a), "r"(b), "r"(PW_DESC_HI));
  else
    asm volatile("{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, 0, 0;\n"
                 "mov.b64 da, {%32, %34};\nmov.b64 db, {%33, %34};\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " PW_D32 ", da, db, p, 1, 1, 0, 0;\n}\n"
                 : PW_W8(0), PW_W8(8), PW_W8(16), PW_W8(24)
                 : "r"(a), "r"(b), "r"(PW_DESC_HI));
}

// d (64 x 128, f32) += A B: A 64 x 16 bf16 from registers (mma.sync's A fragment per warp), B (16
// keys x 128 dims) N-major in shared memory (transpose flag).
__device__ __forceinline__ void pwMmaPV(float (&d)[64], const uint32_t (&a)[4], uint32_t b) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, 1, 0;\nmov.b64 db, {%68, %69};\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,"
      "%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,"
      "%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, db, p, 1, 1, 1;\n}\n"
      : PW_F8(0), PW_F8(8), PW_F8(16), PW_F8(24), PW_F8(32), PW_F8(40), PW_F8(48), PW_F8(56)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b), "r"(PW_DESC_HI));
}
#undef PW_F8
#undef PW_W8
#undef PW_D32
#endif

// `btStride`: the block-table row stride of sequences (0: every sequence reads row 0, the identity
// table of gathered keys), as k_attn_prefill3.
__global__ void __launch_bounds__(PW_THREADS, PW_MIN_BLOCKS)
    k_attn_prefill_wgmma(const float* q, const uint16_t* kc, const uint16_t* vc, const int* bt, int btStride,
                         const int* rowSeq, const int* positions, float* out, int rows, int H, int KVH, int bs,
                         int qStride, int qOff, float scale, int window, float* lse, const int2* tiles,
                         const int* tileCount) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  PDL_ENTER();
  constexpr int HD = 128;
  constexpr int NT = HD / 8;
  extern __shared__ __align__(16) unsigned char pwDyn[];
  // Static shared memory only in this body: the host tells the sm_90a image by it (attnPrefillWgmmaRun).
  // Key offsets of three tiles in turn: a tile's are written while the one two before is done
  // and the one before may still be read (its mask), so one barrier a tile orders them.
  __shared__ long long slotSt[3][PF_KEYS];
  __shared__ int sLo, sHi;
  const uint32_t dynAddr = (uint32_t)__cvta_generic_to_shared(pwDyn);
  const uint32_t base = (dynAddr + 1023u) & ~1023u;
  unsigned char* const sm = pwDyn + (base - dynAddr);
  const uint32_t qBase = base;              // head i at + i * PW_MAT
  const uint32_t kvBase = base + 2 * PW_MAT;  // stage s: K at + 2 s PW_MAT, V PW_MAT on

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = warp >> 2, wq = warp & 3;
  int r0, pair;
  if (!pfTileRows(tiles, tileCount, r0, rows, pair)) return;
  const int h0 = pair * 2;
  if (tid == 0) {
    sLo = INT_MAX;
    sHi = -1;
  }
  // q of both heads, scaled by scale * log2(e) in f32, rounded to bf16 (rows past the end: 0), one
  // 16-byte chunk a step. The caller guarantees float pairs only, so q is read two floats at a time.
  {
    const float qs = scale * PA2_LOG2E;
    for (int i = tid; i < 2 * PF_ROWS * (HD / 8); i += PW_THREADS) {
      const int hh = i / (PF_ROWS * (HD / 8)), rr = (i / (HD / 8)) % PF_ROWS, ch = i % (HD / 8);
      uint32_t w[4] = {0u, 0u, 0u, 0u};
      if (r0 + rr < rows) {
        const float* src = q + (size_t)(r0 + rr) * qStride + qOff + (size_t)(h0 + hh) * HD + ch * 8;
#pragma unroll
        for (int j = 0; j < 4; j++) {
          const float2 v = *reinterpret_cast<const float2*>(src + 2 * j);
          w[j] = pa2Pack(v.x * qs, v.y * qs);
        }
      }
      *reinterpret_cast<uint4*>(sm + hh * PW_MAT + pwSwz(rr, ch)) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
  pwProxyFence();
  __syncthreads();
  const int2 keys = pfTileKeys(positions, r0, rows, window, sLo, sHi);
  const int kLo = keys.x, kHi = keys.y;
  const int seq = rowSeq[r0];
  const int kvh = h0 / (H / KVH);
  const int* btr = bt + (size_t)seq * btStride;
  const size_t width = (size_t)KVH * HD;

  // This thread's rows of its warpgroup's head: the accumulator layout puts warp wq on rows 16 wq
  // .. 16 wq + 15, lane group g on rows g and g + 8, lane c on columns 8 n + 2 c, + 1.
  const int g = lane >> 2, c = lane & 3;
  const int ra = r0 + wq * 16 + g, rb = ra + 8;
  const int pa = ra < rows ? positions[ra] : -1, pb = rb < rows ? positions[rb] : -1;
  const int la = window > 0 ? max(0, pa - window + 1) : 0, lb = window > 0 ? max(0, pb - window + 1) : 0;

  float o[4 * NT];
#pragma unroll
  for (int i = 0; i < 4 * NT; i++) o[i] = 0.f;
  float ma = -INFINITY, mb = -INFINITY, sa = 0.f, sb = 0.f;

  auto entryFor = [&](int k0) -> int {
    const int p = k0 + tid;
    return tid < PF_KEYS && p >= kLo && p <= kHi ? btr[p / bs] : -1;
  };
  // The tile's key offsets in this block's KV head (pfKeyOffsets).
  auto slotsFrom = [&](int k0, int e, long long* sl) { return pfKeyOffsets(k0, e, bs, width, (long long)kvh * HD, sl); };
  // A thread copies one fixed 16-byte column of every 16th key row, K and V.
  auto issue = [&](const long long* sl, int st) {
    const uint32_t kd = kvBase + (uint32_t)st * 2 * PW_MAT, vd = kd + PW_MAT;
    const int ch = tid & 15, j0 = tid >> 4;
#pragma unroll
    for (int it = 0; it < PF_KEYS / 16; it++) {
      const int j = j0 + it * 16;
      const long long sv = sl[j];
      const size_t off = (size_t)max(sv, 0ll) + ch * 8;
      const uint32_t at = pwSwz(j, ch);
      pwCopy16(kd + at, kc + off, sv >= 0);
      pwCopy16(vd + at, vc + off, sv >= 0);
    }
  };

  const uint32_t qS = qBase + (uint32_t)wg * PW_MAT;
  // S = Q K^T over the 8 k-steps of 16 dims: steps 0-3 in the first panel, 4-7 in the second,
  // each 32 bytes on within the swizzled 128-byte rows (the swizzle applies to the computed
  // address, so an offset start inside the atom reads the right chunks).
  auto mmaQK = [&](float (&s)[32], uint32_t kS) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      const uint32_t off = (uint32_t)(kk >> 2) * PW_PANEL + (uint32_t)(kk & 3) * 32;
      if (kk == 0)
        pwMmaQK<false>(s, pwDescLo(qS + off, 16), pwDescLo(kS + off, 16));
      else
        pwMmaQK<true>(s, pwDescLo(qS + off, 16), pwDescLo(kS + off, 16));
    }
  };
  // O += P V over 4 k-steps of 16 keys: rows 16 ks .. of both panels; LBO steps to the second
  // 64 dims (the next swizzle atom along N), SBO to the next 8 keys.
  auto mmaPV = [&](const uint32_t (&ph)[4][4], uint32_t vS) {
#pragma unroll
    for (int ks = 0; ks < 4; ks++) pwMmaPV(o, ph[ks], pwDescLo(vS + (uint32_t)ks * 16 * 128, PW_PANEL));
  };
  // The tile's mask (keys without a slot, outside a row's causal window) and its row maxima. Reads
  // only the scores.
  auto maskMax = [&](float (&s)[32], int k0, bool full, const long long* slot, float& xa, float& xb) {
    const bool needMask = !(full && k0 + PF_KEYS - 1 <= min(pa, pb) && k0 >= max(la, lb));
    if (needMask) {
#pragma unroll
      for (int n = 0; n < 8; n++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int j = n * 8 + 2 * c + e, p = k0 + j;
          const bool have = slot[j] >= 0;
          if (!(have && p >= la && p <= pa)) s[4 * n + e] = -INFINITY;
          if (!(have && p >= lb && p <= pb)) s[4 * n + 2 + e] = -INFINITY;
        }
      }
    }
    xa = -INFINITY;
    xb = -INFINITY;
#pragma unroll
    for (int n = 0; n < 8; n++) {
      xa = fmaxf(xa, fmaxf(s[4 * n], s[4 * n + 1]));
      xb = fmaxf(xb, fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, off));
      xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, off));
    }
  };
  // The online softmax's step: new maxima, O and the sums rescaled to them (O must be settled, no
  // P V in flight), P = 2^(s - max) summed and packed as the A fragments of P V, by k-step.
  auto softmaxP = [&](float (&s)[32], float xa, float xb, uint32_t (&ph)[4][4]) {
    const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
    const float ba = na == -INFINITY ? 0.f : na, bb = nb == -INFINITY ? 0.f : nb;
    const float ca = pa2Exp2(ma - ba), cb = pa2Exp2(mb - bb);
    ma = na;
    mb = nb;
    sa *= ca;
    sb *= cb;
    if (__any_sync(0xffffffffu, ca != 1.f || cb != 1.f)) {
#pragma unroll
      for (int n = 0; n < NT; n++) {
        o[4 * n] *= ca;
        o[4 * n + 1] *= ca;
        o[4 * n + 2] *= cb;
        o[4 * n + 3] *= cb;
      }
    }
#pragma unroll
    for (int n = 0; n < 8; n++) {
      s[4 * n] = pa2Exp2(s[4 * n] - ba);
      s[4 * n + 1] = pa2Exp2(s[4 * n + 1] - ba);
      s[4 * n + 2] = pa2Exp2(s[4 * n + 2] - bb);
      s[4 * n + 3] = pa2Exp2(s[4 * n + 3] - bb);
      sa += s[4 * n] + s[4 * n + 1];
      sb += s[4 * n + 2] + s[4 * n + 3];
    }
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
      ph[ks][0] = pa2Pack(s[8 * ks], s[8 * ks + 1]);
      ph[ks][1] = pa2Pack(s[8 * ks + 2], s[8 * ks + 3]);
      ph[ks][2] = pa2Pack(s[8 * ks + 4], s[8 * ks + 5]);
      ph[ks][3] = pa2Pack(s[8 * ks + 6], s[8 * ks + 7]);
    }
  };

  const int kBeg = kLo & ~(PF_KEYS - 1);
  // Per tile, one barrier: it publishes the tile's copies (each thread waited for its own) and the
  // next tile's key offsets, and tells that every warp is done with the tile before, whose stage
  // the next tile's copies then refill. S = Q K^T, wait, softmax, O += P V, wait.
  // Tile t's offsets live in slotSt[t % 3], its K/V in stage t & 1.
  float s[32];
  bool fullCur = slotsFrom(kBeg, entryFor(kBeg), slotSt[0]);
  int eNext = entryFor(kBeg + PF_KEYS);
  issue(slotSt[0], 0);
  pfCommit();
  for (int k0 = kBeg, it = 0; k0 <= kHi; k0 += PF_KEYS, it++) {
    const int cur = it & 1;
    const long long* slot = slotSt[it % 3];
    long long* slotNext = slotSt[(it + 1) % 3];
    const uint32_t kS = kvBase + (uint32_t)cur * 2 * PW_MAT, vS = kS + PW_MAT;
    const bool hasNext = k0 + PF_KEYS <= kHi;
    bool okNext = true;
    if (hasNext && tid < PF_KEYS) {
      const long long v = pfKeyOffset(k0 + PF_KEYS, eNext, bs, width, (long long)kvh * HD);
      slotNext[tid] = v;
      okNext = v >= 0;
    }
    if (hasNext) eNext = entryFor(k0 + 2 * PF_KEYS);
    pfWaitAll();
    pwProxyFence();
    const bool fullNext = __syncthreads_and(okNext) != 0;
    if (hasNext) {
      issue(slotNext, cur ^ 1);
      pfCommit();
    }

    pwFence();
    mmaQK(s, kS);
    pwCommit();
    pwWaitAll();
    pwKeep(s);
    float xa, xb;
    maskMax(s, k0, fullCur, slot, xa, xb);
    uint32_t ph[4][4];
    softmaxP(s, xa, xb, ph);
    pwFence();
    mmaPV(ph, vS);
    pwCommit();
    pwWaitAll();
    pwKeep(o);
    fullCur = fullNext;
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    sa += __shfl_xor_sync(0xffffffffu, sa, off);
    sb += __shfl_xor_sync(0xffffffffu, sb, off);
  }
  const int h = h0 + wg;
  const float ia = sa > 0.f ? 1.f / sa : 0.f, ib = sb > 0.f ? 1.f / sb : 0.f;
#pragma unroll
  for (int n = 0; n < NT; n++) {
    const int d = n * 8 + 2 * c;
    if (ra < rows) *reinterpret_cast<float2*>(out + (size_t)ra * H * HD + (size_t)h * HD + d) = make_float2(o[4 * n] * ia, o[4 * n + 1] * ia);
    if (rb < rows) *reinterpret_cast<float2*>(out + (size_t)rb * H * HD + (size_t)h * HD + d) = make_float2(o[4 * n + 2] * ib, o[4 * n + 3] * ib);
  }
  if (lse && c == 0) {
    if (ra < rows) lse[(size_t)ra * H + h] = sa > 0.f ? (ma + log2f(sa)) * PA2_LN2 : -INFINITY;
    if (rb < rows) lse[(size_t)rb * H + h] = sb > 0.f ? (mb + log2f(sb)) * PA2_LN2 : -INFINITY;
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched: the host takes this form only for the sm_90a image
#endif
}

// Whether the image of k_attn_prefill_wgmma loaded for the current device is the sm_90a one. The
// runtime reports sm_90 and sm_90a images alike (binaryVersion 90), so the body marks itself: only
// the sm_90a body declares static shared memory. Host-side only (no stream work), so it is safe
// under graph capture; the answer is kept per device.
static bool attnPrefillWgmmaLoaded() {
  static signed char known[64];  // 0 unknown, 1 yes, -1 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  if (!known[dev]) {
    cudaFuncAttributes a;
    const cudaError_t e = cudaFuncGetAttributes(&a, k_attn_prefill_wgmma);
    if (e != cudaSuccess) cudaGetLastError();  // no image for this device: not an error of the call
    known[dev] = e == cudaSuccess && a.binaryVersion == 90 && a.sharedSizeBytes > 0 ? 1 : -1;
  }
  return known[dev] > 0;
}

// k_attn_prefill3's call on the wgmma form (head dim 128, bf16 keys and values, an even GQA
// group). Returns -1 where the device or the binary has no sm_90a body (the caller then takes
// k_attn_prefill3), else the status.
int attnPrefillWgmmaRun(NervaExec* ex, const float* q, const uint16_t* kc, const uint16_t* vc, const int* bt, int btStride,
                        Buf rowSeq, Buf pos, float* out, int rows, int H, int KVH, int bs, int qStride, int qOff,
                        float scale, int window, float* lse, int oneSeq) {
  if (!attnPrefillWgmmaLoaded()) return -1;
  cudaError_t e = allowDynamicSmem(k_attn_prefill_wgmma, PW_SMEM);
  if (e != cudaSuccess) return check(ex, "k_attn_prefill_wgmma (shared memory opt-in)", e);
  dim3 grid((unsigned)pfTileBlocks(rows, oneSeq), (unsigned)(H / 2));
  LAUNCH(k_attn_prefill_wgmma, grid, PW_THREADS, PW_SMEM, q, kc, vc, bt, btStride, (const int*)rowSeq.p, (const int*)pos.p,
         out, rows, H, KVH, bs, qStride, qOff, scale, window, lse, oneSeq ? nullptr : (const int2*)ex->tiles,
         (const int*)ex->tileCount);
  return NERVA_OK;
}

}  // namespace nerva::ops
