import {
  QUANT_BLOCKS,
  dequantize,
  ggmlTypeOf,
  isQuantDType,
  DTYPE_BYTES,
  type MatmulPrecision,
  type Numerics,
  HotPathAllocationError,
  OP_NAMES,
  decodeHalf,
  emptySyncCounts,
  encodeHalf,
  type BackendCapabilities,
  type BackendStats,
  type BufferSpec,
  type BufferUsage,
  type DeviceBackend,
  type DeviceBuffer,
  type DType,
  type EventHandle,
  type GraphHandle,
  type HostArray,
  type OpArgs,
  type OpName,
  type StreamHandle,
  type SyncCounts,
  type SyncKind,
  type Tier,
} from '@nerva/core';
import { OpEncoder, OP_CODES, type ResolvedBuffer } from './abi/index.js';
import { QUANT_WEIGHT } from './abi/encoder.js';
import { type HostAttnNative, hostAttentionPlan } from './host-attention.js';
import { type HostMlpNative, hostMlpKey } from './host-mlp.js';
import { Arena } from './arena.js';
import {
  CudaArgumentError,
  CudaCaptureStateError,
  CudaDisposedError,
  CudaUnsupportedTierError,
  fromNative,
} from './errors.js';
import { type NativeAddon, type NativeContext, type NativeInfo } from './native.js';
import type { GemmPrecision } from './options.js';

/**
 * The most keys a decode row may have for op decoder_layers to run its cluster attention
 * (k_attn_decode_short: a KV head's keys in the shared memory of 8 blocks, no global merge), as
 * the addon reports it (its SA_MAX_KEYS where the kernel can run in this context: thread block
 * clusters, exact numerics, per-layer kernels, no batch invariance). The
 * kernel then takes one-row decode steps whose maxKeys is at most this, for layers of headDim 128
 * and at most two q heads a KV head. An addon that does not report it: 0.
 */
function decodeShortKeys(info: NativeInfo): number {
  return positiveInt(info.decodeShortKeys);
}

/**
 * The fewest keys a decode row must have for op decoder_layers to run the GQA attention kernel
 * at one row (k_attn_decode_gqa: one block a KV head and split serves its q heads, so each key is
 * read once, not once a q head), as the addon reports it (its GQA_LONG_KEYS; 0 under bf16
 * numerics or batch invariance). An addon that does not report it: 0.
 */
function decodeLongKeys(info: NativeInfo): number {
  return positiveInt(info.decodeLongKeys);
}

function positiveInt(v: unknown): number {
  return typeof v === 'number' && Number.isInteger(v) && v > 0 ? v : 0;
}

/** relTol the backend declares: fp32 accumulation everywhere, activations kept in f32. */
export const CUDA_REL_TOL = 1e-4;
/** relTol when many-row matmuls round activations to bf16 (gemm: 'bf16'). */
export const CUDA_REL_TOL_BF16_GEMM = 1e-2;
/**
 * relTol under bf16 numerics, against the CPU reference in bf16 numerics: float32 accumulation
 * in another order flips a rare bf16 rounding by one ulp (2^-8 relative), and an op chains a
 * few rounding points; 2e-2 of max |reference| admits that and fails a wrong formula.
 */
export const CUDA_REL_TOL_BF16_NUMERICS = 2e-2;


/**
 * What src/nccl.ts needs of a backend, kept off the public class: the native context, the addon
 * it came from (whose NCCL functions share its communicator table), the device ordinal, and
 * buffer and stream resolution. Not exported from the package index.
 */
export interface CudaBackendInternals {
  readonly ctx: NativeContext;
  readonly addon: NativeAddon | undefined;
  readonly device: number;
  /** Throws CudaDisposedError after dispose(). */
  live(): void;
  /** Whether `buf` is a live buffer of this backend. */
  owns(buf: DeviceBuffer): boolean;
  /** Address and dtype of elements [offset, offset + length) of a live 'vram' buffer. */
  vramRange(buf: DeviceBuffer, offset: number, length: number, what: string): { addr: number; dtype: DType };
  /** The native stream id of a handle of this backend (undefined: the default stream). */
  streamId(stream: StreamHandle | undefined): number;
}

