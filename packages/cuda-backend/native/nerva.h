// Shared declarations between the Node-API glue (addon.cc, g++) and the kernels (ops/*.cu, nvcc).
// No cuBLAS header is included anywhere: cuBLAS is loaded with dlopen (cublas_dl.cc) so the addon
// compiles on machines that have nvcc but no cuBLAS (CI, the dev box).
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

// Element type codes; must match DTYPE_CODES in src/abi.ts.
enum NervaDType { NV_F32 = 0, NV_BF16 = 1, NV_F16 = 2, NV_I32 = 3, NV_Q8_0 = 4, NV_Q4_0 = 5, NV_Q4_K = 6, NV_Q6_K = 7 };

// ggml block-quantized weights (raw GGUF blocks, each row a whole number of blocks).
inline bool nvIsQuant(int dt) { return dt >= NV_Q8_0 && dt <= NV_Q6_K; }
// Elements and bytes of one block of a quantized dtype.
inline int nvQuantBlockElems(int dt) { return dt == NV_Q4_K || dt == NV_Q6_K ? 256 : 32; }
inline int nvQuantBlockBytes(int dt) { return dt == NV_Q8_0 ? 34 : dt == NV_Q4_0 ? 18 : dt == NV_Q4_K ? 144 : 210; }
// Bytes of n elements of any dtype (n a whole number of blocks for quantized ones).
inline size_t nvBytes(int dt, size_t n) {
  if (nvIsQuant(dt)) return n / nvQuantBlockElems(dt) * nvQuantBlockBytes(dt);
  return n * (dt == NV_BF16 || dt == NV_F16 ? 2 : 4);
}

// Op codes; must match OP_CODES in src/abi.ts (same order as OP_NAMES in @nerva/core).
enum NervaOp {
  OP_EMBEDDING = 0,
  OP_RMSNORM,
  OP_MATMUL,
  OP_ROPE,
  OP_KV_APPEND,
  OP_ATTENTION,
  OP_SILU_MUL,
  OP_ADD,
  OP_GATHER_ROWS,
  OP_MOE_ROUTE,
  OP_MOE_MLP,
  OP_ARGMAX,
  OP_SAMPLE,
  OP_RING_PUSH,
  OP_ADVANCE_POSITIONS,
  OP_FUSED_MATMUL,
  OP_ROPE_APPEND,
  OP_DECODER_LAYERS,
  OP_MLP_SLICE,  // host path (src/host-mlp.ts), never launched here
  OP_ATTENTION_MERGE,
  OP_COUNT
};

// The few cuBLAS entry points we use, resolved at run time.
typedef int (*cublasCreate_t)(void** handle);
typedef int (*cublasDestroy_t)(void* handle);
typedef int (*cublasSetStream_t)(void* handle, cudaStream_t stream);
typedef int (*cublasSetWorkspace_t)(void* handle, void* ws, size_t bytes);
typedef int (*cublasGemmEx_t)(void* handle, int transa, int transb, int m, int n, int k, const void* alpha,
                              const void* A, int Atype, int lda, const void* B, int Btype, int ldb, const void* beta,
                              void* C, int Ctype, int ldc, int computeType, int algo);

struct CublasApi {
  void* lib = nullptr;
  cublasCreate_t create = nullptr;
  cublasDestroy_t destroy = nullptr;
  cublasSetStream_t setStream = nullptr;
  cublasSetWorkspace_t setWorkspace = nullptr;
  cublasGemmEx_t gemmEx = nullptr;
  char libName[64] = {0};
};

// Loads libcublas (13, 12, unversioned). Returns false and leaves api empty when not found.
bool nerva_load_cublas(CublasApi* api, char* why, size_t whyLen);

struct NervaExec;
// cuBLASLt with one algorithm pinned per GEMM shape (cublas_dl.cc): the batch-invariant matmul.
// A GEMM without split-K on one fixed kernel computes each output column (a row of x) by the same
// instructions in the same order whatever the column count, so a row's bits do not depend on the
// rows beside it. nerva_lt_open loads libcublasLt and sets ex->lt (false: why says why).
bool nerva_lt_open(NervaExec* ex, char* why, size_t whyLen);
void nerva_lt_close(NervaExec* ex);
// out[n][m] = x[n][k] . W[m][k]^T (+ out[n][m] when accumulate): bf16 W and x, f32 out, on the
// algorithm pinned for (m, k) at the first call. Returns NERVA_OK or an error code.
int nerva_lt_gemm(NervaExec* ex, int m, int n, int k, const void* w, const void* x, float* out, bool accumulate);
// Pins the shape's algorithm if not yet done: 1 when its matmuls run on cuBLASLt, 0 when no
// algorithm without split-K qualified (the shape's matmuls take k_gemm_bi, at every row count),
// -1 when cuBLASLt failed (errCall says why).
int nerva_lt_pinned(NervaExec* ex, int m, int k);
// Pinned algorithms so far, as "m x k: algo/tile/stages; ..." (for info()).
void nerva_lt_describe(const NervaExec* ex, char* buf, size_t bytes);

