/**
 * The registration cache: buffers a transfer path touches (pinned staging, RDMA-registered memory,
 * NCCL-registered windows) are registered once, before the hot path; the hot path only looks them
 * up. A registration names a buffer by id and generation: when the buffer is freed or reallocated
 * (a new generation at the same id), its registration is stale and a lookup fails with
 * `StaleRegistrationError` instead of handing out an address that no longer belongs to it.
 */
import {
  HotPathRegistrationError,
  RegistrationRangeError,
  StaleRegistrationError,
  TransportArgumentError,
  UnknownRegistrationError,
} from './errors.js';

/** What is registered: a buffer's identity, its extent and the generation of its allocation. */
export interface BufferDescriptor {
  /** The buffer's id (a DeviceBuffer id, an arena slot name, ...). */
  id: string | number;
  /** Bytes registered. */
  bytes: number;
  /** Bumped by the owner every time the id is reallocated. */
  generation: number;
  /** Device or host address, or an offset into an arena; opaque here. */
  address?: bigint | number;
  label?: string;
}

/** A live or stale registration. */
export interface Registration {
  readonly id: string | number;
  readonly bytes: number;
  readonly generation: number;
  readonly address: bigint | number | null;
  readonly label: string | null;
  /** Sequence number of the registration (monotonic per cache). */
  readonly handle: number;
  /** Whatever the native `register` hook returned (an MR key, a registration handle). */
  readonly native: unknown;
  readonly state: 'live' | 'stale';
}

/** Native hooks: the cache calls them, so nothing else registers behind its back. */
export interface RegistrationHooks {
  /** Register with the runtime (cudaHostRegister, ibv_reg_mr, ncclCommRegister, ...). */
  register?(desc: Readonly<BufferDescriptor>): unknown;
  /** Undo a registration (also called for a stale one being replaced). */
  deregister?(reg: Registration): void;
}

export interface RegistrationStats {
  /** Live registrations and their bytes. */
  live: number;
  liveBytes: number;
  /** Stale entries kept so a lookup can say "stale" rather than "unknown". */
  stale: number;
  /** register() calls that created a registration (including re-registrations after reallocation). */
  registrations: number;
  /** register() calls for an identical live registration (no native call). */
  duplicates: number;
  lookups: number;
  staleRejections: number;
  unknownLookups: number;
  rangeRejections: number;
  /** register/unregister attempts while the hot-path guard was armed (each one rejected). */
  hotPathRejections: number;
}

interface Entry {
  reg: Registration;
  /** When stale: the generation that replaced it, or 'freed'. */
  staleBy: number | 'freed' | null;
}

function checkId(id: unknown): asserts id is string | number {
  if (!(typeof id === 'string' || (typeof id === 'number' && Number.isFinite(id))))
    throw new TransportArgumentError(`buffer id must be a string or a finite number, got ${String(id)}`);
}

/** See the module comment. */
export class RegistrationCache {
  private readonly entries = new Map<string | number, Entry>();
  private armed = false;
  private nextHandle = 1;
  private readonly counters = {
    registrations: 0,
    duplicates: 0,
    lookups: 0,
    staleRejections: 0,
    unknownLookups: 0,
    rangeRejections: 0,
    hotPathRejections: 0,
  };

  constructor(private readonly hooks: RegistrationHooks = {}) {}

  /**
   * Arm or disarm the hot-path guard. While armed, `register` and `unregister` throw
   * `HotPathRegistrationError` and are counted in `stats().hotPathRejections`; lookups stay free.
   */
  setHotPath(armed: boolean): void {
    this.armed = armed;
  }

  get hotPathArmed(): boolean {
    return this.armed;
  }

  private guard(what: string): void {
    if (this.armed) {
      this.counters.hotPathRejections++;
      throw new HotPathRegistrationError(what);
    }
  }

