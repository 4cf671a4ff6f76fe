/**
 * CpuBackend: the reference implementation of the device-backend contract. Everything runs
 * synchronously on the calling thread, so streams order nothing and events only timestamp; graph
 * capture records ops and replays them, which is enough for the engine to drive the CPU exactly
 * as it drives a GPU.
 */
import os from 'node:os';
import {
  BackendError,
  DTYPE_BYTES,
  QUANT_BLOCKS,
  QUANT_DTYPES,
  dequantize,
  ggmlTypeOf,
  isQuantDType,
  OP_NAMES,
  SYNC_KINDS,
  UnsupportedOpError,
  emptySyncCounts,
  NUMERICS,
  MATMUL_PRECISIONS,
  type BackendCapabilities,
  type BackendStats,
  type BufferSpec,
  type DeviceBackend,
  type DeviceBuffer,
  type EventHandle,
  type GraphHandle,
  type HostArray,
  type MatmulPrecision,
  type Numerics,
  type OpArgs,
  type OpName,
  type StreamHandle,
  type SyncCounts,
  type SyncKind,
  type Tier,
} from '@nerva/core';
import { BufferTable, type BufferRecord } from './buffers.js';
import { countedNodes, type GraphNode } from './capture.js';
import {
  BackendDisposedError,
  BufferDTypeError,
  BufferRangeError,
  CaptureStateError,
  CpuBackendOptionError,
  EventStateError,
  UnknownHandleError,
} from './errors.js';
import { decodeHalfInto, roundHalfInto } from './half.js';
import { OpContext } from './op-context.js';
import { KERNELS, type Kernel } from './ops/index.js';
import { DEFAULT_SCRATCH, Scratch, type ScratchSizes } from './scratch.js';

/**
 * Relative tolerance the CPU backend claims. Every op accumulates in float64 and rounds once to
 * float32 on store (half an ulp, 6e-8 relative), except where the contract stores an
 * intermediate in float32 (the residual stream, the QK-normed head before rotation), which adds
 * a few more float32 roundings. 1e-6 of max |reference| bounds that with a margin of ~4x.
 */
export const CPU_REL_TOL = 1e-6;

/**
 * Relative tolerance under bf16 numerics. A bf16 rounding point turns an accumulation-order
 * difference of ~1e-7 into a whole bf16 ulp (2^-8 = 3.9e-3 relative) on the rare element whose
 * float32 sum lies next to a rounding boundary, and an op chains up to ~4 such points; 2e-2 of
 * max |reference| admits those flips and still fails a wrong formula. Whether the rounding points
 * are transformers' own is tested against its bf16 runs (the fixtures' greedy_bf16_gpu tokens),
 * which a tolerance of this size cannot tell.
 */
export const BF16_NUMERICS_REL_TOL = 2e-2;

/**
 * Relative tolerance under matmul precision 'bf16' (exact numerics): a matmul over more than 8
 * rows rounds its activations to bf16 (2^-9 relative each), the same figure the CUDA backend
 * declares for its one-GEMM bf16 path (CUDA_REL_TOL_BF16_GEMM).
 */
export const BF16_MATMUL_REL_TOL = 1e-2;

export interface CpuBackendOptions {
  /** Name reported by `name` (default 'cpu'). */
  name?: string;
  /** Bytes of dram (the compute tier) the backend may hand out (default: os.totalmem()). */
  memoryBytes?: number;
  /**
   * Bytes of the 'pinned' tier (default: os.totalmem()). On the CPU it is ordinary memory,
   * accounted apart from the compute tier, so the memory OS can hold host replicas and stream
   * them into a compute-tier budget exactly as it does on a GPU.
   */
  hostMemoryBytes?: number;
  /** Scratch sizes reserved at construction so decode allocates nothing (defaults fit 256k vocab, 8k context). */
  scratch?: Partial<ScratchSizes>;
  /**
   * Activation rounding (default 'exact': float64 accumulation, float32 storage). 'bf16' rounds
   * activations where transformers' bf16 eager forward does (see `Numerics` in @nerva/core).
   */
  numerics?: Numerics;
  /**
   * Many-row matmul precision (default 'exact'). 'bf16': matmul and fused_matmul (and so
   * decoder_layers) over more than 8 rows round their activations to bf16 before the products,
   * which still accumulate in float64: the rounding of the CUDA backend's one-GEMM bf16 path, so
   * its effect can be tested here. See `MatmulPrecision` in @nerva/core.
   */
  matmulPrecision?: MatmulPrecision;
}

