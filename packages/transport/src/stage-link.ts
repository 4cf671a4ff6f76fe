/**
 * Pipeline stages: contiguous layer ranges per stage (`planStages`), the order of devices along a
 * pipeline (`pipelineDeviceOrder`), and `StageLink`, the small interface the engine passes hidden
 * states through between stages. `StageLink` and the split itself live in `@nerva/core` (the engine
 * sits below this package and uses them); they are re-exported here. `InProcessStageLink` is the
 * reference link for two stages on one backend; the engine's own links (in-process, device-copy,
 * NCCL) are in `@nerva/engine` (`src/stage-links.ts`).
 */
import {
  DTYPE_BYTES,
  planStages as corePlanStages,
  stageOfLayer as coreStageOfLayer,
  StagePlanError,
  type BackendCapabilities,
  type DeviceBackend,
  type DeviceBuffer,
  type DType,
  type EventHandle,
  type StagePlan,
  type StageLink,
  type StreamHandle,
} from '@nerva/core';
import { deviceCount, gpuForDevice, peerDecision } from './classify.js';
import { StageLinkError, TransportArgumentError } from './errors.js';
import { gpuPair, type FabricTopology } from './topology.js';

export type { StageLink, StageLinkKind, StagePlan, StageRange } from '@nerva/core';

export interface InProcessStageLinkOptions {
  fromStage: number;
  toStage: number;
  rowWidth: number;
  maxRows: number;
  dtype: DType;
}

/**
 * A link between two stages on one backend: `send` copies the rows into a staging buffer and
 * records an event; `recv` makes its stream wait for that event (a soft visibility sync) and copies
 * them out. The staging buffer and the event are made in the constructor, so build links before
 * arming the hot-path guard. A `recv` on the default stream after a `send` on another stream has
 * no event to wait with and synchronizes the send stream (counted as `phase_handoff`).
 */
export class InProcessStageLink implements StageLink {
  readonly kind = 'in-process' as const;
  readonly fromStage: number;
  readonly toStage: number;
  readonly rowWidth: number;
  readonly maxRows: number;
  readonly dtype: DType;
  private staging: DeviceBuffer | null;
  private event: EventHandle | null;
  private pending: { rows: number; stream: StreamHandle | undefined } | null = null;

  constructor(
    private readonly backend: DeviceBackend,
    options: InProcessStageLinkOptions,
  ) {
    const { fromStage, toStage, rowWidth, maxRows, dtype } = options;
    for (const [k, v] of Object.entries({ fromStage, toStage })) if (!Number.isInteger(v) || v < 0) throw new TransportArgumentError(`${k} must be a non-negative integer, got ${v}`);
    for (const [k, v] of Object.entries({ rowWidth, maxRows })) if (!Number.isInteger(v) || v < 1) throw new TransportArgumentError(`${k} must be a positive integer, got ${v}`);
    if (!(dtype in DTYPE_BYTES)) throw new TransportArgumentError(`unknown dtype ${String(dtype)}`);
    this.fromStage = fromStage;
    this.toStage = toStage;
    this.rowWidth = rowWidth;
    this.maxRows = maxRows;
    this.dtype = dtype;
    this.staging = backend.alloc({ dtype, length: rowWidth * maxRows, usage: 'activations', label: `stage-link ${fromStage}->${toStage}` });
    this.event = backend.createEvent();
  }

  private check(op: string, buffer: DeviceBuffer, rows: number): void {
    if (this.staging === null) throw new StageLinkError(`stage link ${this.fromStage}->${this.toStage}: ${op} after close`);
    if (!Number.isInteger(rows) || rows < 0 || rows > this.maxRows)
      throw new StageLinkError(`stage link ${this.fromStage}->${this.toStage}: ${op} of ${rows} rows (0..${this.maxRows} allowed)`);
    if (buffer.dtype !== this.dtype) throw new StageLinkError(`stage link ${this.fromStage}->${this.toStage}: ${op} buffer is ${buffer.dtype}, link carries ${this.dtype}`);
    if (buffer.length < rows * this.rowWidth)
      throw new StageLinkError(`stage link ${this.fromStage}->${this.toStage}: ${op} buffer holds ${buffer.length} elements, ${rows} rows need ${rows * this.rowWidth}`);
  }

