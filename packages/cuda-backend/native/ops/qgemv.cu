// Matmuls over ggml block-quantized weights (Q8_0, Q4_0, Q6_K; Q4_K rows go to q4k_mma.cu): a GEMV
// that streams each weight block once from memory and dequantizes it in registers against float32
// activations.
// Exact with respect to the dequantized weights up to float32 summation order: the activations
// are never quantized (llama.cpp quantizes them to 8 bits for its dot products), and every
// product of a weight and an activation is a float32 product of the weight's own value.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/ops.h"
#include "ops/cp_async.cuh"
#include "ops/qepilogue.cuh"

namespace nerva::ops {

// 2^23 + byte: a byte turned into a float by placing it in the mantissa (one PRMT, no I2F,
// whose rate is an eighth of the FMA's); subtracting 2^23 + offset gives the signed value exactly.
__device__ __forceinline__ float magic(uint32_t v, int k) {
  return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7650u + (unsigned)k));
}
// 1 + n/16 for a nibble n held as (n << 3) | 0x80 in byte k of v: n lands on the top four mantissa
// bits, so sum(x * f) = sum(x) + sum(x * n) / 16. Likewise 1 + q/64 for a 6-bit
// q held as (q << 1) | 0x80, or exactly half that, 1/2 + q/128, for q << 1 without the top bit
// (Q6_K's dot). One PRMT a weight, no float subtraction; the price is the sum's rounding relative
// to sum(|x| * f) instead of sum(|x * n|): a bit or two of float32.
__device__ __forceinline__ float nib16(uint32_t v, int k) {
  return __uint_as_float(__byte_perm(v, 0x3F000000u, 0x7044u | ((unsigned)k << 8)));
}
__device__ __forceinline__ uint32_t ld32u2(const uint8_t* p) {  // 2-byte aligned
  const uint16_t* q = (const uint16_t*)p;
  return (uint32_t)q[0] | ((uint32_t)q[1] << 16);
}
__device__ __forceinline__ void ldx(const float* x, float* v, int n) {  // n floats, 16-byte aligned
#pragma unroll
  for (int i = 0; i < n; i += 4) {
    const float4 t = *reinterpret_cast<const float4*>(x + i);
    v[i] = t.x;
    v[i + 1] = t.y;
    v[i + 2] = t.z;
    v[i + 3] = t.w;
  }
}

// One type's tile: the elements a lane takes at a time. fetch() loads one weight row's tile (it
// reads weights only, so a kernel issues it before its dependency wait: the weights stream while
// the previous kernel finishes); load() holds the tile's activations in registers; dot() is the
// fetched weights' dot product with them.
template <int DT>
struct QTile;

// A legacy block (Q8_0, Q4_0): an f16 scale, then W 32-bit words of quants; a tile is one block
// of 32 elements, whose activations are contiguous. Blocks are 2-byte aligned: 16-bit loads.
template <int W>
struct LegacyTile {
  static constexpr int ELEMS = 32, BYTES = 2 + 4 * W;
  struct Raw {
    uint32_t q[W];
    uint16_t d;
  };
  float x[32];
  __device__ static void fetch(Raw& r, const uint8_t* row, int t) {
    const uint16_t* b = (const uint16_t*)(row + (size_t)t * BYTES);
    r.d = b[0];
#pragma unroll
    for (int w = 0; w < W; w++) r.q[w] = (uint32_t)b[1 + 2 * w] | ((uint32_t)b[2 + 2 * w] << 16);
  }
  __device__ void load(const float* xr, int t) { ldx(xr + t * 32, x, 32); }
};

// RING (a tile's trait): its rows stream through the warp's shared-memory ring (see k_qgemv);
// otherwise through two register buffers. Measured on the H200 (8B projections, one row): Q8_0
// and Q6_K gain from the ring's deeper pipeline (Q8_0 down 0.57 -> 0.66 of the copy bandwidth,
// LM head 0.71 -> 0.83); Q4_0 is bound by its per-weight instructions, where the ring's
// shared-memory reads cost more than its depth gives (as they did for this file's former Q4_K
// tile: down 0.45 -> 0.36, LM head 0.52 -> 0.46).
template <>
struct QTile<NV_Q8_0> : LegacyTile<8> {  // 32 int8
  static constexpr bool RING = true;
  __device__ float dot(const Raw& r, int) const {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < 8; w++) {
      const uint32_t v = r.q[w] ^ 0x80808080u;  // q + 128 a byte
#pragma unroll
      for (int k = 0; k < 4; k++) s = fmaf(x[4 * w + k], magic(v, k) - 8388736.f, s);
    }
    return __half2float(__ushort_as_half(r.d)) * s;
  }
};

