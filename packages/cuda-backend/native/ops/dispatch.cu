// nerva_launch: op code -> the op family's launcher (a table in OP_CODES order), plus the device
// queries the addon makes (PDL support, copy bandwidth).
#include "common/exec.cuh"
#include "common/trace.cuh"
#include "ops/ops.h"

namespace nerva::ops {
namespace {

// Launchers by op code (NervaOp); null: not a device op (mlp_slice runs on the host).
struct OpTable {
  OpLauncher fn[OP_COUNT] = {};
  constexpr OpTable() {
    fn[OP_EMBEDDING] = opEmbedding;
    fn[OP_RMSNORM] = opRmsnorm;
    fn[OP_MATMUL] = opMatmul;
    fn[OP_ROPE] = opRope;
    fn[OP_KV_APPEND] = opKvAppend;
    fn[OP_ATTENTION] = opAttention;
    fn[OP_SILU_MUL] = opSiluMul;
    fn[OP_ADD] = opAdd;
    fn[OP_GATHER_ROWS] = opGatherRows;
    fn[OP_MOE_ROUTE] = opMoeRoute;
    fn[OP_MOE_MLP] = opMoeMlp;
    fn[OP_ARGMAX] = opArgmax;
    fn[OP_SAMPLE] = opSample;
    fn[OP_RING_PUSH] = opRingPush;
    fn[OP_ADVANCE_POSITIONS] = opAdvancePositions;
    fn[OP_FUSED_MATMUL] = opFusedMatmul;
    fn[OP_ROPE_APPEND] = opRopeAppend;
    fn[OP_DECODER_LAYERS] = opDecoderLayers;
    fn[OP_ATTENTION_MERGE] = opAttentionMerge;
  }
};
constexpr OpTable kOps;

}  // namespace
}  // namespace nerva::ops

int nerva_launch(NervaExec* ex, int op, const double* args, int nargs) {
#ifdef NERVA_TRACE
  nerva::trace::init();
#endif
  nerva::Args A{args, nargs};
  ex->errCall[0] = 0;
  if (op < 0 || op >= OP_COUNT || !nerva::ops::kOps.fn[op]) return nerva::bad(ex, "unknown op code");
  return nerva::ops::kOps.fn[op](ex, A);
}

bool nerva_pdl_compiled() {
  // griddepcontrol exists only in code compiled for compute_90+; PTX of an older arch JIT-ed
  // onto a Hopper would launch early without waiting, so PDL needs the kernels' own PTX >= 9.0.
  // (Every op family's translation unit is compiled for the same architectures.)
  return nerva::ops::kernelsPtxVersion() >= 90;
}

int nerva_copy_bandwidth(size_t bytes, int iters, double* gbps, uint64_t* allocs, uint64_t* frees) {
  void *a = nullptr, *b = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaError_t e = cudaMalloc(&a, bytes);
  if (e == cudaSuccess) {
    (*allocs)++;
    e = cudaMalloc(&b, bytes);
    if (e == cudaSuccess) (*allocs)++;
  }
  if (e == cudaSuccess) e = cudaEventCreate(&e0);
  if (e == cudaSuccess) e = cudaEventCreate(&e1);
  if (e == cudaSuccess) e = cudaMemset(a, 1, bytes);
  if (e == cudaSuccess) e = cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);  // warm-up
  if (e == cudaSuccess) e = cudaEventRecord(e0, 0);
  for (int i = 0; i < iters && e == cudaSuccess; i++) e = cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, 0);
  if (e == cudaSuccess) e = cudaEventRecord(e1, 0);
  if (e == cudaSuccess) e = cudaEventSynchronize(e1);
  float ms = 0;
  if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, e1);
  if (e == cudaSuccess) *gbps = 2.0 * (double)bytes * iters / (ms * 1e-3) / 1e9;
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (a) {
    cudaFree(a);
    (*frees)++;
  }
  if (b) {
    cudaFree(b);
    (*frees)++;
  }
  return (int)e;
}