interface CaptureState {
  stream: number;
  nodes: GraphNode[];
  /** Streams forked from the capture (they waited on an event it recorded). */
  joined: Set<number>;
  /** Events recorded inside the capture. */
  recorded: Set<number>;
}

const DEFAULT_STREAM = 0;

export class CpuBackend implements DeviceBackend {
  readonly name: string;
  readonly capabilities: BackendCapabilities;

  private readonly buffers: BufferTable;
  private readonly ctx: OpContext;
  private readonly streams = new Set<number>([DEFAULT_STREAM]);
  /** Event id -> timestamp of its last record (NaN until recorded). */
  private readonly events = new Map<number, number>();
  private readonly graphs = new Map<number, { handle: GraphHandle; nodes: readonly GraphNode[] }>();
  private capture: CaptureState | undefined;
  private nextHandle = 1;
  private disposed = false;
  private h2dBytes = 0;
  private d2hBytes = 0;
  private d2dBytes = 0;
  private launches = 0;
  private graphReplays = 0;
  private readonly syncs: SyncCounts = emptySyncCounts();

  constructor(opts: CpuBackendOptions = {}) {
    this.name = opts.name ?? 'cpu';
    const numerics = opts.numerics ?? 'exact';
    if (!NUMERICS.includes(numerics)) throw new CpuBackendOptionError('numerics', `unknown numerics ${String(numerics)} (expected ${NUMERICS.join(' or ')})`);
    const matmulPrecision = opts.matmulPrecision ?? 'exact';
    if (!MATMUL_PRECISIONS.includes(matmulPrecision))
      throw new CpuBackendOptionError('matmulPrecision', `unknown matmul precision ${String(matmulPrecision)} (expected ${MATMUL_PRECISIONS.join(' or ')})`);
    const memory = opts.memoryBytes ?? os.totalmem();
    const hostMemory = opts.hostMemoryBytes ?? os.totalmem();
    const cpus = os.cpus();
    this.capabilities = Object.freeze({
      deviceKind: 'cpu',
      deviceName: cpus.length > 0 ? cpus[0].model.trim() : 'cpu',
      deviceCount: 1,
      memory: Object.freeze({ dram: memory, pinned: hostMemory }),
      computeTier: 'dram' as Tier,
      dtypes: Object.freeze(['f32', 'bf16', 'f16', 'i32', ...QUANT_DTYPES] as const),
      weightDtype: 'f32',
      precision: Object.freeze(
        numerics === 'bf16'
          ? { compute: 'bf16' as const, relTol: BF16_NUMERICS_REL_TOL }
          : matmulPrecision === 'bf16'
            ? { compute: 'bf16' as const, relTol: BF16_MATMUL_REL_TOL }
            : { compute: 'f32' as const, relTol: CPU_REL_TOL },
      ),
      numerics,
      matmulPrecision,
      activationDtypes: Object.freeze(['bf16'] as const),
      // The embedding gather inside the stack op; a decode step's tail (ring push, advance) inside op sample.
      opFields: Object.freeze({ decoder_layers: ['embed'], sample: ['push', 'advance', 'mask'], matmul: ['weightTail', 'tailFrom'], fused_matmul: ['weightTail', 'tailFrom'] } as const),
      graphCapture: true,
      peerAccess: false,
      collectives: false,
      fabric: 'CoherentSharedPhysical',
      ops: OP_NAMES,
    });
    this.buffers = new BufferTable({ dram: memory, pinned: hostMemory }, 'dram');
    this.ctx = new OpContext(this.buffers, new Scratch({ ...DEFAULT_SCRATCH, ...opts.scratch }), numerics, matmulPrecision);
  }

  // ---- memory -------------------------------------------------------------------------------

  alloc(spec: BufferSpec): DeviceBuffer {
    this.live();
    return this.buffers.alloc(spec);
  }

  free(buf: DeviceBuffer): void {
    this.live();
    this.buffers.free(buf);
  }