let internalsOf: (be: CudaBackend) => CudaBackendInternals;
const internalsCache = new WeakMap<CudaBackend, CudaBackendInternals>();

/** The backend's internals (package-private; see CudaBackendInternals). */
export function cudaBackendInternals(be: CudaBackend): CudaBackendInternals {
  let i = internalsCache.get(be);
  if (!i) {
    i = internalsOf(be);
    internalsCache.set(be, i);
  }
  return i;
}

/** Where a backend's native context came from (set by createCudaBackend). */
export interface CudaBackendOrigin {
  readonly device: number;
  readonly addon: NativeAddon;
}

interface Entry extends ResolvedBuffer {
  readonly buf: CudaBuffer;
  readonly offset: number;
  readonly size: number;
}

class CudaBuffer implements DeviceBuffer {
  constructor(
    readonly id: number,
    readonly dtype: DType,
    readonly length: number,
    readonly byteLength: number,
    readonly tier: Tier,
    readonly usage: BufferUsage,
    readonly label?: string,
  ) {}
}

/** Writes up to this size to device memory are staged (non-blocking); larger ones synchronize. */
export const STAGED_WRITE_MAX_BYTES = 1 << 20;

/**
 * The CUDA implementation of the backend contract. Memory is reserved at creation (a device
 * arena and a mapped pinned-host arena); alloc/free only move offsets. Ops are enqueued on CUDA
 * streams; stream 0 of the contract is a non-blocking stream of our own, so graph capture works
 * on it.
 */
export class CudaBackend implements DeviceBackend {
  readonly name = 'cuda';
  readonly capabilities: BackendCapabilities;
  private readonly ctx: NativeContext;
  private readonly native: NativeInfo;
  private readonly vram: Arena;
  private readonly pinned: Arena;
  private readonly pinnedBytes: ArrayBuffer;
  private readonly buffers = new Map<number, Entry>();
  private readonly streams = new Set<number>([0]);
  private readonly events = new Set<number>();
  private readonly graphs = new Map<number, GraphHandle>();
  private readonly encoder: OpEncoder;
  private readonly syncs: SyncCounts = emptySyncCounts();
  private nextId = 1;
  private liveBytes = 0;
  private hotPath = false;
  private hotPathAllocations = 0;
  private capturing: number | null = null;
  private h2d = 0;
  private d2h = 0;
  private d2d = 0;
  private disposed = false;
  private readonly origin: CudaBackendOrigin | undefined;

  static {
    internalsOf = (be) => ({
      ctx: be.ctx,
      addon: be.origin?.addon,
      device: be.origin?.device ?? 0,
      live: () => be.live(),
      owns: (buf) => be.buffers.get(buf.id)?.buf === buf,
      vramRange: (buf, offset, length, what) => {
        const e = be.entry(buf, what);
        if (buf.tier !== 'vram') throw new CudaArgumentError(what, `buffer #${buf.id} is in ${buf.tier}; only 'vram' buffers can be sent or received`);
        be.range(e, what, offset, length);
        return { addr: e.addr + offset * DTYPE_BYTES[e.dtype], dtype: e.dtype };
      },
      streamId: (s) => be.stream(s),
    });
  }

