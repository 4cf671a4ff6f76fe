// Op decoder_layers: the dense decoder layers of a decode step, each the per-op path's
// composition (fused_matmul, rope_append, attention) as separate kernels, with the fusions only
// this sequence allows (the embedding gathered by the first qkv, rope_append folded into the
// attention, early triggers between the projections, bf16 operand hand-offs between GEMMs).
#include <vector>

#include "common/elem.cuh"
#include "common/exec.cuh"
#include "ops/ops.h"

namespace nerva::ops {

// One layer's buffers, as the arguments give them.
struct LayerBufs {
  Buf attnNorm, qkv, qkvTail, qkvBias, qNorm, kNorm, o, oBias, mlpNorm, gateUp, down, kc, vc;
};

int opDecoderLayers(NervaExec* ex, Args& A) {
  Buf x = buf(A), qkv = buf(A), attn = buf(A), mlp = buf(A), pos = buf(A), slots = buf(A), bt = buf(A),
      rowSeq = buf(A), inv = buf(A);
  int rows = A.num(), hidden = A.num(), nq = A.num(), nkv = A.num(), hd = A.num(), inter = A.num(), bs = A.num(),
      mbps = A.num();
  float eps = (float)A.next(), scale = (float)A.next();
  // An upper bound on every row's keys (position + 1) while this call, or a graph captured with
  // it, runs; 0: none known. Decode attention picks its kernel by it.
  const int maxKeys = A.num();
  // A lower bound on every row's keys likewise; 0: none known. Long rows take the GQA kernel.
  const int minKeys = A.num();
  int nL = A.num();
  if (!A.ok || nL < 0) return bad(ex, "decoder_layers: argument count");
  if (maxKeys < 0) return bad(ex, "decoder_layers: maxKeys must be >= 0");
  if (minKeys < 0) return bad(ex, "decoder_layers: minKeys must be >= 0");
  std::vector<LayerBufs> Ls((size_t)nL);
  for (auto& l : Ls) {
    l.attnNorm = buf(A);
    l.qkv = buf(A);
    l.qkvTail = buf(A);
    l.qkvBias = buf(A);
    l.qNorm = buf(A);
    l.kNorm = buf(A);
    l.o = buf(A);
    l.oBias = buf(A);
    l.mlpNorm = buf(A);
    l.gateUp = buf(A);
    l.down = buf(A);
    l.kc = buf(A);
    l.vc = buf(A);
  }
  // embed: a flag, then the table and the ids (x := table[ids] before the layers).
  Buf etab{nullptr, 0}, eids{nullptr, 0};
  const int embed = A.num();
  if (embed) {
    etab = buf(A);
    eids = buf(A);
  }
  if (!A.ok) return bad(ex, "decoder_layers: argument count");
  if (embed && (!etab.p || !eids.p)) return bad(ex, "decoder_layers: embed needs a table and ids");
  if (nkv <= 0 || nq % nkv != 0) return bad(ex, "decoder_layers: numHeads must be a multiple of numKvHeads");
  if (hd <= 0 || hd % 2 != 0 || hd > 256) return bad(ex, "decoder_layers: headDim must be even and at most 256");
  for (auto& l : Ls)
    if (l.kc.dt != l.vc.dt) return bad(ex, "decoder_layers: kCache and vCache dtypes differ");
  // Nothing to fold the gather into: op embedding's kernel, then the layers (if any).
  if (embed && rows > 0 && (nL == 0 || rows != 1)) {
    int rc = launchEmbedding(ex, etab.p, etab.dt, (const int*)eids.p, (float*)x.p, rows, hidden);
    if (rc) return rc;
    etab.p = nullptr;
  }
  if (rows <= 0 || nL == 0) return NERVA_OK;
  const int qkvOut = (nq + 2 * nkv) * hd, qw = nq * hd;

  // Per layer: the per-op path (fused_matmul, rope_append, attention), as separate kernels.
  // Many rows on cuBLAS(Lt): o's and down's accumulate into x is left to the norm of the matmul
  // after it (gate_up's, the next layer's qkv), one kernel fewer each (DeferredEpilogue).
  DeferredEpilogue downEpi;
  for (auto& l : Ls) {
    Fuse fq;
    fq.pending = &downEpi;
    fq.nw = l.attnNorm;
    fq.eps = eps;
    fq.tail = l.qkvTail;
    fq.tailFrom = (nq + nkv) * hd;
    if (&l == &Ls[0] && etab.p) {
      // The first qkv gathers the row from the table itself where it runs as one lean block
      // grid (the step's embedding kernel and its boundary gone), else launches k_embedding first.
      fq.embTable = etab.p;
      fq.embDt = etab.dt;
      fq.embIds = (const int*)eids.p;
    }
    // Many rows, or rows of long contexts: the GQA kernel (each key read once for its q heads),
    // after rope_append, which takes over qkv's epilogue where the GEMM leaves it (the attention
    // then reads only q there).
    const bool gqa = attnDecodeGqaFits(ex, rows, minKeys, nq, nkv, hd, l.kc.dt, l.vc.dt);
    DeferredEpilogue qkvEpi;
    if (gqa) fq.defer = &qkvEpi;
    int rc = matmulRows(ex, (const float*)x.p, l.qkv, (float*)qkv.p, rows, hidden, qkvOut, l.qkvBias, fq);
    // Decode rows with headDim 128: rope_append's work is fused into the attention kernel.
    const bool fuseRope = !gqa && hd == 128 && !ex->bf16act && l.kc.dt == l.vc.dt &&
                          (!l.qNorm.p || !l.kNorm.p || l.qNorm.dt == l.kNorm.dt) && ex->counters &&
                          (size_t)rows * nq <= ex->counterCount;
    RopeFuse rf;
    if (fuseRope) {
      rf.invFreq = (const float*)inv.p;
      rf.qn = l.qNorm.p;
      rf.kn = l.kNorm.p;
      rf.ndt = l.qNorm.p ? l.qNorm.dt : l.kNorm.dt;
      rf.slots = (const int*)slots.p;
      rf.eps = eps;
      rf.pull = (const uint8_t*)l.o.p;
      rf.pullBytes = nvBytes(l.o.dt, (size_t)hidden * qw);
    } else if (!rc && qkvEpi.g.t) {
      rc = ropeAppendAfter(ex, &qkvEpi, pos, inv, slots, l.kc, l.vc, l.qNorm, l.kNorm, rows, nq, nkv, hd, eps);
    } else if (!rc) {
      rc = ropeAppendRun(ex, (float*)qkv.p, pos, inv, slots, l.kc, l.vc, l.qNorm, l.kNorm, rows, nq, nkv, hd, qkvOut, eps);
    }
    // Many rows on cuBLAS(Lt): the attention also splits its output into o's bf16 operand.
    SplitHandoff attnSplit;
    if (!rc && gqa)
      rc = attnDecodeGqa(ex, (const float*)qkv.p, l.kc, l.vc, (float*)attn.p, bt, rowSeq, pos, rows, nq, nkv, bs, mbps, qkvOut,
                         0, scale, &attnSplit);
    else if (!rc)
      // Decode rows: the attention streams its first keys in before waiting on rope_append.
      rc = attentionRun(ex, (const float*)qkv.p, l.kc, l.vc, (float*)attn.p, bt, rowSeq, pos, rows, nq, nkv, hd, bs, mbps,
                        qkvOut, 0, scale, 1, fuseRope ? &rf : nullptr, 0, nullptr, 0, maxKeys);
    // The residual x that o and down accumulate into was last written by down of the layer
    // before (three kernels back) and by o (two back): both read it before their wait.
    Fuse fo;
    fo.accumulate = true;
    fo.accPre = true;
    // o triggers gate_up at entry: gate_up (the layer's largest matrix) then streams its weights
    // during the attention. gate_up reads only weights before its wait, and down (accPre) still
    // starts after gate_up's wait, when o is complete.
    fo.early = true;
    fo.take = &attnSplit;
    DeferredEpilogue oEpi;
    fo.defer = &oEpi;
    if (!rc) rc = matmulRows(ex, (const float*)attn.p, l.o, (float*)x.p, rows, qw, hidden, l.oBias, fo);
    // Many rows on cuBLAS(Lt): gate_up's epilogue also splits its output into down's bf16 operand.
    SplitHandoff mlpSplit;
    Fuse fg;
    fg.nw = l.mlpNorm;
    fg.eps = eps;
    fg.glu = true;
    fg.emit = &mlpSplit;
    fg.pending = &oEpi;
    if (!rc) rc = matmulRows(ex, (const float*)x.p, l.gateUp, (float*)mlp.p, rows, hidden, inter, Buf{nullptr, 0}, fg);
    Fuse fd;
    fd.accumulate = true;
    fd.accPre = true;
    // down triggers the next layer's qkv at entry, for the same reason (qkv reads only weights
    // before its wait, and triggers the attention only after it).
    fd.early = true;
    fd.take = &mlpSplit;
    fd.defer = &downEpi;
    if (!rc) rc = matmulRows(ex, (const float*)mlp.p, l.down, (float*)x.p, rows, inter, hidden, Buf{nullptr, 0}, fd);
    if (rc) return rc;
  }
  return flushEpilogue(ex, &downEpi);
}

}  // namespace nerva::ops
