/**
 * The CPU backend's buffer table: handles out, typed-array storage in, with the live/alloc
 * counters the leak checks and ledgers read.
 *
 * Storage: f32 and the half types (bf16, f16) are all held as Float32Array. Half values are
 * rounded to their type when they are stored, so every stored value is exactly representable in
 * the buffer's dtype while ops read it at full speed without decoding. i32 is Int32Array.
 */
import { DTYPE_BYTES, HotPathAllocationError, type BufferSpec, type BufferUsage, type DType, type DeviceBuffer, type Tier } from '@nerva/core';
import { InvalidBufferSpecError, OutOfMemoryError, UnknownHandleError, UnsupportedTierError } from './errors.js';

export type Storage = Float32Array | Int32Array;

/** What the table keeps per live buffer. */
export interface BufferRecord {
  readonly handle: DeviceBuffer;
  readonly data: Storage;
}

const USAGES: readonly BufferUsage[] = ['weights', 'kv', 'activations', 'io', 'workspace'];

export class BufferTable {
  private readonly live = new Map<number, BufferRecord>();
  /** Handles already freed, so a double free is named as such rather than "unknown". */
  private readonly freed = new WeakSet<DeviceBuffer>();
  private nextId = 1;
  liveBytes = 0;
  allocCalls = 0;
  freeCalls = 0;
  hotPathAllocations = 0;
  hotPath = false;

  /** Live bytes per tier; each tier has its own limit. */
  private readonly tierBytes = new Map<Tier, number>();
  private readonly tiers: readonly Tier[];

  constructor(
    private readonly limits: Readonly<Partial<Record<Tier, number>>>,
    private readonly defaultTier: Tier,
  ) {
    this.tiers = Object.keys(limits) as Tier[];
  }

  /** Live bytes held in one tier. */
  bytesIn(tier: Tier): number {
    return this.tierBytes.get(tier) ?? 0;
  }

  get liveBuffers(): number {
    return this.live.size;
  }

  alloc(spec: BufferSpec): DeviceBuffer {
    if (this.hotPath) {
      this.hotPathAllocations++;
      throw new HotPathAllocationError(`alloc ${spec?.label ?? ''} ${spec?.dtype}[${spec?.length}]`.replace(/\s+/g, ' '));
    }
    if (spec === null || typeof spec !== 'object') throw new InvalidBufferSpecError('spec must be an object');
    const { dtype, length } = spec;
    if (!(dtype in DTYPE_BYTES)) throw new InvalidBufferSpecError(`unknown dtype ${String(dtype)}`);
    if (!Number.isSafeInteger(length) || length < 0) throw new InvalidBufferSpecError(`length must be a non-negative integer, got ${length}`);
    const tier = spec.tier ?? this.defaultTier;
    if (!this.tiers.includes(tier)) throw new UnsupportedTierError(String(tier), this.tiers);
    const usage = spec.usage ?? 'activations';
    if (!USAGES.includes(usage)) throw new InvalidBufferSpecError(`unknown usage ${String(usage)}`);
    const byteLength = length * DTYPE_BYTES[dtype];
    const limit = this.limits[tier] ?? 0;
    const used = this.bytesIn(tier);
    if (used + byteLength > limit) throw new OutOfMemoryError(byteLength, used, limit);
    let data: Storage;
    try {
      data = dtype === 'i32' ? new Int32Array(length) : new Float32Array(length);
    } catch {
      // The JS heap or the typed-array length limit refused it: still an allocation failure.
      throw new OutOfMemoryError(byteLength, used, limit);
    }
    const handle: DeviceBuffer = Object.freeze({
      id: this.nextId++,
      dtype,
      length,
      byteLength,
      tier,
      usage,
      ...(spec.label !== undefined ? { label: spec.label } : {}),
    });
    this.live.set(handle.id, { handle, data });
    this.liveBytes += byteLength;
    this.tierBytes.set(tier, used + byteLength);
    this.allocCalls++;
    return handle;
  }

  free(buf: DeviceBuffer): void {
    this.resolve(buf, 'free');
    this.live.delete(buf.id);
    this.freed.add(buf);
    this.liveBytes -= buf.byteLength;
    this.tierBytes.set(buf.tier, this.bytesIn(buf.tier) - buf.byteLength);
    this.freeCalls++;
  }

  /** The record behind a handle; rejects foreign, freed and forged handles. */
  resolve(buf: DeviceBuffer, what: string): BufferRecord {
    if (buf === null || typeof buf !== 'object') throw new UnknownHandleError('buffer', NaN, `${what}: not a buffer handle`);
    const rec = this.live.get(buf.id);
    if (rec === undefined || rec.handle !== buf) {
      const detail = this.freed.has(buf) ? 'already freed (double free or use after free)' : 'not allocated by this backend';
      throw new UnknownHandleError('buffer', buf.id, `${what}: ${detail}`);
    }
    return rec;
  }

  /** Drops every buffer (dispose); counts each as a free. */
  clear(): void {
    for (const rec of this.live.values()) {
      this.freed.add(rec.handle);
      this.freeCalls++;
    }
    this.live.clear();
    this.liveBytes = 0;
    this.tierBytes.clear();
  }
}

/** dtype of a buffer that holds floating-point values. */
export function isFloatDType(d: DType): d is 'f32' | 'bf16' | 'f16' {
  return d !== 'i32';
}