  /** Use createCudaBackend(); this constructor expects a created native context. */
  constructor(ctx: NativeContext, deviceCount: number, gemm: GemmPrecision, origin?: CudaBackendOrigin) {
    this.ctx = ctx;
    this.origin = origin;
    this.native = ctx.info();
    this.vram = new Arena('vram', this.native.deviceArenaBytes);
    this.pinned = new Arena('pinned', this.native.pinnedArenaBytes);
    this.pinnedBytes = ctx.pinnedArrayBuffer();
    this.encoder = new OpEncoder((b, what) => this.entry(b, what));
    const bf16Gemm = gemm === 'bf16' && this.native.gemm !== 'gemv';
    const numerics: Numerics = this.native.numerics === 'bf16' ? 'bf16' : 'exact';
    const precision =
      numerics === 'bf16'
        ? { compute: 'bf16' as const, relTol: CUDA_REL_TOL_BF16_NUMERICS }
        : bf16Gemm
          ? { compute: 'bf16' as const, relTol: CUDA_REL_TOL_BF16_GEMM }
          : { compute: 'f32' as const, relTol: CUDA_REL_TOL };
    this.capabilities = Object.freeze({
      deviceKind: 'cuda',
      deviceName: this.native.name,
      deviceCount,
      memory: { vram: this.native.deviceArenaBytes, pinned: this.native.pinnedArenaBytes },
      computeTier: 'vram' as Tier,
      dtypes: Object.freeze(['f32', 'bf16', 'f16', 'i32', ...QUANT_WEIGHT] as DType[]),
      weightDtype: 'bf16' as DType,
      precision: Object.freeze(precision),
      numerics,
      // 'gemv' and 'split-bf16' are both f32-grade; 'bf16' also selects plain-bf16 prefill attention.
      matmulPrecision: (bf16Gemm ? 'bf16' : 'exact') as MatmulPrecision,
      // rmsnorm and silu_mul write bf16 outs, matmul reads a bf16 x over more than 8 rows (the GEMM).
      activationDtypes: Object.freeze(['bf16'] as DType[]),
      batchInvariant: this.native.batchInvariant === true,
      shortContextKeys: decodeShortKeys(this.native),
      longContextKeys: decodeLongKeys(this.native),
      // An addon that reads op decoder_layers' embed and op sample's push and advance says so (an older one would not).
      opFields: {
        ...(this.native.decoderLayersEmbed === true ? { decoder_layers: ['embed'] as const } : {}),
        ...sampleFields(this.native),
        matmul: ['weightTail', 'tailFrom'] as const,
        fused_matmul: ['weightTail', 'tailFrom'] as const,
      },
      graphCapture: true,
      peerAccess: false,
      collectives: false,
      fabric: 'DiscreteExplicit' as const,
      ops: OP_NAMES,
    });
  }

  /** Device and build facts: name, compute capability, CUDA versions, which GEMM path is active. */
  info(): Readonly<NativeInfo> {
    return this.native;
  }

  /**
   * Batch-invariant contexts: the cuBLASLt algorithm pinned for each weight shape met so far
   * (`4096x1024: algo 66 tile 92 stages 35; ...`); '' without pins or without
   * batch invariance. Pins fix the bits of every batch-invariant matmul of the process.
   */
  pinnedGemms(): string {
    this.live();
    return this.ctx.info().biGemmPins ?? '';
  }

  private live(): void {
    if (this.disposed) throw new CudaDisposedError();
  }

  private entry(b: DeviceBuffer, what: string): Entry {
    const e = this.buffers.get(b.id);
    if (!e || e.buf !== b) throw new CudaArgumentError(what, `buffer #${b.id} is not a live buffer of this backend`);
    return e;
  }

  private stream(s: StreamHandle | undefined): number {
    const id = s?.id ?? 0;
    if (!this.streams.has(id)) throw new CudaArgumentError('stream', `unknown stream #${id}`);
    return id;
  }

  private range(e: Entry, what: string, offset: number, length: number): void {
    if (!Number.isInteger(offset) || !Number.isInteger(length) || offset < 0 || length < 0 || offset + length > e.length)
      throw new CudaArgumentError(what, `range [${offset}, ${offset + length}) outside buffer of ${e.length} elements`);
  }

  private noCapture(what: string): void {
    if (this.capturing !== null) throw new CudaCaptureStateError(`${what} is not allowed while a graph is being captured`);
  }

