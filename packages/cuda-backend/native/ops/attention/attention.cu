// Op attention: which attention form runs a call (bf16 eager, cluster decode, prefill tiles on
// tensor cores, split-KV), by numerics, shapes and rows.
#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/attention/attn_common.cuh"
#include "ops/ops.h"

namespace nerva::ops {

int attentionRun(NervaExec* ex, const float* qPtr, Buf kc, Buf vc, float* outPtr, Buf bt, Buf rowSeq, Buf pos, int rows,
                 int H, int KVH, int hd, int bs, int mbps, int qStride, int qOff, float scale, int decodeOnly,
                 const RopeFuse* rope, int window, float* lse, int oneSeq, int maxKeys) {
  if (hd <= 0 || hd > 256) return bad(ex, "attention: headDim must be in 1..256");
  if (KVH <= 0 || H % KVH != 0) return bad(ex, "attention: numHeads must be a multiple of numKvHeads");
  if (kc.dt != vc.dt) return bad(ex, "attention: kCache and vCache dtypes differ");
  if (window < 0) return bad(ex, "attention: window must be >= 0");
  if ((window > 0 || lse) && (decodeOnly || rope)) return bad(ex, "attention: window and lse are not for the decoder stack");
  if (rows <= 0) return NERVA_OK;
  if (ex->bf16act) {
    // Eager bf16 attention rounds the probabilities of the whole row: no partial form.
    if (lse) return bad(ex, "attention: partial attention (lse) is defined for exact numerics only");
    return attnEager(ex, qPtr, kc, vc, outPtr, bt, rowSeq, pos, rows, H, KVH, hd, bs, mbps, qStride, qOff, scale, window);
  }
  // Decode rows with the fused rope whose keys the caller bounds: the cluster kernel.
  const int sa = attnShortTry(ex, qPtr, kc, vc, outPtr, bt, rowSeq, pos, rows, H, KVH, hd, bs, mbps, qStride, qOff, scale,
                              decodeOnly, rope, maxKeys);
  if (sa >= 0) return sa;
  // Tiles of 64 rows of one sequence (prefill chunks) run on tensor cores; the split-KV kernel
  // below skips their rows. One sequence (the caller's promise): every 64 rows are a tile, the
  // partial last one too, and no row is left. Several: the tile plan cuts each run of at least 64
  // rows of one sequence into tiles from its first row (what the run gets alone), and the rows
  // of shorter runs go to the split-KV kernel (as they do alone). The tile kernels read q in
  // pairs of floats: even q strides and offsets (every q the engine lays out); others take the
  // split-KV kernel for every row, as do calls past the plan's rows.
  const unsigned char* covered = nullptr;
  if (!decodeOnly && !rope && rows >= PF_ROWS && (kc.dt == NV_F32 || kc.dt == NV_BF16) && (hd == 64 || hd == 128) &&
      qStride % 2 == 0 && qOff % 2 == 0 && (oneSeq || rows <= ex->planRows)) {
    if (!oneSeq) {
      int rc = attnTilePlan(ex, (const int*)rowSeq.p, rows);
      if (rc) return rc;
    }
    int rc = attnPrefillTiles(ex, hd, qPtr, kc, vc, bt, rowSeq, pos, outPtr, rows, H, KVH, bs, mbps, qStride, qOff, scale,
                              window, lse, oneSeq);
    if (rc) return rc;
    if (oneSeq) return NERVA_OK;
    covered = ex->tileCovered;
  }
  return attnSplitKv(ex, qPtr, kc, vc, outPtr, bt, rowSeq, pos, rows, H, KVH, hd, bs, mbps, qStride, qOff, scale, decodeOnly,
                     rope, window, lse, covered);
}

int opAttention(NervaExec* ex, Args& A) {
  Buf q = buf(A), kc = buf(A), vc = buf(A), out = buf(A), bt = buf(A), rowSeq = buf(A), pos = buf(A);
  int rows = A.num(), H = A.num(), KVH = A.num(), hd = A.num(), bs = A.num(), mbps = A.num(), qStride = A.num(),
      qOff = A.num();
  float scale = (float)A.next();
  int window = A.num();
  Buf lse = buf(A);
  int oneSeq = A.num();
  if (!A.ok) return bad(ex, "attention: argument count");
  return attentionRun(ex, (const float*)q.p, kc, vc, (float*)out.p, bt, rowSeq, pos, rows, H, KVH, hd, bs, mbps, qStride,
                      qOff, scale, 0, nullptr, window, (float*)lse.p, oneSeq);
}

}  // namespace nerva::ops
