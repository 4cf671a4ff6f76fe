/**
 * @nerva/cpu-backend: the reference backend. Every op of the contract in plain TypeScript, float32
 * storage with float64 accumulation; the oracle other backends are checked against.
 */
export { CpuBackend, createCpuBackend, CPU_REL_TOL, BF16_NUMERICS_REL_TOL, BF16_MATMUL_REL_TOL, type CpuBackendOptions } from './backend.js';
export { DEFAULT_SCRATCH, type ScratchSizes } from './scratch.js';
export { DEFAULT_QK_NORM_EPS } from './ops/index.js';
export {
  OpArgumentError,
  BufferRangeError,
  BufferDTypeError,
  InvalidBufferSpecError,
  UnsupportedTierError,
  OutOfMemoryError,
  UnknownHandleError,
  CaptureStateError,
  EventStateError,
  BackendDisposedError,
  CpuBackendOptionError,
} from './errors.js';