  alloc(spec: BufferSpec): DeviceBuffer {
    this.live();
    if (this.hotPath) {
      this.hotPathAllocations++;
      throw new HotPathAllocationError(`alloc ${spec.label ?? spec.dtype}[${spec.length}]`);
    }
    if (!(spec.dtype in DTYPE_BYTES)) throw new CudaArgumentError('alloc', `unknown dtype ${String(spec.dtype)}`);
    if (!Number.isSafeInteger(spec.length) || spec.length < 0) throw new CudaArgumentError('alloc', `length must be a non-negative integer, got ${spec.length}`);
    const tier = spec.tier ?? 'vram';
    const arena = tier === 'vram' ? this.vram : tier === 'pinned' ? this.pinned : null;
    if (!arena) throw new CudaUnsupportedTierError(tier);
    const byteLength = spec.length * DTYPE_BYTES[spec.dtype];
    const { offset, size } = arena.alloc(byteLength);
    const buf = new CudaBuffer(this.nextId++, spec.dtype, spec.length, byteLength, tier, spec.usage ?? 'activations', spec.label);
    const base = tier === 'vram' ? this.native.deviceBase : this.native.pinnedBase;
    this.buffers.set(buf.id, { buf, addr: base + offset, dtype: spec.dtype, length: spec.length, offset, size });
    this.liveBytes += byteLength;
    return buf;
  }

  free(buf: DeviceBuffer): void {
    this.live();
    const e = this.entry(buf, 'free');
    this.buffers.delete(buf.id);
    (buf.tier === 'vram' ? this.vram : this.pinned).free(e.offset, e.size);
    this.liveBytes -= buf.byteLength;
  }

  write(buf: DeviceBuffer, src: HostArray, offset = 0): void {
    this.live();
    this.noCapture('write');
    const e = this.entry(buf, 'write');
    const quant = isQuantDType(e.dtype) ? QUANT_BLOCKS[e.dtype] : undefined;
    if (quant && (!(src instanceof Uint8Array) || src.length % quant.bytes !== 0 || offset % quant.elements !== 0)) {
      throw new CudaArgumentError('write', `a ${e.dtype} buffer takes whole blocks of raw bytes (${quant.bytes} bytes, ${quant.elements} elements) as a Uint8Array at a block offset`);
    }
    this.range(e, 'write', offset, quant ? (src.length / quant.bytes) * quant.elements : src.length);
    let data: ArrayBufferView;
    if (quant) data = src;
    else if (e.dtype === 'f32' && src instanceof Float32Array) data = src;
    else if (e.dtype === 'i32' && src instanceof Int32Array) data = src;
    else if ((e.dtype === 'bf16' || e.dtype === 'f16') && src instanceof Uint16Array) data = src;
    else if ((e.dtype === 'bf16' || e.dtype === 'f16') && src instanceof Float32Array) data = encodeHalf(e.dtype, src);
    else throw new CudaArgumentError('write', `a ${src.constructor.name} cannot be written to a ${e.dtype} buffer`);
    if (data.byteLength === 0) return;
    // Small writes to device memory go through the pinned staging ring and do not block the host
    // (ordered on the default stream, like ops run without a stream). Writes to pinned buffers
    // stay synchronous: the host may read them directly right after.
    const staged = buf.tier === 'vram' && data.byteLength <= STAGED_WRITE_MAX_BYTES;
    let waited: boolean;
    try {
      waited = this.ctx.write(e.addr + offset * DTYPE_BYTES[e.dtype], data, 0, staged);
    } catch (err) {
      throw fromNative(err, 'write');
    }
    if (waited) this.syncs.hard++;
    if (buf.tier === 'vram') this.h2d += data.byteLength;
  }