template <>
struct QTile<NV_Q4_0> : LegacyTile<4> {  // 16 bytes: element j the low nibble of byte j, j + 16 its high nibble
  static constexpr bool RING = false;
  __device__ float dot(const Raw& r, int) const {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < 4; w++) {
      const uint32_t lo = r.q[w] & 0x0F0F0F0Fu, hi = (r.q[w] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
      for (int k = 0; k < 4; k++) {
        s = fmaf(x[4 * w + k], magic(lo, k) - 8388616.f, s);
        s = fmaf(x[16 + 4 * w + k], magic(hi, k) - 8388616.f, s);
      }
    }
    return __half2float(__ushort_as_half(r.d)) * s;
  }
};

template <>
struct QTile<NV_Q6_K> {  // a tile is 32 elements: l in [l0, l0 + 8) of one half's four quadrants
  static constexpr int ELEMS = 32, BYTES = 210;
  static constexpr bool RING = true;
  struct Raw {
    uint32_t la[2], lb[2], h[2];
    uint32_t sc;  // the four quadrants' int8 scales
    uint16_t d;
  };
  float x[32];  // quadrant qd's 8 activations at x[8 * qd]
  float sx[4];  // their sums
  __device__ static void fetch(Raw& r, const uint8_t* row, int t) {
    const uint8_t* b = row + (size_t)(t >> 3) * BYTES;
    const int n = (t >> 2) & 1, l0 = (t & 3) * 8;
    const uint8_t* ql = b + 64 * n + l0;
    const uint8_t* qh = b + 128 + 32 * n + l0;
#pragma unroll
    for (int w = 0; w < 2; w++) {
      r.la[w] = ld32u2(ql + 4 * w);
      r.lb[w] = ld32u2(ql + 32 + 4 * w);
      r.h[w] = ld32u2(qh + 4 * w);
    }
    const uint8_t* sc = b + 192 + 8 * n + l0 / 16;
    r.sc = (uint32_t)sc[0] | ((uint32_t)sc[2] << 8) | ((uint32_t)sc[4] << 16) | ((uint32_t)sc[6] << 24);
    r.d = *(const uint16_t*)(b + 208);
  }
  __device__ void load(const float* xr, int t) {
    const int n = (t >> 2) & 1, l0 = (t & 3) * 8;
    const float* base = xr + (size_t)(t >> 3) * 256 + 128 * n + l0;
#pragma unroll
    for (int qd = 0; qd < 4; qd++) {
      ldx(base + 32 * qd, x + 8 * qd, 8);
      sx[qd] = 0.f;
#pragma unroll
      for (int i = 0; i < 8; i++) sx[qd] += x[8 * qd + i];
    }
  }
  __device__ float dot(const Raw& r, int) const {
    // Each 6-bit q as q << 1 in a byte, so nib16 reads it as f = 1/2 + q/128 (no float
    // subtraction a weight): sum(x * (q - 32)) = 128 * sum(x * f) - 96 * sum(x). (Every product
    // and partial sum is exactly half of the one with the byte's top bit set, f = 1 + q/64, so
    // 128 * s is the same float as 64 times that sum: the same bits, one LOP3 fewer a word.)
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < 2; w++) {
      const uint32_t la = r.la[w], lb = r.lb[w], h = r.h[w];
      const uint32_t v[4] = {((la << 1) & 0x1E1E1E1Eu) | ((h << 5) & 0x60606060u),
                             ((lb << 1) & 0x1E1E1E1Eu) | ((h << 3) & 0x60606060u),
                             ((la >> 3) & 0x1E1E1E1Eu) | ((h << 1) & 0x60606060u),
                             ((lb >> 3) & 0x1E1E1E1Eu) | ((h >> 1) & 0x60606060u)};
#pragma unroll
      for (int qd = 0; qd < 4; qd++)
#pragma unroll
        for (int k = 0; k < 4; k++) s[qd] = fmaf(x[8 * qd + 4 * w + k], nib16(v[qd], k), s[qd]);
    }
    const float d = __half2float(__ushort_as_half(r.d));
    const uint32_t sc = r.sc ^ 0x80808080u;  // int8 + 128 a byte
    float y = 0.f;
#pragma unroll
    for (int qd = 0; qd < 4; qd++) y += __fmul_rn(d, magic(sc, qd) - 8388736.f) * (128.f * s[qd] - 96.f * sx[qd]);
    return y;
  }
};

