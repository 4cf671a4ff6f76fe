// The slice of cuBLASLt's ABI that cublas_dl.cc uses, declared by hand: no cuBLAS header is
// needed to build the addon (see nerva.h). tools/gpu/lt_abi_check.cc checks every value here
// against the real cublasLt.h on the GPU machine (static_assert), so a drift fails the build.
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

namespace nlt {
// cublasLtMatmulDescAttributes_t
constexpr int DESC_TRANSA = 3;
constexpr int DESC_TRANSB = 4;
// cublasLtMatmulPreferenceAttributes_t
constexpr int PREF_MAX_WORKSPACE_BYTES = 1;
// cublasLtMatmulAlgoConfigAttributes_t
constexpr int ALGO_CONFIG_ID = 0;
constexpr int ALGO_CONFIG_TILE_ID = 1;
constexpr int ALGO_CONFIG_SPLITK_NUM = 2;
constexpr int ALGO_CONFIG_REDUCTION_SCHEME = 3;
constexpr int ALGO_CONFIG_STAGES_ID = 6;
// cublasOperation_t, cudaDataType_t, cublasComputeType_t
constexpr int OP_N = 0;
constexpr int OP_T = 1;
constexpr int R_32F = 0;
constexpr int R_16BF = 14;
constexpr int COMPUTE_32F = 68;

// cublasLtMatmulAlgo_t and cublasLtMatmulHeuristicResult_t (layouts checked by size).
struct Algo {
  uint64_t data[8];
};
struct Heuristic {
  Algo algo;
  size_t workspaceSize;
  int state;
  float wavesCount;
  int reserved[4];
};

typedef int (*create_t)(void** handle);
typedef int (*destroy_t)(void* handle);
typedef int (*descCreate_t)(void** desc, int computeType, int scaleType);
typedef int (*descDestroy_t)(void* desc);
typedef int (*descSetAttr_t)(void* desc, int attr, const void* buf, size_t bytes);
typedef int (*layoutCreate_t)(void** layout, int type, uint64_t rows, uint64_t cols, int64_t ld);
typedef int (*layoutDestroy_t)(void* layout);
typedef int (*prefCreate_t)(void** pref);
typedef int (*prefDestroy_t)(void* pref);
typedef int (*prefSetAttr_t)(void* pref, int attr, const void* buf, size_t bytes);
typedef int (*heuristic_t)(void* handle, void* desc, void* a, void* b, void* c, void* d, void* pref, int requested,
                           Heuristic* results, int* returned);
typedef int (*algoCheck_t)(void* handle, void* desc, void* a, void* b, void* c, void* d, const Algo* algo,
                           Heuristic* result);
typedef int (*algoConfigGet_t)(const Algo* algo, int attr, void* buf, size_t bytes, size_t* written);
typedef int (*matmul_t)(void* handle, void* desc, const void* alpha, const void* A, void* aDesc, const void* B, void* bDesc,
                        const void* beta, const void* C, void* cDesc, void* D, void* dDesc, const Algo* algo, void* ws,
                        size_t wsBytes, cudaStream_t stream);
}  // namespace nlt