  read(buf: DeviceBuffer, offset = 0, length?: number): Float32Array | Int32Array {
    this.live();
    this.noCapture('read');
    const e = this.entry(buf, 'read');
    const n = length ?? e.length - offset;
    this.range(e, 'read', offset, n);
    const bytes = n * DTYPE_BYTES[e.dtype];
    let ab: ArrayBuffer;
    try {
      ab = this.ctx.read(e.addr + offset * DTYPE_BYTES[e.dtype], bytes);
    } catch (err) {
      throw fromNative(err, 'read');
    }
    this.syncs.hard++;
    if (buf.tier === 'vram') this.d2h += bytes;
    return this.decode(e.dtype, ab, 0, n);
  }

  private decode(dtype: DType, ab: ArrayBuffer, byteOffset: number, n: number): Float32Array | Int32Array {
    if (dtype === 'f32') return new Float32Array(ab, byteOffset, n);
    if (dtype === 'i32') return new Int32Array(ab, byteOffset, n);
    if (isQuantDType(dtype)) return dequantize(ggmlTypeOf(dtype), new Uint8Array(ab, byteOffset), n) as Float32Array;
    return decodeHalf(dtype, new Uint16Array(ab, byteOffset, n));
  }

  peek(buf: DeviceBuffer, offset = 0, length?: number): Int32Array | Float32Array {
    this.live();
    const e = this.entry(buf, 'peek');
    if (buf.tier !== 'pinned') throw new CudaArgumentError('peek', `buffer #${buf.id} is in ${buf.tier}; only 'pinned' buffers are host-visible`);
    const n = length ?? e.length - offset;
    this.range(e, 'peek', offset, n);
    const eb = DTYPE_BYTES[e.dtype];
    // A copy out of the mapped arena: the caller keeps a stable snapshot while the device writes on.
    const start = e.offset + offset * eb;
    const end = e.offset + (offset + n) * eb;
    const copy = end <= this.pinnedBytes.byteLength ? this.pinnedBytes.slice(start, end) : this.ctx.peekPinned(start, end - start);
    return this.decode(e.dtype, copy, 0, n);
  }

  copy(dst: DeviceBuffer, src: DeviceBuffer, length: number, dstOffset = 0, srcOffset = 0, stream?: StreamHandle): void {
    this.live();
    const d = this.entry(dst, 'copy dst');
    const s = this.entry(src, 'copy src');
    if (d.dtype !== s.dtype) throw new CudaArgumentError('copy', `dtypes differ (${s.dtype} -> ${d.dtype}); copies do not convert`);
    this.range(d, 'copy dst', dstOffset, length);
    this.range(s, 'copy src', srcOffset, length);
    const eb = DTYPE_BYTES[d.dtype];
    const bytes = length * eb;
    try {
      this.ctx.copy(d.addr + dstOffset * eb, s.addr + srcOffset * eb, bytes, this.stream(stream));
    } catch (err) {
      throw fromNative(err, 'copy');
    }
    if (dst.tier === 'vram' && src.tier === 'vram') this.d2d += bytes;
    else if (dst.tier === 'vram') this.h2d += bytes;
    else if (src.tier === 'vram') this.d2h += bytes;
  }

  run<K extends OpName>(op: K, args: OpArgs<K>, stream?: StreamHandle): void {
    this.live();
    const sid = this.stream(stream);
    if (op === 'mlp_slice') {
      this.mlpSlice(args as OpArgs<'mlp_slice'>, stream);
      return;
    }
    // A cache in pinned memory with host staging: the host computes over it. Without staging the
    // kernels read it through the mapping (zero-copy over the link), like any device buffer.
    if (op === 'attention' && (args as OpArgs<'attention'>).kCache?.tier === 'pinned' && (args as OpArgs<'attention'>).qHost !== undefined) {
      this.hostAttention(args as OpArgs<'attention'>, stream);
      return;
    }
    // An addon that does not apply op sample's mask must not sample a masked row as if it were free.
    if (op === 'sample' && (args as OpArgs<'sample'>).mask !== undefined && this.native.sampleMask !== true) {
      throw new CudaArgumentError('op sample', 'mask needs an addon that applies it (sampleMask); this build does not: sample masked rows on the host');
    }
    const enc = this.encoder;
    enc.encode(op, args);
    try {
      this.ctx.launch(OP_CODES[op], enc.args, enc.n, sid);
    } catch (err) {
      throw fromNative(err, `op ${op}`);
    }
  }

