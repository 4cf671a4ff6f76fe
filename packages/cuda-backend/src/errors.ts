import { BackendError } from '@nerva/core';

/** The CUDA backend cannot be used here: the addon is not built, or no GPU/driver is present. */
export class CudaUnavailableError extends BackendError {
  constructor(readonly reason: string) {
    super(
      'CUDA_UNAVAILABLE',
      `CUDA backend unavailable: ${reason}. Build the addon with \`pnpm build:cuda\` (needs nvcc) and run on a machine with an NVIDIA GPU and driver, or use the CPU backend.`,
    );
  }
}

/** A CUDA runtime (or cuBLAS) call failed. `cudaError` is the CUDA error name, `call` the failing call. */
export class CudaError extends BackendError {
  constructor(
    readonly cudaError: string,
    readonly call: string,
    message: string,
  ) {
    super('CUDA_ERROR', message);
  }
}

/** An arena (or the device itself) has no room for a request. */
export class CudaOutOfMemoryError extends BackendError {
  constructor(
    readonly tier: string,
    readonly requested: number,
    readonly detail: string,
  ) {
    super('OUT_OF_MEMORY', `${tier}: cannot allocate ${requested} bytes (${detail})`);
  }
}

/** An op, buffer or handle argument is invalid (checked before anything reaches the GPU). */
export class CudaArgumentError extends BackendError {
  constructor(what: string, detail: string) {
    super('INVALID_ARGUMENT', `${what}: ${detail}`);
  }
}

/** A tier this backend does not hand out (only 'vram' and 'pinned'). */
export class CudaUnsupportedTierError extends BackendError {
  constructor(tier: string) {
    super('UNSUPPORTED_TIER', `tier ${tier} is not available on the CUDA backend (available: vram, pinned)`);
  }
}

/** A call that is illegal in the current capture state (a host write while capturing, ...). */
export class CudaCaptureStateError extends BackendError {
  constructor(detail: string) {
    super('CAPTURE_STATE', detail);
  }
}

/** The backend was used after dispose(). */
export class CudaDisposedError extends BackendError {
  constructor() {
    super('DISPOSED', 'the CUDA backend was disposed');
  }
}

interface NativeErrorShape {
  message?: string;
  cudaError?: string;
  call?: string;
}

/** Maps an exception thrown by the addon to a typed error. */
export function fromNative(e: unknown, what: string): Error {
  const n = (e ?? {}) as NativeErrorShape;
  const msg = `${what}: ${n.message ?? String(e)}`;
  if (typeof n.cudaError !== 'string') return new CudaError('unknown', what, msg);
  if (n.cudaError === 'cudaErrorMemoryAllocation') return new CudaOutOfMemoryError('vram', 0, msg);
  if (n.cudaError === 'NERVA_BAD_ARGS') return new CudaArgumentError(what, n.call ?? msg);
  return new CudaError(n.cudaError, n.call ?? what, msg);
}

/**
 * NCCL cannot be used here: the CUDA addon is missing or was built without NCCL support, or
 * libnccl.so.2 was found nowhere (the reason names every place tried).
 */
export class NcclUnavailableError extends BackendError {
  constructor(readonly reason: string) {
    super(
      'NCCL_UNAVAILABLE',
      `NCCL unavailable: ${reason}. Install NCCL 2.x (libnccl.so.2 on the loader path, or the nvidia-nccl pip wheel) or set NERVA_NCCL_PATH to the library or its directory.`,
    );
  }
}

/** An NCCL call failed. `ncclError` is the ncclResult_t name (ncclInvalidUsage, ...), `call` the failing call. */
export class NcclError extends BackendError {
  constructor(
    readonly ncclError: string,
    readonly call: string,
    message: string,
  ) {
    super('NCCL_ERROR', message);
  }
}

interface NativeNcclErrorShape extends NativeErrorShape {
  ncclError?: string;
}

/** Maps an exception thrown by the addon's NCCL functions to a typed error. */
export function fromNativeNccl(e: unknown, what: string): Error {
  const n = (e ?? {}) as NativeNcclErrorShape;
  if (typeof n.ncclError !== 'string') return fromNative(e, what);
  const detail = n.message ?? String(e);
  if (n.ncclError === 'NCCL_NOT_LOADED' || n.ncclError === 'NCCL_MISSING_SYMBOL') return new NcclUnavailableError(detail);
  if (n.ncclError === 'NERVA_BAD_ARGS') return new CudaArgumentError(what, detail);
  return new NcclError(n.ncclError, n.call ?? what, `${what}: ${detail}`);
}
