/**
 * Typed errors of the CPU backend. All extend core's BackendError (and so NervaError), so a
 * caller can catch any backend failure with one `instanceof` and tell them apart by `code`.
 */
import { BackendError } from '@nerva/core';

/** An op argument (a buffer or an attribute) is missing, of the wrong dtype, too small or out of range. */
export class OpArgumentError extends BackendError {
  constructor(
    readonly op: string,
    readonly arg: string,
    detail: string,
  ) {
    super('OP_ARGUMENT', `op ${op}: argument ${arg}: ${detail}`);
  }
}

/** A write, read or copy range falls outside a buffer, or an offset/length is not a valid count. */
export class BufferRangeError extends BackendError {
  constructor(what: string, detail: string) {
    super('BUFFER_RANGE', `${what}: ${detail}`);
  }
}

/** A host array or a buffer has a dtype the operation cannot take. */
export class BufferDTypeError extends BackendError {
  constructor(what: string, detail: string) {
    super('BUFFER_DTYPE', `${what}: ${detail}`);
  }
}

/** A buffer spec is malformed (unknown dtype, bad length). */
export class InvalidBufferSpecError extends BackendError {
  constructor(detail: string) {
    super('INVALID_SPEC', `invalid buffer spec: ${detail}`);
  }
}

/** The spec asks for a tier this backend does not have. */
export class UnsupportedTierError extends BackendError {
  constructor(
    readonly tier: string,
    readonly available: readonly string[],
  ) {
    super('UNSUPPORTED_TIER', `tier ${tier} is not available on this backend (available: ${available.join(', ')})`);
  }
}

/** The allocation would exceed the memory the backend declares. */
export class OutOfMemoryError extends BackendError {
  constructor(requested: number, live: number, limit: number) {
    super('OUT_OF_MEMORY', `allocation of ${requested} bytes exceeds the budget (${live} of ${limit} bytes live)`);
  }
}

/**
 * A handle (buffer, stream, event, graph) that this backend did not make or that was already
 * released: double frees and use-after-free land here.
 */
export class UnknownHandleError extends BackendError {
  constructor(kind: string, id: number, detail: string) {
    super('UNKNOWN_HANDLE', `${kind} #${id}: ${detail}`);
  }
}

/** Graph capture misuse: nested capture, end without begin, a host sync inside a capture. */
export class CaptureStateError extends BackendError {
  constructor(detail: string) {
    super('CAPTURE_STATE', detail);
  }
}

/** An event queried before it was recorded. */
export class EventStateError extends BackendError {
  constructor(id: number, detail: string) {
    super('EVENT_STATE', `event #${id}: ${detail}`);
  }
}

/** Any call on a backend after dispose(). */
export class BackendDisposedError extends BackendError {
  constructor(name: string) {
    super('DISPOSED', `backend ${name} was disposed`);
  }
}

/** A CpuBackend option has an unknown or invalid value. */
export class CpuBackendOptionError extends BackendError {
  constructor(
    readonly option: string,
    detail: string,
  ) {
    super('BACKEND_OPTION', `cpu backend option ${option}: ${detail}`);
  }
}