  /** Native argument blocks of op mlp_slice, one per distinct set of buffers (see host-mlp.ts). */
  private readonly hostMlps = new Map<string, number>();

  private mlpSlice(a: OpArgs<'mlp_slice'>, stream: StreamHandle | undefined): void {
    const native = this.ctx as unknown as Partial<HostMlpNative>;
    if (typeof native.hostMlpCreate !== 'function') throw new CudaArgumentError('mlp_slice', 'the addon was built without the host MLP (rebuild it)');
    const bufs: Record<string, DeviceBuffer | undefined> = { x: a.x, out: a.out, normWeight: a.normWeight, gateUp: a.gateUp, down: a.down, xHost: a.xHost, yHost: a.yHost };
    const key = hostMlpKey(a, (name) => {
      const b = bufs[name];
      if (!b) return undefined;
      const e = this.entry(b, `mlp_slice ${name}`);
      return { addr: e.addr, dtype: e.dtype, length: e.length, tier: b.tier, id: b.id };
    });
    const addr = (b: DeviceBuffer | undefined) => this.entry(b!, 'mlp_slice').addr;
    let id = this.hostMlps.get(key);
    if (id === undefined) {
      if (this.hotPath) {
        this.hotPathAllocations++;
        throw new HotPathAllocationError('mlp_slice argument block');
      }
      try {
        id = native.hostMlpCreate!({ rows: a.rows, hidden: a.hidden, inter: a.inter, eps: a.eps, x: addr(a.xHost), normW: addr(a.normWeight), gateUp: addr(a.gateUp), down: addr(a.down), y: addr(a.yHost) });
      } catch (err) {
        throw fromNative(err, 'mlp_slice');
      }
      this.hostMlps.set(key, id);
    }
    const n = a.rows * a.hidden;
    this.copy(a.xHost!, a.x, n, 0, 0, stream);
    try {
      native.hostMlpEnqueue!(id, this.stream(stream));
    } catch (err) {
      throw fromNative(err, 'mlp_slice');
    }
    this.copy(a.out, a.yHost!, n, 0, 0, stream);
  }

  /** Native argument blocks of host attention (KV in pinned memory), see host-attention.ts. */
  private readonly hostAttns = new Map<string, number>();

  private hostAttention(a: OpArgs<'attention'>, stream: StreamHandle | undefined): void {
    const native = this.ctx as unknown as Partial<HostAttnNative>;
    if (typeof native.hostAttnCreate !== 'function') throw new CudaArgumentError('op attention', 'the addon was built without host attention (rebuild it)');
    if (a.lse && this.capabilities.numerics === 'bf16') throw new CudaArgumentError('op attention', 'partial attention (lse) is defined for exact numerics only');
    const bufs = a as unknown as Record<string, DeviceBuffer | undefined>;
    const { key, create } = hostAttentionPlan(a, (name) => {
      const b = bufs[name];
      if (!b) return undefined;
      const e = this.entry(b, `op attention ${name}`);
      return { addr: e.addr, dtype: e.dtype, length: e.length, tier: b.tier, id: b.id };
    });
    if (a.rows === 0) return;
    let id = this.hostAttns.get(key);
    if (id === undefined) {
      if (this.hotPath) {
        this.hotPathAllocations++;
        throw new HotPathAllocationError('host attention argument block');
      }
      try {
        id = native.hostAttnCreate!(create);
      } catch (err) {
        throw fromNative(err, 'op attention');
      }
      this.hostAttns.set(key, id);
    }
    try {
      native.hostAttnEnqueue!(id, this.stream(stream));
    } catch (err) {
      throw fromNative(err, 'op attention');
    }
    // The addon's round trip ends with out (and lse) on the device.
  }