  write(buf: DeviceBuffer, src: HostArray, offset = 0): void {
    this.live();
    this.noCapture('write');
    const rec = this.buffers.resolve(buf, 'write');
    const what = `write to buffer #${buf.id}`;
    const dt = buf.dtype;
    if (isQuantDType(dt)) {
      // Held decoded, like the half types: ops read f32, so a quantized matmul is bit for bit the
      // f32 matmul over the dequantized weights (the reference the quantized backends are held to).
      if (!(src instanceof Uint8Array)) throw new BufferDTypeError(what, `a ${dt} buffer takes its raw blocks as a Uint8Array, got ${typeName(src)}`);
      const { elements, bytes } = QUANT_BLOCKS[dt];
      if (offset % elements !== 0 || src.length % bytes !== 0) {
        throw new BufferDTypeError(what, `${dt} writes whole blocks (${bytes} bytes, ${elements} elements); got ${src.length} bytes at element ${offset}`);
      }
      const n = (src.length / bytes) * elements;
      checkRange(what, buf.length, offset, n);
      dequantize(ggmlTypeOf(dt), src, n, (rec.data as Float32Array).subarray(offset, offset + n));
      this.h2dBytes += src.length;
      return;
    }
    checkRange(what, buf.length, offset, src?.length);
    if (dt === 'f32' || dt === 'i32') {
      const want = dt === 'f32' ? Float32Array : Int32Array;
      if (!(src instanceof want)) throw new BufferDTypeError(what, `a ${dt} buffer takes a ${want.name}, got ${typeName(src)}`);
      rec.data.set(src, offset);
    } else {
      const dst = rec.data as Float32Array;
      if (src instanceof Uint16Array) decodeHalfInto(dt, src, dst, offset);
      else if (src instanceof Float32Array) roundHalfInto(dt, src, dst, offset);
      else throw new BufferDTypeError(what, `a ${dt} buffer takes a Uint16Array (raw bits) or a Float32Array, got ${typeName(src)}`);
    }
    this.h2dBytes += src.length * DTYPE_BYTES[dt];
  }

  /** A copy of the range, as float32 (float dtypes) or int32. Counted as a hard sync. */
  read(buf: DeviceBuffer, offset = 0, length?: number): Float32Array | Int32Array {
    this.live();
    this.noCapture('read');
    const rec = this.buffers.resolve(buf, 'read');
    const n = length ?? buf.length - offset;
    checkRange(`read from buffer #${buf.id}`, buf.length, offset, n);
    this.d2hBytes += n * DTYPE_BYTES[buf.dtype];
    this.syncs.hard++;
    return rec.data.slice(offset, offset + n);
  }

  /**
   * Every buffer of this backend is host memory, so peek is a plain copy of the range: no sync is
   * counted (the bytes are, as d2h). Allowed during capture, like reading a mapped buffer.
   */
  peek(buf: DeviceBuffer, offset = 0, length?: number): Float32Array | Int32Array {
    this.live();
    const rec = this.buffers.resolve(buf, 'peek');
    const n = length ?? buf.length - offset;
    checkRange(`peek at buffer #${buf.id}`, buf.length, offset, n);
    this.d2hBytes += n * DTYPE_BYTES[buf.dtype];
    return rec.data.slice(offset, offset + n);
  }

  copy(dst: DeviceBuffer, src: DeviceBuffer, length: number, dstOffset = 0, srcOffset = 0, stream?: StreamHandle): void {
    this.live();
    const s = this.streamId(stream);
    this.checkCopy(dst, src, length, dstOffset, srcOffset);
    if (this.capturing(s)) {
      this.capture!.nodes.push({ kind: 'copy', dst, src, length, dstOffset, srcOffset });
      return;
    }
    this.doCopy(dst, src, length, dstOffset, srcOffset);
  }

  private checkCopy(dst: DeviceBuffer, src: DeviceBuffer, length: number, dstOffset: number, srcOffset: number): [BufferRecord, BufferRecord] {
    const d = this.buffers.resolve(dst, 'copy destination');
    const s = this.buffers.resolve(src, 'copy source');
    const what = `copy #${src.id} -> #${dst.id}`;
    if (dst.dtype !== src.dtype) throw new BufferDTypeError(what, `dtypes differ (${src.dtype} -> ${dst.dtype}); copies do not convert`);
    checkRange(`${what} (source)`, src.length, srcOffset, length);
    checkRange(`${what} (destination)`, dst.length, dstOffset, length);
    return [d, s];
  }

  private doCopy(dst: DeviceBuffer, src: DeviceBuffer, length: number, dstOffset: number, srcOffset: number): void {
    const [d, s] = this.checkCopy(dst, src, length, dstOffset, srcOffset);
    // copyWithin semantics for the same buffer: TypedArray#set copies through a temporary when
    // both views share a buffer, so overlapping ranges are safe.
    d.data.set(s.data.subarray(srcOffset, srcOffset + length), dstOffset);
    this.d2dBytes += length * DTYPE_BYTES[dst.dtype];
  }

  // ---- ops ----------------------------------------------------------------------------------

