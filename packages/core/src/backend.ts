/**
 * The device-backend contract. A backend is a package that implements this interface and
 * passes the conformance suite (`runConformance`). No base class: capabilities are data,
 * checked when a backend is selected.
 */
import type { DType } from './dtype.js';
import type { FabricKind } from './fabric.js';
import type { OpArgs, OpName } from './ops.js';
import type { SyncCounts, SyncKind } from './sync.js';
import type { Tier } from './tiers.js';

export type BufferUsage = 'weights' | 'kv' | 'activations' | 'io' | 'workspace';

export interface BufferSpec {
  dtype: DType;
  /** Number of elements. */
  length: number;
  /** Defaults to the backend's compute tier (vram for a GPU, dram for the CPU). */
  tier?: Tier;
  usage?: BufferUsage;
  label?: string;
}

/** An opaque handle; only the backend that made it can read or write it. */
export interface DeviceBuffer {
  readonly id: number;
  readonly dtype: DType;
  readonly length: number;
  readonly byteLength: number;
  readonly tier: Tier;
  readonly usage: BufferUsage;
  readonly label?: string;
}

export interface StreamHandle {
  readonly id: number;
}
export interface EventHandle {
  readonly id: number;
}
export interface GraphHandle {
  readonly id: number;
  /** Number of nodes (kernels and copies) the graph replays. */
  readonly nodes: number;
}

/** The precision a backend promises; the conformance suite derives its tolerance from it. */
export interface BackendPrecision {
  /** The narrowest type intermediate values are rounded to. */
  compute: 'f64' | 'f32' | 'bf16' | 'f16';
  /** Relative tolerance (to max |reference|) the backend claims on every op. */
  relTol: number;
}

/**
 * How a backend rounds activations.
 * - 'exact' (the default): activations stay float32 (or wider) from op to op; the answer is the
 *   float math of the checkpoint, and the declared precision bounds the distance to it.
 * - 'bf16': reference-compatibility mode. Activations are rounded to bfloat16 (nearest even) at
 *   the points where Hugging Face transformers' bf16 eager forward rounds them (ops.ts, "bf16
 *   numerics"), weights and KV caches are bf16, accumulation stays float32. Use it to reproduce a
 *   transformers bf16 run, rounding for rounding; it is further from the exact answer.
 */
export type Numerics = 'exact' | 'bf16';

export const NUMERICS: readonly Numerics[] = ['exact', 'bf16'];

/**
 * How a backend computes matmuls over many rows (prefill chunks, large decode batches: more than
 * {@link BF16_MATMUL_MAX_EXACT_ROWS} rows). Separate from {@link Numerics}, which rounds
 * activations everywhere.
 * - 'exact' (the default): f32-grade products. On CUDA the activations are split into two bf16
 *   halves and multiplied by two tensor-core GEMMs with fp32 accumulation (about 16 mantissa bits
 *   kept); the CPU multiplies float32 activations in float64.
 * - 'bf16': the activations are rounded to bfloat16 (nearest even) once before the product, with
 *   fp32 (or wider) accumulation: what a PyTorch bf16 model's GEMMs do, one tensor-core GEMM instead
 *   of two on CUDA. Declared relTol 1e-2. On CUDA, prefill attention then runs its tensor-core
 *   products on bf16-rounded operands too (one product instead of hi/lo splits).
 */
export type MatmulPrecision = 'exact' | 'bf16';

export const MATMUL_PRECISIONS: readonly MatmulPrecision[] = ['exact', 'bf16'];

/** Matmuls of at most this many rows run exact under either precision (the GEMV path of decode). */
export const BF16_MATMUL_MAX_EXACT_ROWS = 8;

/** The optional fields of each op's arguments a backend takes (BackendCapabilities.opFields). */
export type OpFieldSupport = { readonly [K in OpName]?: readonly (keyof OpArgs<K> & string)[] };