// How matmuls with many rows run.
enum NervaGemmMode {
  GEMM_SPLIT_BF16 = 0,  // x = hi + lo (both bf16), two bf16 GEMMs with fp32 accumulation: ~f32-exact activations
  GEMM_BF16 = 1,        // activations rounded to bf16 once (what PyTorch bf16 does)
  GEMM_GEMV = 2,        // no cuBLAS: the multi-row GEMV kernel in chunks of 8 rows
};

// Rows a prefill tile plan covers (NervaExec::tiles).
#define NERVA_TILE_PLAN_ROWS 65536

// Per-call execution state handed to nerva_launch.
struct NervaExec {
  cudaStream_t stream = nullptr;
  char* ws = nullptr;  // device workspace reserved at creation (part of the device arena)
  size_t wsBytes = 0;
  char* cublasWs = nullptr;
  size_t cublasWsBytes = 0;
  bool capturing = false;
  uint64_t launches = 0;  // kernels (and cuBLAS calls) issued outside graph capture
  int smCount = 1;
  void* cublas = nullptr;
  const CublasApi* api = nullptr;
  int gemmMode = GEMM_GEMV;
  // Launch kernels with programmatic dependent launch (sm_90+, see pdlWait in common/elem.cuh).
  bool pdl = false;
  // Kernels issued (eagerly or into a capture) since the last that wrote the step state read
  // early (ring_push's cursor; advance_positions' positions, also in op sample's tail): from 3
  // on, every earlier such write has completed when the next kernel starts, so it may read the
  // cursor and the positions before its wait.
  unsigned sinceRingPush = 1u << 20;
  // Zeroed int counters (one per (row, head) of an attention call) for the split-KV combine done
  // by the last block of each head; every user leaves them zero again.
  int* counters = nullptr;
  size_t counterCount = 0;
  // Two zeroed words (arrivals, generation) of k_q4k_chain's grid barrier.
  unsigned* gridBar = nullptr;
  // Prefill tile plan of an attention call over several sequences (k_attn_tile_plan): the tiles
  // (first row, end row), their count, and which rows they cover. Calls of more rows than
  // planRows run every row on the split-KV kernel.
  int2* tiles = nullptr;
  int* tileCount = nullptr;
  unsigned char* tileCovered = nullptr;
  int planRows = 0;
  // Largest dynamic shared memory a block may opt into (cudaDevAttrMaxSharedMemoryPerBlockOptin).
  int smemOptin = 48 * 1024;
  // L2 cache size (cudaDeviceProp::l2CacheSize).
  size_t l2Bytes = 0;
  // bf16 numerics: kernels round activations where transformers' bf16 eager forward does.
  bool bf16act = false;
  // Batch-invariant decode (CudaBackendOptions.batchInvariant): a decode row's results do not
  // depend on how many rows share the call. Op fused_matmul and op decoder_layers run every row
  // count on one GEMM (cuBLASLt with pinned algorithms where it loads, else k_gemm_bi; never
  // cuBLAS's heuristics); decode attention sizes its splits as for one row and takes one kernel
  // at every row count (GQA where the shapes allow, else split-KV).
  bool batchInv = false;
  // cuBLASLt with pinned algorithms (nerva_lt_open), batch-invariant contexts only: their
  // matmuls then run on it at every row count (where it did not load: k_gemm_bi).
  void* lt = nullptr;
  // Error detail for a failure (which call, or why the arguments were rejected).
  char errCall[160] = {0};
};

// Status codes of nerva_launch besides cudaError_t values (> 0).
#define NERVA_OK 0
#define NERVA_BAD_ARGS (-1)
#define NERVA_CUBLAS_FAILED (-2)

// Decodes `args` (see src/abi.ts for each op's layout) and enqueues the op's kernels on ex->stream.
int nerva_launch(NervaExec* ex, int op, const double* args, int nargs);

// The most keys a decode row may have for op decoder_layers to run its cluster attention
// (k_attn_decode_short, SA_MAX_KEYS) in this context; 0 where it never runs: bf16 numerics,
// batch invariance, or a device without thread block clusters. (The layer's shape must fit it as well: headDim 128, one or two q heads a KV head.)
int nerva_decode_short_keys(const NervaExec* ex);
// The fewest keys (op decoder_layers' minKeys) for which decode rows of fewer than GQA_MIN_ROWS
// take the GQA attention kernel; 0 under bf16 numerics (eager attention) and batch invariance
// (whose decode takes it at every row count).
int nerva_decode_long_keys(const NervaExec* ex);

// NERVA_TRACE builds: writes the device timeline rings to NERVA_DEVICE_TRACE (else nothing).
void nerva_trace_dump();

// Whether the kernels of this build carry the PDL dependency waits (compiled for compute_90+)
// for the current device.
bool nerva_pdl_compiled();

// Times device-to-device copies of `bytes` between two scratch buffers; returns GB/s of bytes
// read + written. Allocates (and frees) the two buffers itself.
int nerva_copy_bandwidth(size_t bytes, int iters, double* gbps, uint64_t* allocs, uint64_t* frees);