  run<K extends OpName>(op: K, args: OpArgs<K>, stream?: StreamHandle): void {
    this.live();
    const s = this.streamId(stream);
    const kernel = KERNELS[op] as Kernel<K> | undefined;
    if (kernel === undefined || !Object.prototype.hasOwnProperty.call(KERNELS, op)) throw new UnsupportedOpError(this.name, String(op));
    if (this.capturing(s)) {
      // A mis-sized op fails here, at capture, like a bad launch would; the checks that depend on
      // buffer contents (ids, slots, positions) can only run at replay.
      this.exec(op, args, true);
      this.capture!.nodes.push({ kind: 'op', op, args: { ...args } });
      return;
    }
    this.exec(op, args);
    this.launches++;
  }

  /** Run a kernel, or with `dry` only its static checks (attributes, handles, dtypes, sizes). */
  private exec<K extends OpName>(op: K, args: OpArgs<K>, dry = false): void {
    this.ctx.op = op;
    this.ctx.dry = dry;
    try {
      (KERNELS[op] as Kernel<K>)(this.ctx, args);
    } finally {
      this.ctx.op = '';
      this.ctx.dry = false;
    }
  }

  // ---- streams and events -------------------------------------------------------------------

  createStream(): StreamHandle {
    this.live();
    const id = this.nextHandle++;
    this.streams.add(id);
    return Object.freeze({ id });
  }

  destroyStream(stream: StreamHandle): void {
    this.live();
    const id = this.streamId(stream);
    if (id === DEFAULT_STREAM) throw new UnknownHandleError('stream', id, 'the default stream cannot be destroyed');
    if (this.capture?.stream === id) throw new CaptureStateError(`stream #${id} is capturing; end the capture first`);
    this.streams.delete(id);
  }

  createEvent(): EventHandle {
    this.live();
    const id = this.nextHandle++;
    this.events.set(id, NaN);
    return Object.freeze({ id });
  }

  destroyEvent(event: EventHandle): void {
    this.live();
    this.eventTime(event);
    this.events.delete(event.id);
  }

  record(event: EventHandle, stream?: StreamHandle): void {
    this.live();
    const s = this.streamId(stream);
    this.eventTime(event);
    if (this.capturing(s)) {
      this.capture!.nodes.push({ kind: 'record', event });
      this.capture!.recorded.add(event.id);
      return;
    }
    this.events.set(event.id, performance.now());
  }

  /**
   * Whether work issued on stream s is captured: the capture's own stream, and (as in CUDA) any
   * stream that waited on an event recorded inside the capture, which joins it until it ends.
   */
  private capturing(s: number): boolean {
    return this.capture !== undefined && (this.capture.stream === s || this.capture.joined.has(s));
  }

  /** Work is already complete when it is issued, so there is nothing to wait for; still counted. */
  waitEvent(stream: StreamHandle, event: EventHandle): void {
    this.live();
    const ws = this.streamId(stream);
    // A stream waiting on an event recorded inside the capture forks from it: it joins the capture.
    if (this.capture !== undefined && this.capture.recorded.has(event.id)) this.capture.joined.add(ws);
    this.eventTime(event);
    this.syncs.soft_visibility++;
  }

  elapsedMs(start: EventHandle, end: EventHandle): number {
    this.live();
    const t0 = this.eventTime(start);
    const t1 = this.eventTime(end);
    if (Number.isNaN(t0)) throw new EventStateError(start.id, 'not recorded');
    if (Number.isNaN(t1)) throw new EventStateError(end.id, 'not recorded');
    return t1 - t0;
  }

  synchronize(kind: SyncKind, stream?: StreamHandle): void {
    this.live();
    this.streamId(stream);
    if (!(SYNC_KINDS as readonly string[]).includes(kind)) throw new BackendError('INVALID_SYNC_KIND', `synchronize: unknown sync kind ${String(kind)}`);
    this.noCapture('synchronize');
    this.syncs[kind]++;
  }

  /** Work is complete when issued: only the event's state is checked, and the sync counted. */
  synchronizeEvent(event: EventHandle, kind: SyncKind): void {
    this.live();
    if (!(SYNC_KINDS as readonly string[]).includes(kind)) throw new BackendError('INVALID_SYNC_KIND', `synchronizeEvent: unknown sync kind ${String(kind)}`);
    this.noCapture('synchronizeEvent');
    if (Number.isNaN(this.eventTime(event))) throw new EventStateError(event.id, 'not recorded');
    this.syncs[kind]++;
  }

  // ---- graphs -------------------------------------------------------------------------------

  beginCapture(stream?: StreamHandle): void {
    this.live();
    const s = this.streamId(stream);
    if (this.capture !== undefined) throw new CaptureStateError(`a capture is already open on stream #${this.capture.stream}`);
    this.capture = { stream: s, nodes: [], joined: new Set(), recorded: new Set() };
  }

