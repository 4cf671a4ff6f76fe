// Ops matmul and fused_matmul: which kernel family runs a matmul (GEMV, cuBLAS, cuBLASLt pinned,
// k_gemm_bi).
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/ops.h"

namespace nerva::ops {

// Past 8 rows the GEMV reads the weights once per 8 rows; a tensor-core GEMM reads them once: rows
// past 8 go to cuBLAS. Batch-invariant decode instead takes one GEMM at every row count (1
// included): the shape's pinned cuBLASLt algorithm where cuBLASLt loaded and pinned one, else
// k_gemm_bi (its choice depends on the shapes and alignment alone, so a row takes the same kernel
// at any row count); each gives different bits, each row-independent. Shapes neither takes run
// on the GEMV, whose per-row reduction order (the lanes' k chunks, the warp sum, the KS split) is
// the same for any R, so each row's result is the one it gets alone.
int matmulRows(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias,
               const Fuse& fIn) {
  // embed: gathered by the lean kernel, or by k_embedding into x before whatever runs the call.
  Fuse f = fIn;
  bool gather = false;
  // A deferred epilogue whose out is x: every path but gemmRowsBlas's norm needs it applied first.
  auto flush = [&]() { return flushEpilogue(ex, f.pending); };
  if (f.embTable) {
    int rc = flush();
    if (rc) return rc;
    gather = f.embDt == NV_BF16 && ((uintptr_t)f.embTable & 7) == 0 && gemvLeanNormOneRow(ex, x, w, rows, inDim, outDim, f);
    if (!gather) {
      int rc = launchEmbedding(ex, f.embTable, f.embDt, f.embIds, (float*)x, rows, inDim);
      if (rc) return rc;
    }
    f.embTable = nullptr;
  }
  if (f.tail.p && !(nvIsQuant(w.dt) && nvIsQuant(f.tail.dt)))
    return bad(ex, "matmul: a weightTail needs both parts block-quantized");
  if (nvIsQuant(w.dt)) {
    int rc = flush();
    return rc ? rc : qgemvRun(ex, x, w, out, rows, inDim, outDim, bias, f);
  }
  bool pinned = false;
  if (ex->batchInv && ex->lt && ex->cublas && ex->gemmMode != GEMM_GEMV && w.dt == NV_BF16) {
    const int pin = nerva_lt_pinned(ex, outDim * (f.glu ? 2 : 1), inDim);
    if (pin < 0) return NERVA_CUBLAS_FAILED;
    pinned = pin == 1;
  }
  if ((ex->batchInv ? pinned : rows > 8) && ex->cublas && ex->gemmMode != GEMM_GEMV && w.dt == NV_BF16) {
    int rc = gemmRowsBlas(ex, x, w, out, rows, inDim, outDim, bias, f, pinned);
    // BAD_ARGS here: one row does not fit the workspace (whatever the row count, so a
    // batch-invariant row still takes one path), the kernels below take it.
    if (rc != NERVA_BAD_ARGS) return rc;
  }
  if (int rc = flush()) return rc;
  const bool nwOk = !f.nw.p || ((f.nw.dt == NV_BF16 || f.nw.dt == NV_F32) && ((uintptr_t)f.nw.p & 15) == 0);
  const bool fast = w.dt == NV_BF16 && inDim % 8 == 0 && ((uintptr_t)w.p & 15) == 0 && ((uintptr_t)x & 15) == 0 && nwOk;
  if (ex->batchInv && fast && inDim % 16 == 0 && (!f.nw.p || (size_t)inDim * sizeof(float) <= ex->wsBytes))
    return gemmBiRows(ex, x, w, out, rows, inDim, outDim, bias, f);
  return gemvRun(ex, x, w, out, rows, inDim, outDim, bias, f, fIn, gather);
}

int opMatmul(NervaExec* ex, Args& A) {
  Buf x = buf(A), w = buf(A), out = buf(A), bias = buf(A);
  int rows = A.num(), inDim = A.num(), outDim = A.num();
  double wOff = A.next();
  Fuse f;
  f.tail = buf(A);
  f.tailFrom = A.num();
  f.accumulate = A.num() != 0;
  if (!A.ok) return bad(ex, "matmul: argument count");
  if (f.tail.p && wOff != 0) return bad(ex, "matmul: weightTail is not allowed with weightOffset");
  if (nvIsQuant(w.dt) && (size_t)wOff % nvQuantBlockElems(w.dt) != 0) return bad(ex, "matmul: weightOffset must be whole blocks");
  w.p = (char*)w.p + nvBytes(w.dt, (size_t)wOff);
  if (rows <= 0 || outDim <= 0) return NERVA_OK;
  bool useBlas = rows > 8 && ex->gemmMode != GEMM_GEMV && ex->cublas && w.dt == NV_BF16 && !f.tail.p;
  if (x.dt == NV_BF16 && !useBlas) return bad(ex, "matmul: a bf16 x needs the GEMM path (more than 8 rows, cuBLAS, bf16 weights)");
  if (useBlas) return gemmCublas(ex, x.p, x.dt == NV_BF16, w, (float*)out.p, rows, inDim, outDim, bias, f.accumulate);
  return matmulRows(ex, (const float*)x.p, w, (float*)out.p, rows, inDim, outDim, bias, f);
}

// fused_matmul: the GEMV kernels up to 8 rows, a cuBLAS GEMM with a fused epilogue beyond (batched decode).
int opFusedMatmul(NervaExec* ex, Args& A) {
  Buf x = buf(A), w = buf(A), out = buf(A), bias = buf(A);
  Fuse f;
  f.nw = buf(A);
  int rows = A.num(), inDim = A.num(), outDim = A.num();
  f.eps = (float)A.next();
  f.glu = A.num() != 0;
  f.accumulate = A.num() != 0;
  f.tail = buf(A);
  f.tailFrom = A.num();
  if (!A.ok) return bad(ex, "fused_matmul: argument count");
  if (f.tail.p && f.glu) return bad(ex, "fused_matmul: weightTail is not allowed with glu");
  if (f.glu && bias.p) return bad(ex, "fused_matmul: bias is not allowed with glu");
  if (rows <= 0 || outDim <= 0) return NERVA_OK;
  return matmulRows(ex, (const float*)x.p, w, (float*)out.p, rows, inDim, outDim, bias, f);
}


}  // namespace nerva::ops