  createStream(): StreamHandle {
    this.live();
    const id = this.ctx.createStream();
    this.streams.add(id);
    return { id };
  }

  destroyStream(stream: StreamHandle): void {
    this.live();
    if (stream.id === 0) throw new CudaArgumentError('destroyStream', 'the default stream cannot be destroyed');
    this.stream(stream);
    this.ctx.destroyStream(stream.id);
    this.streams.delete(stream.id);
  }

  createEvent(): EventHandle {
    this.live();
    const id = this.ctx.createEvent();
    this.events.add(id);
    return { id };
  }

  private event(e: EventHandle): number {
    if (!this.events.has(e.id)) throw new CudaArgumentError('event', `unknown event #${e.id}`);
    return e.id;
  }

  destroyEvent(event: EventHandle): void {
    this.live();
    this.ctx.destroyEvent(this.event(event));
    this.events.delete(event.id);
  }

  record(event: EventHandle, stream?: StreamHandle): void {
    this.live();
    try {
      this.ctx.record(this.event(event), this.stream(stream));
    } catch (err) {
      throw fromNative(err, 'record');
    }
  }

  waitEvent(stream: StreamHandle, event: EventHandle): void {
    this.live();
    try {
      this.ctx.waitEvent(this.stream(stream), this.event(event));
    } catch (err) {
      throw fromNative(err, 'waitEvent');
    }
    this.syncs.soft_visibility++;
  }

  elapsedMs(start: EventHandle, end: EventHandle): number {
    this.live();
    try {
      return this.ctx.elapsed(this.event(start), this.event(end));
    } catch (err) {
      throw fromNative(err, 'elapsedMs');
    }
  }

  synchronize(kind: SyncKind, stream?: StreamHandle): void {
    this.live();
    this.noCapture('synchronize');
    if (!(kind in this.syncs)) throw new CudaArgumentError('synchronize', `unknown sync kind ${String(kind)}`);
    try {
      this.ctx.synchronize(stream ? this.stream(stream) : -1);
    } catch (err) {
      throw fromNative(err, 'synchronize');
    }
    this.syncs[kind]++;
  }

  synchronizeEvent(event: EventHandle, kind: SyncKind): void {
    this.live();
    this.noCapture('synchronizeEvent');
    if (!(kind in this.syncs)) throw new CudaArgumentError('synchronizeEvent', `unknown sync kind ${String(kind)}`);
    try {
      this.ctx.synchronizeEvent(this.event(event));
    } catch (err) {
      throw fromNative(err, 'synchronizeEvent');
    }
    this.syncs[kind]++;
  }

  beginCapture(stream?: StreamHandle): void {
    this.live();
    if (this.capturing !== null) throw new CudaCaptureStateError(`stream #${this.capturing} is already capturing`);
    const sid = this.stream(stream);
    try {
      this.ctx.beginCapture(sid);
    } catch (err) {
      throw fromNative(err, 'beginCapture');
    }
    this.capturing = sid;
  }

  endCapture(stream?: StreamHandle): GraphHandle {
    this.live();
    const sid = this.stream(stream);
    if (this.capturing !== sid) throw new CudaCaptureStateError(`stream #${sid} is not capturing`);
    this.capturing = null;
    let id: number, nodes: number;
    try {
      [id, nodes] = this.ctx.endCapture(sid);
    } catch (err) {
      throw fromNative(err, 'endCapture');
    }
    const g: GraphHandle = Object.freeze({ id, nodes });
    this.graphs.set(id, g);
    return g;
  }

  replay(graph: GraphHandle, stream?: StreamHandle): void {
    this.live();
    if (this.graphs.get(graph.id) !== graph) throw new CudaArgumentError('replay', `unknown graph #${graph.id}`);
    try {
      this.ctx.replay(graph.id, this.stream(stream));
    } catch (err) {
      throw fromNative(err, 'replay');
    }
  }