  endCapture(stream?: StreamHandle): GraphHandle {
    this.live();
    const s = this.streamId(stream);
    const cap = this.capture;
    if (cap === undefined) throw new CaptureStateError('endCapture without beginCapture');
    if (cap.stream !== s) throw new CaptureStateError(`the capture is open on stream #${cap.stream}, not #${s}`);
    this.capture = undefined;
    const handle: GraphHandle = Object.freeze({ id: this.nextHandle++, nodes: countedNodes(cap.nodes) });
    this.graphs.set(handle.id, { handle, nodes: Object.freeze(cap.nodes) });
    return handle;
  }

  replay(graph: GraphHandle, stream?: StreamHandle): void {
    this.live();
    this.streamId(stream);
    const g = this.graphOf(graph);
    if (this.capture !== undefined) throw new CaptureStateError('replay inside a capture is not supported');
    for (const node of g.nodes) {
      if (node.kind === 'op') this.exec(node.op, node.args as unknown as OpArgs<OpName>);
      else if (node.kind === 'copy') this.doCopy(node.dst, node.src, node.length, node.dstOffset, node.srcOffset);
      else if (this.events.has(node.event.id)) this.events.set(node.event.id, performance.now());
    }
    this.graphReplays++;
  }

  destroyGraph(graph: GraphHandle): void {
    this.live();
    this.graphOf(graph);
    this.graphs.delete(graph.id);
  }

  // ---- guard, stats, lifetime ---------------------------------------------------------------

  setHotPath(armed: boolean): void {
    this.live();
    this.buffers.hotPath = armed;
  }

  stats(): BackendStats {
    const b = this.buffers;
    return {
      liveBuffers: b.liveBuffers,
      liveBytes: b.liveBytes,
      allocCalls: b.allocCalls,
      freeCalls: b.freeCalls,
      hotPathAllocations: b.hotPathAllocations,
      h2dBytes: this.h2dBytes,
      d2hBytes: this.d2hBytes,
      d2dBytes: this.d2dBytes,
      launches: this.launches,
      graphReplays: this.graphReplays,
      syncs: { ...this.syncs },
    };
  }

  /** Frees every buffer and handle; any later call except stats() throws BackendDisposedError. */
  dispose(): void {
    if (this.disposed) return;
    this.buffers.clear();
    this.graphs.clear();
    this.events.clear();
    this.streams.clear();
    this.capture = undefined;
    this.disposed = true;
  }

  // ---- helpers ------------------------------------------------------------------------------

  private live(): void {
    if (this.disposed) throw new BackendDisposedError(this.name);
  }

  private noCapture(what: string): void {
    if (this.capture !== undefined) throw new CaptureStateError(`${what} is a host operation and cannot be issued during graph capture`);
  }

  private streamId(stream: StreamHandle | undefined): number {
    if (stream === undefined) return DEFAULT_STREAM;
    if (stream === null || typeof stream !== 'object' || !this.streams.has(stream.id)) throw new UnknownHandleError('stream', stream?.id ?? NaN, 'not a live stream of this backend');
    return stream.id;
  }

  private eventTime(event: EventHandle): number {
    const t = event === null || typeof event !== 'object' ? undefined : this.events.get(event.id);
    if (t === undefined) throw new UnknownHandleError('event', event?.id ?? NaN, 'not a live event of this backend');
    return t;
  }

  private graphOf(graph: GraphHandle): { handle: GraphHandle; nodes: readonly GraphNode[] } {
    const g = graph === null || typeof graph !== 'object' ? undefined : this.graphs.get(graph.id);
    if (g === undefined || g.handle !== graph) throw new UnknownHandleError('graph', graph?.id ?? NaN, 'not a live graph of this backend');
    return g;
  }
}

/** Create a CPU backend (same as `new CpuBackend(opts)`). */
export function createCpuBackend(opts?: CpuBackendOptions): CpuBackend {
  return new CpuBackend(opts);
}

function checkRange(what: string, bufLength: number, offset: number, length: number | undefined): void {
  if (!Number.isSafeInteger(offset) || offset < 0) throw new BufferRangeError(what, `offset must be a non-negative integer, got ${String(offset)}`);
  if (length === undefined || !Number.isSafeInteger(length) || length < 0) throw new BufferRangeError(what, `length must be a non-negative integer, got ${String(length)}`);
  if (offset + length > bufLength) throw new BufferRangeError(what, `range [${offset}, ${offset + length}) is outside the buffer (${bufLength} elements)`);
}

function typeName(x: unknown): string {
  return x === null || x === undefined ? String(x) : ((x as object).constructor?.name ?? typeof x);
}
