/**
 * @nerva/cuda-backend: the backend contract on NVIDIA GPUs. A Node-API addon (native/) holds the
 * CUDA kernels; it is loaded when a backend is created or probed, never on import, so this
 * package imports cleanly on machines without CUDA.
 */
export { CudaBackend, CUDA_REL_TOL, CUDA_REL_TOL_BF16_GEMM, CUDA_REL_TOL_BF16_NUMERICS } from './backend.js';
export { createCudaBackend } from './create.js';
export { GEMM_FOR_MATMUL_PRECISION, resolveBatchInvariant, type CudaBackendOptions, type GemmPrecision } from './options.js';
export { probeCuda, type CudaProbe } from './probe.js';
export { Arena, ARENA_ALIGN } from './arena.js';
export {
  CudaUnavailableError,
  CudaError,
  CudaOutOfMemoryError,
  CudaArgumentError,
  CudaUnsupportedTierError,
  CudaCaptureStateError,
  CudaDisposedError,
  NcclUnavailableError,
  NcclError,
} from './errors.js';
export {
  loadNccl,
  createNcclUniqueId,
  ncclCandidateDirs,
  NcclCommunicator,
  NCCL_DTYPE_OF,
  NCCL_UNIQUE_ID_BYTES,
  type NcclStatus,
  type LoadNcclOptions,
  type NcclInitOptions,
  type NcclTransferOptions,
  type NcclDataTypeName,
} from './nccl.js';
export { addonCandidates, type NativeInfo, type NativeKnob, type NativeKnobProblem, type NativeNcclCommInfo } from './native.js';