  destroyGraph(graph: GraphHandle): void {
    this.live();
    if (this.graphs.get(graph.id) !== graph) throw new CudaArgumentError('destroyGraph', `unknown graph #${graph.id}`);
    this.ctx.destroyGraph(graph.id);
    this.graphs.delete(graph.id);
  }

  setHotPath(armed: boolean): void {
    this.live();
    this.hotPath = armed;
    this.ctx.setHotPath(armed);
  }

  stats(): BackendStats {
    const c = this.disposed ? this.finalCounters : this.ctx.counters();
    return {
      liveBuffers: this.buffers.size,
      liveBytes: this.liveBytes,
      allocCalls: c.allocCalls,
      freeCalls: c.freeCalls,
      hotPathAllocations: this.hotPathAllocations + c.hotPathRejected,
      h2dBytes: this.h2d,
      d2hBytes: this.d2h,
      d2dBytes: this.d2d,
      launches: c.launches,
      graphReplays: c.graphReplays,
      syncs: { ...this.syncs },
      ...this.hostComputeStats(),
    };
  }

  /** Time the host CPU spent computing ops near data (host MLP slices, host attention). */
  private hostComputeStats(): Pick<BackendStats, 'hostComputeMs' | 'hostComputeMsByOp'> {
    const native = this.ctx as unknown as Partial<HostMlpNative & HostAttnNative>;
    if (this.disposed) return {};
    let mlpNs = 0;
    let attnNs = 0;
    let any = false;
    if (this.hostMlps.size > 0 && typeof native.hostMlpStats === 'function') {
      mlpNs = native.hostMlpStats().ns;
      any = true;
    }
    if (this.hostAttns.size > 0 && typeof native.hostAttnStats === 'function') {
      attnNs = native.hostAttnStats().ns;
      any = true;
    }
    return any ? { hostComputeMs: (mlpNs + attnNs) / 1e6, hostComputeMsByOp: { mlp_slice: mlpNs / 1e6, attention: attnNs / 1e6 } } : {};
  }

  private finalCounters = { allocCalls: 0, freeCalls: 0, launches: 0, graphReplays: 0, hotPathRejected: 0 };

  /**
   * Device-to-device copy bandwidth in GB/s (bytes read + written), timed with CUDA events over
   * `iters` copies of `bytes`. Allocates two scratch buffers (counted in allocCalls), so it is
   * refused while the hot-path guard is armed. The roofline of batch-1 decode is this figure
   * divided by the weight bytes read per token.
   */
  measureCopyBandwidth(bytes = 2 ** 30, iters = 20): number {
    this.live();
    if (this.hotPath) {
      this.hotPathAllocations++;
      throw new HotPathAllocationError('measureCopyBandwidth scratch buffers');
    }
    try {
      return this.ctx.copyBandwidth(bytes, iters);
    } catch (err) {
      throw fromNative(err, 'measureCopyBandwidth');
    }
  }

  dispose(): void {
    if (this.disposed) return;
    const native = this.ctx as unknown as Partial<HostMlpNative>;
    for (const id of this.hostMlps.values()) native.hostMlpDestroy?.(id);
    this.hostMlps.clear();
    const attn = this.ctx as unknown as Partial<HostAttnNative>;
    for (const id of this.hostAttns.values()) attn.hostAttnDestroy?.(id);
    this.hostAttns.clear();
    this.ctx.dispose();
    this.finalCounters = this.ctx.counters();
    this.disposed = true;
    this.buffers.clear();
    this.liveBytes = 0;
  }
}

/** Op sample's optional fields the addon reads: push and advance (sampleStepTail), mask (sampleMask). */
function sampleFields(n: NativeInfo): { sample?: readonly ('push' | 'advance' | 'mask')[] } {
  const f: ('push' | 'advance' | 'mask')[] = [];
  if (n.sampleStepTail === true) f.push('push', 'advance');
  if (n.sampleMask === true) f.push('mask');
  return f.length > 0 ? { sample: f } : {};
}
