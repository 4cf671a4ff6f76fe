// The op families' entry points and the host functions one family calls in another (each family
// is its own translation unit: ops/*.cu, ops/attention/*.cu). Included by the .cu files only.
#pragma once
#include <stdint.h>

#include "common/elem.cuh"
#include "common/exec.cuh"
#include "nerva.h"

namespace nerva::ops {

// ---------------------------------------------------------------- shared structs

// Where a GEMM epilogue left the bf16 split (hi rows, then lo rows with `lo`) of its output.
struct SplitHandoff {
  const uint16_t* hi = nullptr;
  int rows = 0, dim = 0;
  bool lo = false;
};

// A bias-free many-row GEMM's epilogue left undone (Fuse::defer): g's values written (or, accumulate, added)
// to out (rows x dim) and nothing else, for the kernel that next reads out to take them from g
// itself (Fuse::pending: the next matmul's norm adds them as its residual; ropeAppendAfter):
// the same bits, one kernel fewer. g.t, in the workspace's first tEnd bytes, must stay untouched
// until then. g.t null: nothing pending.
struct DeferredEpilogue {
  GemmSum g{};
  float* out = nullptr;
  int rows = 0, dim = 0;
  bool accumulate = false;
  size_t tEnd = 0;
};

// What fused_matmul adds to a matmul (all off for op matmul).
struct Fuse {
  Buf nw{nullptr, 0};
  float eps = 0.f;
  bool glu = false;
  bool accumulate = false;
  // accumulate's current values may be read before the dependency wait: the caller guarantees
  // `out` was last written two or more kernels earlier in the stream (see k_gemv_bf16).
  bool accPre = false;
  // Trigger the next kernel at entry instead of after the wait, so it launches (and streams its
  // weights) while this one still waits; with split blocks, also the leaner block shape (see
  // ksLean). The next kernel must then read nothing before its own wait that relies on this
  // kernel's predecessors being complete (no accPre right after).
  bool early = false;
  // Operand hand-off between two many-row GEMMs (gemmRowsBlas): `emit` asks this call's epilogue
  // to also write the bf16 split of its output and says where (hi null: it did not); `take` gives
  // this call its x already split there, so it launches no split of its own.
  SplitHandoff* emit = nullptr;
  const SplitHandoff* take = nullptr;
  // Epilogue hand-off (DeferredEpilogue): `defer` lets gemmRowsBlas leave its epilogue there
  // when it has neither glu nor bias; `pending` is one whose out is this call's x, applied
  // before x is read (by gemmRowsBlas's norm where it accumulates, else launched first). Only op
  // decoder_layers sets them.
  DeferredEpilogue* defer = nullptr;
  DeferredEpilogue* pending = nullptr;
  // embed (op decoder_layers' first qkv): x := table[ids] first, the rows gathered by the GEMV
  // itself where it takes one row on k_gemv_bf16_lean (gemvLeanNormOneRow), else by k_embedding
  // launched first. table: embTable (dtype embDt), x is written either way.
  const void* embTable = nullptr;
  int embDt = 0;
  const int* embIds = nullptr;
  // weightTail (op matmul / fused_matmul, op decoder_layers' qkvTail): rows [tailFrom, outDim) of
  // the matrix in their own buffer and block type; both parts block-quantized (qgemvRun).
  Buf tail{nullptr, 0};
  int tailFrom = 0;
};

// What attention takes over from rope_append when it is fused in (ROPE): q/k norms, the rotary
// angles and the slots the new key and value are appended at.
struct RopeFuse {
  const float* invFreq = nullptr;
  const void* qn = nullptr;
  const void* kn = nullptr;
  int ndt = 0;
  const int* slots = nullptr;
  float eps = 0.f;
  // The next projection's weights (o's), asked into L2 by the attention's blocks after their wait:
  // nothing else streams while the attention runs, so o's wait finds its rows in L2.
  const uint8_t* pull = nullptr;
  unsigned long long pullBytes = 0;
};

// Warps a block of the one-row GEMV (KS warps an output when split, else 16 outputs a block):
// the norm's block size, which fixes a normalized row's bits (k_rmsnorm_gemv takes the same).
__host__ __device__ constexpr int gemvWarps(int ks) { return ks == 1 ? 16 : ks; }

// An op's launcher: decodes its arguments (src/abi.ts) and enqueues its kernels.
using OpLauncher = int (*)(NervaExec* ex, Args& A);

// ---------------------------------------------------------------- elementwise.cu
int opEmbedding(NervaExec* ex, Args& A);
int opRmsnorm(NervaExec* ex, Args& A);
int opRope(NervaExec* ex, Args& A);
int opKvAppend(NervaExec* ex, Args& A);
int opRopeAppend(NervaExec* ex, Args& A);
int opSiluMul(NervaExec* ex, Args& A);
int opAdd(NervaExec* ex, Args& A);
int opGatherRows(NervaExec* ex, Args& A);
// x := table[ids] (k_embedding), one block a row.
int launchEmbedding(NervaExec* ex, const void* table, int tdt, const int* ids, float* out, int rows, int hidden);
// k_rmsnorm over `rows` rows, `threads` a block: out (f32) and/or its bf16 split (hi, lo).
// wIsWeight: w is a model weight (no kernel of the stream writes it), so it may be read before
// the PDL wait; a caller that cannot promise that leaves it false.
int launchRmsnorm(NervaExec* ex, int rows, int threads, const float* x, const void* w, int wdt, float* out, float* residual,
                  int dim, float eps, uint16_t* hi, uint16_t* lo, bool wIsWeight = false);
// The same norm over x = a GEMM's output after its epilogue (g.value), added into residual (written
// back) first: the bits of k_gemm_epilogue's accumulate followed by launchRmsnorm on residual.
int launchRmsnormAfter(NervaExec* ex, int rows, int threads, const GemmSum& g, float* residual, const void* w, int wdt,
                       int dim, float eps, uint16_t* hi, uint16_t* lo);
int ropeAppendRun(NervaExec* ex, float* qkv, Buf pos, Buf inv, Buf slots, Buf kc, Buf vc, Buf qn, Buf kn, int rows, int nq,
                  int nkv, int hd, int rowStride, float eps);
// ropeAppendRun over d's rows (qkv = d->out, rowStride = d->dim) still in the GEMM's output: the
// epilogue's values read there, the rotated q and k written to qkv, k and v to the caches (v is
// not written to qkv). d is cleared; anything but a pending write of those rows is flushed first.
int ropeAppendAfter(NervaExec* ex, DeferredEpilogue* d, Buf pos, Buf inv, Buf slots, Buf kc, Buf vc, Buf qn, Buf kn, int rows,
                    int nq, int nkv, int hd, float eps);
// The PTX version of this build's kernels for the current device (0 when unknown).
int kernelsPtxVersion();

// ---------------------------------------------------------------- matmul.cu (which family runs a matmul)
int opMatmul(NervaExec* ex, Args& A);
int opFusedMatmul(NervaExec* ex, Args& A);
int matmulRows(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias,
               const Fuse& f = Fuse());

// ---------------------------------------------------------------- gemv.cu
// Whether the GEMV runs this call as k_gemv_bf16_lean<1, 1, true, false, 1>: the one kernel that
// gathers an embedded row itself.
bool gemvLeanNormOneRow(NervaExec* ex, const float* x, Buf w, int rows, int inDim, int outDim, const Fuse& f);
// The GEMV kernels for a call matmulRows gives them (gather: the lean kernel gathers f.embTable).
int gemvRun(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias, const Fuse& f,
            const Fuse& fIn, bool gather);
// k_rmsnorm_gemv: rows normalized with the bits of the GEMV's staged norm (threads: its block).
int launchRmsnormGemv(NervaExec* ex, int rows, int threads, const float* x, const void* nw, int nwbf, float* out, int inDim,
                      float eps);

// ---------------------------------------------------------------- qgemv.cu
// A matmul over a ggml block-quantized weight (nvIsQuant(w.dt)), any row count.
int qgemvRun(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias, const Fuse& f);
// ---------------------------------------------------------------- q4k_mma.cu
// Q4_K rows on the integer tensor cores (qgemvRun's Q4_K parts): out[r * ldo + oOff + o], o < outDim;
// nw.p set: x is RMS-normalized first (weight nw, eps) inside the kernel; xn set too: the
// normalized rows are also written there (rows x inDim floats), for a tail of another type.
// accPre: Fuse::accPre.
int q4kMmaRun(NervaExec* ex, const float* x, const uint8_t* w, float* out, int rows, int inDim, int outDim, Buf bias, int acc,
              bool glu, int ldo, int oOff, Buf nw, float eps, float* xn = nullptr, int accPre = 0);

// ---------------------------------------------------------------- gemm.cu, gemm_bi.cu
// Op matmul past 8 rows over bf16 weights: x f32 (split or rounded to bf16 first) or bf16 (xBf16).
int gemmCublas(NervaExec* ex, const void* x, bool xBf16, Buf w, float* out, int rows, int inDim, int outDim, Buf bias,
               bool accumulate);
// Many rows over a block-quantized weight (and f.tail): dequantized bf16-split chunks into cuBLAS GEMMs.
int qgemmRows(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias, const Fuse& f);
int gemmRowsBlas(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias, const Fuse& f,
                 bool pinned);
// A deferred epilogue launched (k_gemm_epilogue) and cleared; nothing when none is pending.
int flushEpilogue(NervaExec* ex, DeferredEpilogue* d);
int gemmBiRows(NervaExec* ex, const float* x, Buf w, float* out, int rows, int inDim, int outDim, Buf bias, const Fuse& f);

// ---------------------------------------------------------------- attention/
int opAttention(NervaExec* ex, Args& A);
int opAttentionMerge(NervaExec* ex, Args& A);
// decodeOnly: every row is its own sequence (op decoder_layers), see k_attn_partial.
int attentionRun(NervaExec* ex, const float* qPtr, Buf kc, Buf vc, float* outPtr, Buf bt, Buf rowSeq, Buf pos, int rows,
                 int H, int KVH, int hd, int bs, int mbps, int qStride, int qOff, float scale, int decodeOnly = 0,
                 const RopeFuse* rope = nullptr, int window = 0, float* lse = nullptr, int oneSeq = 0, int maxKeys = 0);
int attnEager(NervaExec* ex, const float* qPtr, Buf kc, Buf vc, float* outPtr, Buf bt, Buf rowSeq, Buf pos, int rows, int H,
              int KVH, int hd, int bs, int mbps, int qStride, int qOff, float scale, int window);
// k_attn_decode_short where it takes the call (returns -1 when it does not, else the status).
int attnShortTry(NervaExec* ex, const float* qPtr, Buf kc, Buf vc, float* outPtr, Buf bt, Buf rowSeq, Buf pos, int rows,
                 int H, int KVH, int hd, int bs, int mbps, int qStride, int qOff, float scale, int decodeOnly,
                 const RopeFuse* rope, int maxKeys);
// The tile plan of a many-sequence call (tile_plan.cu) into NervaExec::tiles, before its tiles run.
int attnTilePlan(NervaExec* ex, const int* rowSeq, int rows);
// Prefill tiles on tensor cores (every 64 rows under oneSeq, else the plan's tiles); the split-KV
// kernel skips the rows they cover.
int attnPrefillTiles(NervaExec* ex, int hd, const float* q, Buf kc, Buf vc, Buf bt, Buf rowSeq, Buf pos, float* out, int rows,
                     int H, int KVH, int bs, int mbps, int qStride, int qOff, float scale, int window, float* lse, int oneSeq);
// k_attn_prefill3's call (head dim 128, bf16 cache) on Hopper warpgroup MMA (prefill_wgmma.cu):
// -1 where the device or the binary has no sm_90a body, else the status.
int attnPrefillWgmmaRun(NervaExec* ex, const float* q, const uint16_t* kc, const uint16_t* vc, const int* bt, int btStride,
                        Buf rowSeq, Buf pos, float* out, int rows, int H, int KVH, int bs, int qStride, int qOff,
                        float scale, int window, float* lse, int oneSeq);
int attnPrefillGqa(NervaExec* ex, int hd, const float* q, Buf kc, Buf vc, Buf bt, Buf rowSeq, Buf pos, float* out, int rows,
                   int H, int KVH, int bs, int mbps, int qStride, int qOff, float scale, int window, float* lse, int oneSeq);
int attnSplitKv(NervaExec* ex, const float* qPtr, Buf kc, Buf vc, float* outPtr, Buf bt, Buf rowSeq, Buf pos, int rows, int H,
                int KVH, int hd, int bs, int mbps, int qStride, int qOff, float scale, int decodeOnly, const RopeFuse* rope,
                int window, float* lse, const unsigned char* covered);
bool attnDecodeGqaFits(const NervaExec* ex, int rows, int minKeys, int H, int KVH, int hd, int kdt, int vdt);
int attnDecodeGqa(NervaExec* ex, const float* q, Buf kc, Buf vc, float* out, Buf bt, Buf rowSeq, Buf pos, int rows, int H,
                  int KVH, int bs, int mbps, int qStride, int qOff, float scale, SplitHandoff* emit = nullptr);
// k_attn_combine: the split partials of `rows` rows merged (when no counters did it).
int launchAttnCombine(NervaExec* ex, int threads, int rows, const float* part, float* out, int H, int hd, int S, int rowBase,
                      float* lse, const unsigned char* covered);
// Batch-invariant decode attention: rows a launch for S splits a row (see decode_gqa.cu).
int invRowChunk(const NervaExec* ex, int rows, int H, long long S, size_t perSplit);

// ---------------------------------------------------------------- moe.cu, sample.cu, decoder_layers.cu
int opMoeRoute(NervaExec* ex, Args& A);
int opMoeMlp(NervaExec* ex, Args& A);
int opArgmax(NervaExec* ex, Args& A);
int opSample(NervaExec* ex, Args& A);
int opRingPush(NervaExec* ex, Args& A);
int opAdvancePositions(NervaExec* ex, Args& A);
int opDecoderLayers(NervaExec* ex, Args& A);

}  // namespace nerva::ops