  /**
   * Register a buffer. Registering the same id, generation and extent again returns the live
   * registration; a newer generation replaces the old one (deregistered through the hook); an older
   * generation than the one held is rejected as stale.
   */
  register(desc: BufferDescriptor): Registration {
    checkId(desc?.id);
    if (!Number.isInteger(desc.bytes) || desc.bytes <= 0) throw new TransportArgumentError(`buffer ${String(desc.id)}: bytes must be a positive integer, got ${desc.bytes}`);
    if (!Number.isInteger(desc.generation) || desc.generation < 0)
      throw new TransportArgumentError(`buffer ${String(desc.id)}: generation must be a non-negative integer, got ${desc.generation}`);
    this.guard(`register buffer ${String(desc.id)}`);
    const old = this.entries.get(desc.id);
    if (old && old.staleBy === null) {
      const r = old.reg;
      if (r.generation === desc.generation && r.bytes === desc.bytes && r.address === (desc.address ?? null)) {
        this.counters.duplicates++;
        return r;
      }
      if (desc.generation < r.generation) {
        this.counters.staleRejections++;
        throw new StaleRegistrationError(desc.id, desc.generation, r.generation);
      }
      this.hooks.deregister?.(r);
    } else if (old && typeof old.staleBy === 'number' && desc.generation < old.staleBy) {
      this.counters.staleRejections++;
      throw new StaleRegistrationError(desc.id, desc.generation, old.staleBy);
    }
    const native = this.hooks.register?.(desc);
    const reg: Registration = Object.freeze({
      id: desc.id,
      bytes: desc.bytes,
      generation: desc.generation,
      address: desc.address ?? null,
      label: desc.label ?? null,
      handle: this.nextHandle++,
      native,
      state: 'live' as const,
    });
    this.entries.set(desc.id, { reg, staleBy: null });
    this.counters.registrations++;
    return reg;
  }

  /**
   * The live registration of `id` for the buffer's current `generation`, optionally checking that
   * `[offset, offset + bytes)` lies inside it. Throws `UnknownRegistrationError`,
   * `StaleRegistrationError` (freed, or a different generation) or `RegistrationRangeError`.
   * Allowed on the hot path; allocates nothing.
   */
  resolve(id: string | number, generation: number, range?: { offset: number; bytes: number }): Registration {
    this.counters.lookups++;
    const e = this.entries.get(id);
    if (!e) {
      this.counters.unknownLookups++;
      throw new UnknownRegistrationError(id);
    }
    if (e.staleBy !== null) {
      this.counters.staleRejections++;
      throw new StaleRegistrationError(id, e.reg.generation, e.staleBy);
    }
    if (e.reg.generation !== generation) {
      this.counters.staleRejections++;
      throw new StaleRegistrationError(id, e.reg.generation, generation);
    }
    if (range && (!(range.offset >= 0) || !(range.bytes >= 0) || range.offset + range.bytes > e.reg.bytes)) {
      this.counters.rangeRejections++;
      throw new RegistrationRangeError(id, range.offset, range.bytes, e.reg.bytes);
    }
    return e.reg;
  }

  /** The registration of `id` in whatever state, without checks (for reports). */
  peek(id: string | number): Registration | undefined {
    return this.entries.get(id)?.reg;
  }

  /**
   * The owner freed (`generation` omitted) or reallocated (`generation` = the new one) the buffer:
   * its registration becomes stale and every later `resolve` of it throws `StaleRegistrationError`
   * until the buffer is registered again. The native hook deregisters it now. Returns false when
   * the id was not registered or already stale.
   */
  invalidate(id: string | number, generation?: number): boolean {
    const e = this.entries.get(id);
    if (!e || e.staleBy !== null) return false;
    this.hooks.deregister?.(e.reg);
    e.staleBy = generation ?? 'freed';
    e.reg = Object.freeze({ ...e.reg, state: 'stale' as const });
    return true;
  }

  /** Remove `id` entirely (deregistering a live registration). Rejected on the hot path. */
  unregister(id: string | number): boolean {
    const e = this.entries.get(id);
    if (!e) return false;
    this.guard(`unregister buffer ${String(id)}`);
    if (e.staleBy === null) this.hooks.deregister?.(e.reg);
    this.entries.delete(id);
    return true;
  }

  /** Drop stale entries (their lookups then read as unknown). Returns how many were dropped. */
  pruneStale(): number {
    let n = 0;
    for (const [id, e] of this.entries)
      if (e.staleBy !== null) {
        this.entries.delete(id);
        n++;
      }
    return n;
  }

  stats(): RegistrationStats {
    let live = 0;
    let liveBytes = 0;
    let stale = 0;
    for (const e of this.entries.values()) {
      if (e.staleBy === null) {
        live++;
        liveBytes += e.reg.bytes;
      } else stale++;
    }
    return { live, liveBytes, stale, ...this.counters };
  }
}