/** Whether a backend takes op `op`'s optional argument field `field` (capabilities.opFields). */
export function takesOpField<K extends OpName>(capabilities: Pick<BackendCapabilities, 'opFields'>, op: K, field: keyof OpArgs<K> & string): boolean {
  return (capabilities.opFields?.[op] as readonly string[] | undefined)?.includes(field) === true;
}

export interface BackendCapabilities {
  /** 'cpu', 'cuda', ... */
  deviceKind: string;
  deviceName: string;
  deviceCount: number;
  /** Bytes available per tier (total, not free). */
  memory: Partial<Record<Tier, number>>;
  /** The tier compute ops read and write. */
  computeTier: Tier;
  /** Element types buffers may hold (weights may be narrower than activations). */
  dtypes: readonly DType[];
  /** dtype the backend wants weights in. */
  weightDtype: DType;
  precision: BackendPrecision;
  /** Activation rounding (absent: 'exact'). With 'bf16' the engine stores weights and KV as bf16. */
  numerics?: Numerics;
  /**
   * Many-row matmul precision (absent: 'exact'). 'bf16' rounds the activations of matmuls over
   * more than 8 rows to bf16 once (see {@link MatmulPrecision}); on CUDA, prefill attention then
   * uses plain bf16 tensor-core products as well.
   */
  matmulPrecision?: MatmulPrecision;
  /**
   * Element types besides f32 that the activations of ops `rmsnorm` and `silu_mul` (their `out`)
   * and op `matmul` over more than 8 rows of float (not block-quantized) weights (its `x`) may have.
   * With 'bf16' each value is rounded to
   * bf16 (nearest even) as it is stored and read as it is; under matmul precision 'bf16' the
   * engine's prefill layers then hand the projections their inputs in bf16, which those matmuls
   * round to anyway: the same results without a rounding pass per matmul. Absent: f32 only.
   */
  activationDtypes?: readonly DType[];
  /**
   * Batch-invariant decode: a decode row's results (op fused_matmul and op decoder_layers, each
   * row its own sequence) are bit for bit the same whatever number of other rows share the call.
   * The engine then runs the LM head as op fused_matmul, so a logit row is computed the same way
   * at any number of logit rows. Absent: false (no promise).
   */
  batchInvariant?: boolean;
  /**
   * The short-context fast path: at one decode row of op decoder_layers, the most keys the row
   * may have (its maxKeys) for which the backend runs a faster decode attention. The engine then
   * captures a one-row decode step that stays within it as a graph of its own, with maxKeys set to
   * this value. Absent or 0: maxKeys changes nothing.
   */
  shortContextKeys?: number;
  /**
   * The long-context path: at one decode row of op decoder_layers, the fewest keys the row may
   * have (its minKeys) for which the backend runs a decode attention suited to long contexts
   * (CUDA: each key read once for all the q heads of its KV head). The engine then captures a
   * one-row decode step whose row has at least that many keys as a graph of its own, with minKeys
   * set to this value. Absent or 0: minKeys changes nothing.
   */
  longContextKeys?: number;
  /**
   * The optional argument fields each op takes on this backend (ops.ts marks them "only where
   * capabilities.opFields lists it"); an op absent here takes none. E.g. `decoder_layers:
   * ['embed']` (the embedding gather as part of the op), `sample: ['push', 'advance']` (ops
   * ring_push and advance_positions after it, as part of the op: a decode step's tail).
   */
  opFields?: OpFieldSupport;
  graphCapture: boolean;
  peerAccess: boolean;
  collectives: boolean;
  fabric: FabricKind;
  ops: readonly OpName[];
}

