// Matmuls over ggml block-quantized weights (Q8_0, Q4_0, Q6_K; Q4_K rows go to q4k_mma.cu): a GEMV
// that streams each weight block once from memory and dequantizes it in registers against float32
// activations (the kernel's body: qgemv_block.cuh), and its launchers.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/ops.h"
#include "ops/qgemv_block.cuh"

namespace nerva::ops {

// One block of the float GEMV (qgemv_block.cuh: its tiles, ring and epilogue).
template <int DT, int KS, bool GLU>
__global__ void __launch_bounds__(32 * KS) k_qgemv(const float* __restrict__ x, const uint8_t* __restrict__ w, float* out,
                                                     int rows, int inDim, int outDim, int per, const void* bias, int bdt,
                                                     int acc, int bfa, int ldo, int oOff, int stages, int accPre) {
  NERVA_TRACE_KERNEL();
  extern __shared__ __align__(16) uint8_t sm[];
  qgemvBlock<DT, KS, GLU>(
      threadIdx.x, blockDim.x, blockIdx.x, sm, x, w, out, rows, inDim, outDim, per, bias, bdt, acc, bfa, ldo, oOff, stages, accPre,
      [] {
        pdlWait();
        pdlTrigger();
      },
      [] { __syncthreads(); });
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
int qgemvLaunch(NervaExec* ex, int ks, const float* x, const uint8_t* w, float* out, int rows, int inDim, int outDim,
                Buf bias, int acc, int ldo, int oOff, int accPre) {
  const int bfa = ex->bf16act ? 1 : 0;
  // Outputs a block: enough blocks for ~16 warps an SM, each block at least 4 and at most 64
  // outputs (its activations are loaded once for all of them).
  const long long warpsWanted = (long long)ex->smCount * 16;
  int per = (int)std::min<long long>(64, std::max<long long>(4, (long long)outDim * ks * rows / warpsWanted));
  per = (per + 3) & ~3;
  const size_t chunks = (size_t)(outDim + per - 1) / per;
  const size_t partBytes = ((size_t)ks * per * (GLU ? 2 : 1) * sizeof(float) + 15) & ~(size_t)15;
  // The rings: the blocks an SM holds (~16 warps' worth) share ~200 KiB of shared memory; 2 to 8
  // slots of four weight rows' slices each.
  const int tpb = DT == NV_Q6_K ? 8 : 1;
  const size_t blockBytes = nvBytes(DT, nvQuantBlockElems(DT));
  const size_t slotBytes = (size_t)ks * 4 * qgemvSlotRow((int)((32 / tpb) * blockBytes));
  const int blocksPerSm = std::max(1, 16 / ks);
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
    if (ks >= 16) rc = QK(16);
    else if (ks >= 8) rc = QK(8);
    else if (ks >= 4) rc = QK(4);
    else if (ks >= 2) rc = QK(2);
    else rc = QK(1);
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
  int ks = 1;
  while (ks * 32 < tiles) ks *= 2;
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
  // One row of a normed Q4_K head with a Q6_K tail (Q4_K_M's qkv where v is Q6_K): one launch,
  // the tail's blocks on the SMs the head's leave, normalizing the row themselves (the same bits).
  if (rows == 1 && f.nw.p && !f.glu && !acc && !ex->batchInv && w.dt == NV_Q4_K && f.tail.dt == NV_Q6_K && f.tailFrom > 0 &&
      q4kTailFits(ex, (const uint8_t*)w.p, inDim, f.tailFrom, outDim))
    return q4kTailRun(ex, x, (const uint8_t*)w.p, (const uint8_t*)f.tail.p, out, inDim, f.tailFrom, outDim, bias, f.nw, f.eps);
  const int rc = part(w, 0, f.tailFrom, wIn, normInQ4k);
  // The tail reads the rows w's part normalized (xn), or the workspace's normalized copy.
  return rc ? rc : part(f.tail, f.tailFrom, outDim, xn ? xn : xr, false);
}

}  // namespace nerva::ops
