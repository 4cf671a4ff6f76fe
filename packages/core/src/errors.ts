/** Base class so callers can catch every NERVA error with one `instanceof`. */
export class NervaError extends Error {
  readonly code: string;
  constructor(code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

export class IllegalTransitionError extends NervaError {
  constructor(
    readonly blockId: string,
    readonly from: string,
    readonly to: string,
  ) {
    super('ILLEGAL_TRANSITION', `block ${blockId}: illegal residency transition ${from} -> ${to}`);
  }
}

export class StaleReplicaError extends NervaError {
  constructor(blockId: string, detail: string) {
    super('STALE_REPLICA', `block ${blockId}: ${detail}`);
  }
}

export class OwnershipError extends NervaError {
  constructor(blockId: string, detail: string) {
    super('OWNERSHIP', `block ${blockId}: ${detail}`);
  }
}

/** Raised when something tries to allocate while a hot-path guard is armed. */
export class HotPathAllocationError extends NervaError {
  constructor(what: string) {
    super('HOT_PATH_ALLOCATION', `allocation on the hot path: ${what}`);
  }
}

export class BackendError extends NervaError {}

export class UnsupportedOpError extends NervaError {
  constructor(backend: string, op: string) {
    super('UNSUPPORTED_OP', `backend ${backend} does not implement op ${op}`);
  }
}