// A weight row's place in a ring slot (k_qgemv): its slice, the lead before it in its first
// 16-byte granule (at most 14 bytes: rows are 2-byte aligned) and the last granule's rest.
__host__ __device__ constexpr int qgemvSlotRow(int slice) { return (slice + 14 + 15) / 16 * 16; }

// One block: KS warps, a lane one tile of the activation row (its activations stay in registers
// for the block's whole run), over `per` consecutive outputs [o0, o0 + per), NW weight rows an
// iteration. Each warp streams its own slice of the rows (the blocks its lanes' tiles lie in)
// through a ring of `stages` slots in shared memory, filled with 16-byte cp.async granules
// stages - 1 iterations ahead of the one it reduces: the loads in flight cost no registers, and a
// warp waits only for its own copies (no block barrier an iteration, so warps drift and hide each
// other's latency). A slice need not be 16-byte aligned (Q6_K's 210-byte blocks): it is copied
// from the granule holding its first byte, `lead` bytes before it, and its last granule copies
// only the slice's bytes (cp.async's source size; the rest is zero-filled). (A lead's bytes lie at
// or after the 16-byte boundary below the weight's own first byte, so inside its allocation, whose
// start is aligned.) Each lane thus issues one or two copies a row, not a 2- or 8-byte copy per
// 8 bytes. The first slots are filled before the dependency wait (weights only). Per output, the
// warps' sums meet in shared memory; the epilogue (k_gemv_generic's: bias, GLU, accumulate, bf16
// numerics' rounding) runs once all outputs are summed. GLU: an output reads its gate row o and its up row outDim + o.
// Output o lands at out[r * ldo + oOff + o] (a weight tail's launch writes past the head's).
template <int DT, int KS, bool GLU>
__global__ void __launch_bounds__(32 * KS) k_qgemv(const float* __restrict__ x, const uint8_t* __restrict__ w, float* out,
                                                     int rows, int inDim, int outDim, int per, const void* bias, int bdt,
                                                     int acc, int bfa, int ldo, int oOff, int stages, int accPre) {
  NERVA_TRACE_KERNEL();
  using T = QTile<DT>;
  constexpr int NW = 4;                 // weight rows an iteration (the butterfly below takes four)
  constexpr int P = GLU ? NW / 2 : NW;  // outputs an iteration
  constexpr int TPB = DT == NV_Q6_K ? 8 : 1;  // tiles a block
  constexpr int SLICE = 32 / TPB * T::BYTES;  // a full warp's bytes of one row
  constexpr int SLOTW = qgemvSlotRow(SLICE);  // a row's place in a slot: the slice, its lead, a last partial granule
  constexpr bool RING = T::RING;
  extern __shared__ __align__(16) uint8_t sm[];
  const int stride = per * (GLU ? 2 : 1);
  float* part = reinterpret_cast<float*>(sm);  // [KS][stride]
  const int tiles = inDim / T::ELEMS;
  const int rowBytes = tiles / TPB * T::BYTES;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // This warp's ring, [stages][NW][SLOTW], after the partial sums.
  uint8_t* ring = sm + (((size_t)KS * stride * sizeof(float) + 15) & ~(size_t)15) + (size_t)warp * stages * NW * SLOTW;
  const int r = blockIdx.x % rows;
  const int o0 = (blockIdx.x / rows) * per;
  const int n = min(per, outDim - o0);
  const int iters = (n + P - 1) / P;
  const int t = threadIdx.x;
  const bool mine = t < tiles;
  const int sliceOff = warp * SLICE, sliceBytes = max(0, min(32, tiles - 32 * warp)) / TPB * T::BYTES;
  // The register-streamed tiles' weight row k of the iteration at output i (a row past the
  // block's outputs reads its first one, never used). GLU: rows k < P are gates of outputs i + k,
  // rows k >= P their up rows.
  auto rowOf = [&](int i, int k) -> const uint8_t* {
    const int j = GLU ? i + k % P : i + k;
    const int o = o0 + (j < n ? j : 0);
    return w + (size_t)(GLU && k >= P ? outDim + o : o) * rowBytes;
  };
  // The warp's slices are addressed from running bases, in the shared window once (not a
  // generic-to-shared conversion a copy): iteration it's row k is base + (k % P) * rowBytes (+ the
  // up rows' offset with GLU). A row past the block's outputs is not copied; its slot row is read
  // and reduced, and its sum never stored.
  const size_t upBytes = GLU ? (size_t)outDim * rowBytes : 0;
  const uint8_t* issueBase = w + sliceOff + (size_t)o0 * rowBytes;
  const unsigned ringLane = (unsigned)__cvta_generic_to_shared(ring) + lane * 16;
  auto rowOff = [&](int k) -> size_t { return (size_t)(k % P) * rowBytes + (GLU && k >= P ? upBytes : 0); };
  // The next iteration's slices into slot `slot`, one commit group (committed even when empty, so
  // wait_group's count holds at the tail).
  auto issue = [&](int it, int slot) {
    if (it < iters && sliceBytes > 0) {
      const unsigned dst = ringLane + (unsigned)(slot * NW * SLOTW);
#pragma unroll
      for (int k = 0; k < NW; k++) {
        if (it * P + k % P >= n) continue;
        const uint8_t* src = issueBase + rowOff(k);
        const int lead = (int)(reinterpret_cast<uintptr_t>(src) & 15);
        const uint8_t* g0 = src - lead + lane * 16;      // the lane's first granule
        const int span = lead + sliceBytes - lane * 16;  // bytes from it to the slice's end
#pragma unroll
        for (int u = 0; u < (SLOTW + 511) / 512; u++)  // (span <= SLOTW: a lane's granules, known at compile time)
          if (u * 512 < span)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst + k * SLOTW + u * 512), "l"(g0 + u * 512),
                         "r"(min(16, span - u * 512))
                         : "memory");
      }
    }
    issueBase += (size_t)P * rowBytes;
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  T tile;
  // accPre: the values this block accumulates into, read before the wait.
  const QPre pre = qgemvPre(accPre && acc, n, out, r, ldo, oOff, o0);
  // Iteration it's four rows reduced: the warp's partial sums into `part`.
  auto reduce = [&](const typename T::Raw(&raw)[NW], int it) {
    float v[NW];
#pragma unroll
    for (int k = 0; k < NW; k++) v[k] = mine ? tile.dot(raw[k], lane) : 0.f;
    // The four rows' warp sums at once (a butterfly: 6 shuffles instead of 20): after the xor-16
    // and xor-8 steps each lane holds one row's partial (row (lane >> 3)), then three more steps.
    const bool b4 = (lane & 16) != 0, b3 = (lane & 8) != 0;
    float k0 = b4 ? v[2] : v[0], k1 = b4 ? v[3] : v[1];
    k0 += __shfl_xor_sync(0xffffffffu, b4 ? v[0] : v[2], 16);
    k1 += __shfl_xor_sync(0xffffffffu, b4 ? v[1] : v[3], 16);
    float y = b3 ? k1 : k0;
    y += __shfl_xor_sync(0xffffffffu, b3 ? k0 : k1, 8);
    y += __shfl_xor_sync(0xffffffffu, y, 4);
    y += __shfl_xor_sync(0xffffffffu, y, 2);
    y += __shfl_xor_sync(0xffffffffu, y, 1);
    if ((lane & 7) == 0) {
      const int i = it * P, k = lane >> 3, j = k % P;  // weight row k: output i + j (GLU: k >= P its up row)
      if (i + j < n) part[warp * stride + (GLU ? 2 * (i + j) + (k >= P ? 1 : 0) : i + j)] = y;
    }
  };
  if constexpr (RING) {
    // Slots in turn: `next` is the one the next issue fills, `cur` the one reduced.
    int next = 0;
    for (int s = 0; s < stages - 1; s++, next++) issue(s, next);
    pdlWait();
    pdlTrigger();
    if (mine) tile.load(x + (size_t)r * inDim, t);
    // The low bits of iteration it's first row (its rows' leads, mod 16).
    unsigned readLo = (unsigned)reinterpret_cast<uintptr_t>(w + sliceOff + (size_t)o0 * rowBytes);
    for (int it = 0, cur = 0; it < iters; it++, readLo += (unsigned)(P * rowBytes)) {
      // Iteration it's copies have landed for this lane; after the warp barrier, for the warp's
      // lanes, which are also all done with the slot the next issue refills (iteration it - 1's).
      cpWait(stages - 2);
      __syncwarp();
      issue(it + stages - 1, next);
      next = next + 1 == stages ? 0 : next + 1;
      const uint8_t* slot = ring + (size_t)cur * NW * SLOTW;
      cur = cur + 1 == stages ? 0 : cur + 1;
      typename T::Raw raw[NW];
      if (mine)
#pragma unroll
        for (int k = 0; k < NW; k++) {
          // The row's lead: where its slice starts in its first granule (mod 16: 32-bit arithmetic).
          const unsigned lead = (readLo + (unsigned)rowOff(k)) & 15u;
          T::fetch(raw[k], slot + k * SLOTW + lead, lane);
        }
      reduce(raw, it);
    }
  } else {
    // Two register buffers, used in turn (named, not indexed: an indexed pair would live on the
    // stack); iteration it + 1's rows are loaded while iteration it's are reduced.
    typename T::Raw ra[NW], rb[NW];
    auto fetch = [&](typename T::Raw(&dst)[NW], int it) {
      if (mine && it < iters)
#pragma unroll
        for (int k = 0; k < NW; k++) T::fetch(dst[k], rowOf(it * P, k), t);
    };
    fetch(ra, 0);
    pdlWait();
    pdlTrigger();
    if (mine) tile.load(x + (size_t)r * inDim, t);
    for (int it = 0; it < iters; it += 2) {
      fetch(rb, it + 1);
      reduce(ra, it);
      if (it + 1 < iters) {
        fetch(ra, it + 2);
        reduce(rb, it + 1);
      }
    }
  }
  __syncthreads();
  qgemvEpilogue<GLU>(part, KS, stride, n, o0, bias, bdt, acc, bfa, out, r, ldo, oOff, pre);
}