/** Counters a backend keeps from its creation. Used by ledgers and leak checks. */
export interface BackendStats {
  liveBuffers: number;
  liveBytes: number;
  /** Device/host allocations and frees made by the backend (cudaMalloc, pinning, ...). */
  allocCalls: number;
  freeCalls: number;
  /** Allocations attempted while the hot-path guard was armed (each one is also rejected). */
  hotPathAllocations: number;
  h2dBytes: number;
  d2hBytes: number;
  d2dBytes: number;
  /** Kernel launches issued individually (not through a graph replay). */
  launches: number;
  graphReplays: number;
  syncs: SyncCounts;
  /** Milliseconds the host spent computing ops near host-tier data on a device backend (op mlp_slice; op attention over a KV cache in pinned memory). */
  hostComputeMs?: number;
  /** hostComputeMs by op (today: mlp_slice, the host MLP slices over streamed weights; attention, over warm KV pages). */
  hostComputeMsByOp?: Partial<Record<OpName, number>>;
}

export type HostArray = Float32Array | Int32Array | Uint16Array | Uint8Array;

export interface DeviceBackend {
  readonly name: string;
  readonly capabilities: BackendCapabilities;

  alloc(spec: BufferSpec): DeviceBuffer;
  free(buf: DeviceBuffer): void;
  /**
   * Host -> buffer. f32 buffers take Float32Array, i32 buffers Int32Array; bf16/f16 buffers take
   * raw Uint16Array bits or Float32Array (rounded to nearest even); quantized buffers
   * (`QuantDType`) take their raw ggml blocks as Uint8Array, offset and length whole blocks.
   * Offsets are in elements.
   */
  write(buf: DeviceBuffer, src: HostArray, offset?: number): void;
  /** Buffer -> host, as float32 (bf16/f16/f32 buffers) or int32 (i32 buffers). A hard sync. */
  read(buf: DeviceBuffer, offset?: number, length?: number): Float32Array | Int32Array;
  /**
   * Read a host-visible buffer (tier 'pinned', or any buffer of a backend whose compute tier is
   * host memory) without synchronizing: the host observes what the device has written so far.
   * Used to watch the device token ring asynchronously. Other buffers: a typed error.
   */
  peek(buf: DeviceBuffer, offset?: number, length?: number): Int32Array | Float32Array;
  /** Buffer -> buffer, possibly across tiers, ordered on the stream. Offsets in elements. */
  copy(dst: DeviceBuffer, src: DeviceBuffer, length: number, dstOffset?: number, srcOffset?: number, stream?: StreamHandle): void;

  /** Run one op from the catalogue, enqueued on the stream (default stream when omitted). */
  run<K extends OpName>(op: K, args: OpArgs<K>, stream?: StreamHandle): void;

  createStream(): StreamHandle;
  destroyStream(stream: StreamHandle): void;
  createEvent(): EventHandle;
  destroyEvent(event: EventHandle): void;
  record(event: EventHandle, stream?: StreamHandle): void;
  /** Make `stream` wait for `event` without blocking the host (a soft visibility sync). */
  waitEvent(stream: StreamHandle, event: EventHandle): void;
  /** Milliseconds between two recorded events, once both completed. */
  elapsedMs(start: EventHandle, end: EventHandle): number;
  /** Block the host until the stream (or the whole device) is idle; counted under `kind`. */
  synchronize(kind: SyncKind, stream?: StreamHandle): void;
  /**
   * Block the host until `event` (recorded earlier) has completed, while work enqueued after it
   * keeps running; counted under `kind`. Optional: the engine runs a decode step ahead of the
   * host (EngineOptions.runAhead) only on backends that have it.
   */
  synchronizeEvent?(event: EventHandle, kind: SyncKind): void;

  /** Graph capture; only where capabilities.graphCapture. Ops between begin and end are recorded, not run. */
  beginCapture(stream?: StreamHandle): void;
  endCapture(stream?: StreamHandle): GraphHandle;
  replay(graph: GraphHandle, stream?: StreamHandle): void;
  destroyGraph(graph: GraphHandle): void;

  /**
   * Arm or disarm the hot-path guard. While armed every allocation is rejected with a
   * HotPathAllocationError and counted in stats().hotPathAllocations.
   */
  setHotPath(armed: boolean): void;
  stats(): BackendStats;
  dispose(): void;
}
