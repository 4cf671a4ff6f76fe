// Compiled (never run) on the GPU machine by tools/gpu/run.sh: the hand-declared cuBLASLt ABI of
// packages/cuda-backend/native/cublaslt_abi.h must match the real header, value for value.
#include <cublasLt.h>

#include "../../packages/cuda-backend/native/addon/cublaslt_abi.h"

static_assert(nlt::DESC_TRANSA == CUBLASLT_MATMUL_DESC_TRANSA, "TRANSA");
static_assert(nlt::DESC_TRANSB == CUBLASLT_MATMUL_DESC_TRANSB, "TRANSB");
static_assert(nlt::PREF_MAX_WORKSPACE_BYTES == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, "MAX_WORKSPACE_BYTES");
static_assert(nlt::ALGO_CONFIG_ID == CUBLASLT_ALGO_CONFIG_ID, "CONFIG_ID");
static_assert(nlt::ALGO_CONFIG_TILE_ID == CUBLASLT_ALGO_CONFIG_TILE_ID, "TILE_ID");
static_assert(nlt::ALGO_CONFIG_SPLITK_NUM == CUBLASLT_ALGO_CONFIG_SPLITK_NUM, "SPLITK_NUM");
static_assert(nlt::ALGO_CONFIG_REDUCTION_SCHEME == CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, "REDUCTION_SCHEME");
static_assert(nlt::ALGO_CONFIG_STAGES_ID == CUBLASLT_ALGO_CONFIG_STAGES_ID, "STAGES_ID");
static_assert(nlt::OP_N == CUBLAS_OP_N && nlt::OP_T == CUBLAS_OP_T, "ops");
static_assert(nlt::R_32F == CUDA_R_32F && nlt::R_16BF == CUDA_R_16BF, "data types");
static_assert(nlt::COMPUTE_32F == CUBLAS_COMPUTE_32F, "compute type");
static_assert(sizeof(nlt::Algo) == sizeof(cublasLtMatmulAlgo_t), "algo size");
static_assert(sizeof(nlt::Heuristic) == sizeof(cublasLtMatmulHeuristicResult_t), "heuristic result size");
static_assert(offsetof(nlt::Heuristic, workspaceSize) == offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize), "ws");
static_assert(offsetof(nlt::Heuristic, state) == offsetof(cublasLtMatmulHeuristicResult_t, state), "state");
