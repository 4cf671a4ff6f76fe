/**
 * @nerva/cuda-backend: the backend contract on NVIDIA GPUs. A Node-API addon (native/) holds the
 * CUDA kernels; it is loaded when a backend is created or probed, never on import, so this
 * package imports cleanly on machines without CUDA.
 */
export {
  CudaBackend,
  createCudaBackend,
  CUDA_REL_TOL,
  CUDA_REL_TOL_BF16_GEMM,
  CUDA_REL_TOL_BF16_NUMERICS,
  type CudaBackendOptions,
  type GemmPrecision,
  type DecoderMode,
} from './backend.js';
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
} from './errors.js';
export { addonCandidates, type NativeInfo } from './native.js';