// Launches k_qgemv<DT, KS, GLU> with `smem` dynamic bytes (opted in above 48 KiB).
template <int DT, int KS, bool GLU>
int qgemvKernel(NervaExec* ex, unsigned grid, size_t smem, const float* x, const uint8_t* w, float* out, int rows, int inDim,
                int outDim, int per, Buf bias, int acc, int bfa, int ldo, int oOff, int stages, int accPre) {
  auto fn = k_qgemv<DT, KS, GLU>;
  if (allowDynamicSmem(fn, smem) != cudaSuccess) {
    cudaGetLastError();
    return bad(ex, "matmul: the quantized GEMV's shared memory could not be raised");
  }
  LAUNCH(fn, grid, 32 * KS, smem, x, w, out, rows, inDim, outDim, per, bias.p, bias.dt, acc, bfa, ldo, oOff, stages, accPre);
  return NERVA_OK;
}

template <int DT, bool GLU>
int qgemvLaunch(NervaExec* ex, int warps, const float* x, const uint8_t* w, float* out, int rows, int inDim, int outDim,
                Buf bias, int acc, int ldo, int oOff, int accPre) {
  const int bfa = ex->bf16act ? 1 : 0;
  // The kernel's warps a block: one a lane's tile, rounded up to a compiled width.
  const int ks = warps > 12 ? 16 : warps > 8 ? 12 : warps > 4 ? 8 : warps;
  // Outputs a block: enough blocks for ~16 warps an SM (blocksPerSm blocks of ks warps), each
  // block at least 4 and at most 64 outputs (its activations are loaded once for all of them).
  const int blocksPerSm = std::max(1, 16 / ks);
  int per = (int)std::min<long long>(64, std::max<long long>(4, (long long)outDim * rows / ((long long)ex->smCount * blocksPerSm)));
  per = (per + 3) & ~3;
  const size_t chunks = (size_t)(outDim + per - 1) / per;
  const size_t partBytes = ((size_t)ks * per * (GLU ? 2 : 1) * sizeof(float) + 15) & ~(size_t)15;
  // The rings: the blocks an SM holds (~16 warps' worth) share ~200 KiB of shared memory; 2 to 8
  // slots of four weight rows' slices each.
  const int tpb = DT == NV_Q6_K ? 8 : 1;
  const size_t blockBytes = nvBytes(DT, nvQuantBlockElems(DT));
  const size_t slotBytes = (size_t)ks * 4 * qgemvSlotRow((int)((32 / tpb) * blockBytes));
  const size_t budget = std::min<size_t>((size_t)ex->smemOptin, (size_t)200 * 1024 / blocksPerSm);
  if (QTile<DT>::RING && partBytes + 2 * slotBytes > (size_t)ex->smemOptin) return bad(ex, "matmul: a quantized weight's rows are too long for the GEMV's shared memory");
  const int stages = (int)std::max<size_t>(2, std::min<size_t>(8, budget > partBytes ? (budget - partBytes) / slotBytes : 2));
  const size_t smem = partBytes + (QTile<DT>::RING ? (size_t)stages * slotBytes : 0);
  // Row-major in the grid (row fastest): the blocks of one weight chunk run together and the
  // chunk is read once from memory for all rows.
  for (int r0 = 0; r0 < rows;) {
    const int nr = (int)std::min<size_t>((size_t)(rows - r0), (size_t)0x7fffffff / chunks);
    const unsigned grid = (unsigned)(chunks * nr);
    const float* xr = x + (size_t)r0 * inDim;
    float* orow = out + (size_t)r0 * ldo;
    int rc;
#define QK(KS_) qgemvKernel<DT, KS_, GLU>(ex, grid, smem, xr, w, orow, nr, inDim, outDim, per, bias, acc, bfa, ldo, oOff, stages, accPre)
    switch (ks) {
      case 16: rc = QK(16); break;
      case 12: rc = QK(12); break;
      case 8: rc = QK(8); break;
      case 4: rc = QK(4); break;
      case 3: rc = QK(3); break;
      case 2: rc = QK(2); break;
      default: rc = QK(1); break;
    }
#undef QK
    if (rc) return rc;
    r0 += nr;
  }
  return NERVA_OK;
}