  send(buffer: DeviceBuffer, rows: number, stream?: StreamHandle): void {
    this.check('send', buffer, rows);
    if (this.pending !== null) throw new StageLinkError(`stage link ${this.fromStage}->${this.toStage}: send before the previous ${this.pending.rows} rows were received`);
    if (rows > 0) this.backend.copy(this.staging as DeviceBuffer, buffer, rows * this.rowWidth, 0, 0, stream);
    this.backend.record(this.event as EventHandle, stream);
    this.pending = { rows, stream };
  }

  recv(buffer: DeviceBuffer, rows: number, stream?: StreamHandle): void {
    this.check('recv', buffer, rows);
    const p = this.pending;
    if (p === null) throw new StageLinkError(`stage link ${this.fromStage}->${this.toStage}: recv with nothing sent`);
    if (p.rows !== rows) throw new StageLinkError(`stage link ${this.fromStage}->${this.toStage}: recv of ${rows} rows, ${p.rows} were sent`);
    if (stream !== undefined) {
      if (p.stream?.id !== stream.id) this.backend.waitEvent(stream, this.event as EventHandle);
    } else if (p.stream !== undefined) this.backend.synchronize('phase_handoff', p.stream);
    if (rows > 0) this.backend.copy(buffer, this.staging as DeviceBuffer, rows * this.rowWidth, 0, 0, stream);
    this.pending = null;
  }

  close(): void {
    if (this.staging !== null) this.backend.free(this.staging);
    if (this.event !== null) this.backend.destroyEvent(this.event);
    this.staging = null;
    this.event = null;
    this.pending = null;
  }
}

/** Core's stage-plan errors as this package's argument errors. */
function asTransportError<T>(fn: () => T): T {
  try {
    return fn();
  } catch (e) {
    if (e instanceof StagePlanError) throw new TransportArgumentError(e.message);
    throw e;
  }
}

/**
 * Split `numLayers` layers into `numStages` contiguous, non-empty ranges, minimizing the largest
 * stage's bytes (`layerBytes[i]` per layer; equal weights when omitted). Among optimal splits the
 * most even one is taken, earlier stages taking the extra layers on ties. The split itself is
 * `planStages` of `@nerva/core` (the engine plans its pipeline with it); here it throws
 * `TransportArgumentError` for numStages < 1, numStages > numLayers, or malformed weights.
 */
export function planStages(numLayers: number, numStages: number, layerBytes?: readonly number[]): StagePlan {
  return asTransportError(() => corePlanStages(numLayers, numStages, layerBytes));
}

/** The stage that runs `layer`. */
export function stageOfLayer(plan: StagePlan, layer: number): number {
  return asTransportError(() => coreStageOfLayer(plan, layer));
}

const RELATION_SCORE: Record<string, number> = { PIX: 5, PXB: 4, PHB: 3, NODE: 2, SYS: 1, unknown: 0 };

/**
 * Device ordinals in pipeline order for a same-node pipeline: starting at device 0, each next
 * device is the unvisited one with the best link to the last (GPU-direct over NVLink, more links
 * first; then GPU-direct over PCIe; then by PCIe relation), ties to the lower ordinal.
 */
export function pipelineDeviceOrder(topology: FabricTopology, capabilities?: BackendCapabilities): number[] {
  const n = deviceCount(topology);
  if (n === 0) return [];
  const score = (a: number, b: number): number => {
    const d = peerDecision(topology, a, b, capabilities);
    const ga = gpuForDevice(topology, a);
    const gb = gpuForDevice(topology, b);
    const rel = ga && gb ? (gpuPair(topology, ga.index, gb.index)?.pcie ?? 'unknown') : 'unknown';
    const nv = d.transport === 'nvlink' && typeof d.nvlinkLinks === 'number' ? d.nvlinkLinks : 0;
    return (d.transport === 'nvlink' ? 10_000 + nv * 10 : d.gpuDirect ? 1_000 : 0) + RELATION_SCORE[rel];
  };
  const order = [0];
  const left = new Set(Array.from({ length: n - 1 }, (_, i) => i + 1));
  while (left.size > 0) {
    const last = order[order.length - 1];
    let pick = -1;
    let bestScore = -Infinity;
    for (const c of left) {
      const s = score(last, c);
      if (s > bestScore) {
        bestScore = s;
        pick = c;
      }
    }
    order.push(pick);
    left.delete(pick);
  }
  return order;
}
