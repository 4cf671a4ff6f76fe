import { HotPathAllocationError, NervaError } from '@nerva/core';

/** Base class of every error raised by `@nerva/transport`; catch all of them with one `instanceof`. */
export class TransportError extends NervaError {}

/** A call argument is outside its documented domain. */
export class TransportArgumentError extends TransportError {
  constructor(message: string) {
    super('TRANSPORT_ARGUMENT', message);
  }
}

/** A sysfs path could not be read for a reason other than "it is not there" (which reads as `undefined`). */
export class SysfsReadError extends TransportError {
  constructor(
    readonly path: string,
    cause: unknown,
  ) {
    super('SYSFS_READ', `cannot read ${path}: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
  }
}

/**
 * A sysfs value is malformed (garbage in `numa_node`, an unparsable link speed, ...). Raised only
 * by `discoverTopology(reader, { strict: true })`; the default records the value as `'unknown'`
 * and says so in `FabricTopology.notes`.
 */
export class TopologyParseError extends TransportError {
  constructor(
    readonly path: string,
    readonly value: string,
    detail: string,
  ) {
    super('TOPOLOGY_PARSE', `${path}: ${detail} (read ${JSON.stringify(value)})`);
  }
}

/** A path endpoint names a device the topology or the runtime probe does not have. */
export class UnknownEndpointError extends TransportError {
  constructor(readonly endpoint: string, detail: string) {
    super('TRANSPORT_UNKNOWN_ENDPOINT', `endpoint ${endpoint}: ${detail}`);
  }
}

/** `resolve` named a buffer that was never registered (or was unregistered). */
export class UnknownRegistrationError extends TransportError {
  constructor(readonly bufferId: string | number) {
    super('UNKNOWN_REGISTRATION', `buffer ${String(bufferId)} is not registered`);
  }
}

/**
 * A registration no longer describes its buffer: the buffer was freed, or reallocated (its
 * generation changed) since it was registered. Register the new buffer before the hot path.
 */
export class StaleRegistrationError extends TransportError {
  constructor(
    readonly bufferId: string | number,
    readonly registeredGeneration: number,
    readonly currentGeneration: number | 'freed',
  ) {
    super(
      'STALE_REGISTRATION',
      `buffer ${String(bufferId)}: registration of generation ${registeredGeneration} is stale ` +
        (currentGeneration === 'freed' ? '(the buffer was freed)' : `(the buffer is now generation ${currentGeneration})`),
    );
  }
}

/** A lookup asked for bytes outside the registered range. */
export class RegistrationRangeError extends TransportError {
  constructor(bufferId: string | number, offset: number, bytes: number, registered: number) {
    super(
      'REGISTRATION_RANGE',
      `buffer ${String(bufferId)}: bytes [${offset}, ${offset + bytes}) lie outside the registered ${registered} bytes`,
    );
  }
}

/**
 * Registering (or deregistering) a buffer while the hot-path guard is armed. It is an allocation
 * in the sense of the runtime rules (nothing pins, registers or maps inside decode), so it is a
 * `HotPathAllocationError` (code `HOT_PATH_ALLOCATION`) and is counted as one.
 */
export class HotPathRegistrationError extends HotPathAllocationError {
  constructor(what: string) {
    super(`registration cache: ${what}`);
  }
}