// A matmul over a quantized weight: the norm (when fused) into the workspace first, then the GEMV.
int qgemvRun(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias, const Fuse& f) {
  const int be = nvQuantBlockElems(w.dt);
  if (inDim % be != 0) return bad(ex, "matmul: a quantized weight's rows must be whole blocks (inDim a multiple of the block)");
  if (((uintptr_t)x & 15) != 0) return bad(ex, "matmul: x must be 16-byte aligned for a quantized weight");
  if (w.dt == NV_Q4_K && ((uintptr_t)w.p & 15) != 0) return bad(ex, "matmul: a Q4_K weight must be 16-byte aligned");
  if (((uintptr_t)w.p & 1) != 0) return bad(ex, "matmul: a quantized weight must be 2-byte aligned");
  if (f.tail.p && (f.tailFrom < 0 || f.tailFrom > outDim)) return bad(ex, "matmul: tailFrom must be in [0, outDim]");
  // Prefill: tensor-core GEMMs over dequantized chunks (not batch-invariant, which keeps every
  // row count on the GEMV below; nor bf16 numerics, whose roundings the GEMV applies).
  if (rows > 8 && ex->cublas && ex->gemmMode != GEMM_GEMV && !ex->batchInv && !ex->bf16act) {
    const int rc = qgemmRows(ex, x, w, out, rows, inDim, outDim, bias, f);
    if (rc != NERVA_BAD_ARGS) return rc;
  }
  const float* xr = x;
  // A Q4_K matrix normalizes its activations itself (one kernel, not two). With a tail of another
  // type, its first block per row also writes the normalized rows to the workspace, which the
  // tail's GEMV (launched after it) reads; any other fused norm runs as its own kernel first.
  const size_t xnBytes = (size_t)rows * inDim * sizeof(float);
  const uintptr_t wsLo = (uintptr_t)ex->ws, xLo = (uintptr_t)x;
  const bool apart = xLo + xnBytes <= wsLo || wsLo + xnBytes <= xLo;  // x is not the workspace it would write
  const bool normInQ4k = f.nw.p && w.dt == NV_Q4_K && (!f.tail.p || (f.tailFrom > 0 && xnBytes <= ex->wsBytes && apart));
  float* xn = nullptr;
  if (f.nw.p && !normInQ4k) {
    if (xnBytes > ex->wsBytes) return bad(ex, "fused_matmul: workspace too small");
    // A thread per 4 elements (up to 1024): each thread's loop is a few loads long, not 16 loads
    // waited for one by one (256 threads took 12.5 us a 4096-element row on the H200).
    const int threads = std::min(1024, std::max(32, (inDim / 4 + 31) / 32 * 32));
    int rc = launchRmsnorm(ex, rows, threads, x, f.nw.p, f.nw.dt, (float*)ex->ws, nullptr, inDim, f.eps, nullptr, nullptr, true);
    if (rc) return rc;
    xr = (const float*)ex->ws;
  } else if (normInQ4k && f.tail.p) {
    xn = (float*)ex->ws;
  }
  // Warps enough for a lane a tile (32 elements): a lane holds one tile's activations.
  const int tiles = inDim / 32;
  if (tiles > 16 * 32) return bad(ex, "matmul: a quantized weight's rows may hold at most 16384 elements");
  // (Warps past the row's tiles would only add zeros: 12 for a 12288-element row, not 16.)
  const int ks = (tiles + 31) / 32;
  const int acc = f.accumulate ? 1 : 0;
  // Fuse::accPre holds for a matmul of one kernel: none with a tail (two GEMVs) or with a norm
  // kernel of its own before the GEMV. (Fuse::early is not taken: the next quantized GEMV's blocks
  // launched at this one's entry cost more than their early loads gain; H200, 0.6B Q4_K_M,
  // 1302-1310 tok/s against 1495-1508.)
  const int accPre = !f.tail.p && (!f.nw.p || normInQ4k) && f.accPre ? 1 : 0;
  // Outputs [o0, o1) from w's rows (a tail's rows count from tailFrom), reading activations `in`;
  // `norm` set (a Q4_K part only): the kernel normalizes `in` itself, writing the result to xn.
  auto part = [&](Buf wt, int o0, int o1, const float* in, bool norm) -> int {
    if (o1 <= o0) return NERVA_OK;
    const uint8_t* wp = (const uint8_t*)wt.p;
    const int n = o1 - o0;
#define QD(DT_)                                                                                           \
  return f.glu ? qgemvLaunch<DT_, true>(ex, ks, in, wp, out, rows, inDim, n, bias, acc, outDim, o0, accPre) \
               : qgemvLaunch<DT_, false>(ex, ks, in, wp, out, rows, inDim, n, bias, acc, outDim, o0, accPre)
    switch (wt.dt) {
      case NV_Q8_0: QD(NV_Q8_0);
      case NV_Q4_0: QD(NV_Q4_0);
      case NV_Q4_K:
        return q4kMmaRun(ex, in, wp, out, rows, inDim, n, bias, acc, f.glu, outDim, o0, norm ? f.nw : Buf{nullptr, 0}, f.eps,
                         norm ? xn : nullptr, accPre);
      case NV_Q6_K: QD(NV_Q6_K);
      default: return bad(ex, "matmul: unknown quantized weight dtype");
    }
#undef QD
  };
  // w's part reads x and normalizes it itself (normInQ4k), else the normalized copy xr.
  const float* wIn = normInQ4k ? x : xr;
  if (!f.tail.p) return part(w, 0, outDim, wIn, normInQ4k);
  if (f.tailFrom < 0 || f.tailFrom > outDim) return bad(ex, "matmul: tailFrom must be in [0, outDim]");
  if (inDim % nvQuantBlockElems(f.tail.dt) != 0) return bad(ex, "matmul: a quantized weight's rows must be whole blocks (inDim a multiple of the block)");
  if (f.tail.dt == NV_Q4_K && ((uintptr_t)f.tail.p & 15) != 0) return bad(ex, "matmul: a Q4_K weight must be 16-byte aligned");
  if (((uintptr_t)f.tail.p & 1) != 0) return bad(ex, "matmul: a quantized weight must be 2-byte aligned");
  const int rc = part(w, 0, f.tailFrom, wIn, normInQ4k);
  // The tail reads the rows w's part normalized (xn), or the workspace's normalized copy.
  return rc ? rc : part(f.tail, f.tailFrom, outDim, xn ? xn : xr, false);
}

}  // namespace nerva::ops
