/**
 * Pipeline stages: contiguous layer ranges per stage (`planStages`), the order of devices along a
 * pipeline (`pipelineDeviceOrder`), and `StageLink`, the small interface the engine passes hidden
 * states through between stages. `InProcessStageLink` is the reference link for two stages on one
 * backend; device-copy and NCCL links belong to the engine and the CUDA backend.
 */
import { DTYPE_BYTES, type BackendCapabilities, type DeviceBackend, type DeviceBuffer, type DType, type EventHandle, type StreamHandle } from '@nerva/core';
import { deviceCount, gpuForDevice, peerDecision } from './classify.js';
import { StageLinkError, TransportArgumentError } from './errors.js';
import { gpuPair, type FabricTopology } from './topology.js';

/** How a link moves rows: within one backend, by a device-to-device copy, or through NCCL. */
export type StageLinkKind = 'in-process' | 'device-copy' | 'nccl';

/**
 * Passes hidden states (rows of `rowWidth` elements) from one stage to the next. A `send` is
 * matched by exactly one `recv` of the same row count; both are ordered on the given stream (the
 * backend's default stream when omitted) and neither allocates.
 */
export interface StageLink<Buf extends DeviceBuffer = DeviceBuffer, Stream extends StreamHandle = StreamHandle> {
  readonly kind: StageLinkKind;
  readonly fromStage: number;
  readonly toStage: number;
  /** Elements per row (the hidden size). */
  readonly rowWidth: number;
  /** Most rows one handoff carries; staging is sized for it when the link is made. */
  readonly maxRows: number;
  readonly dtype: DType;
  /** Hand the first `rows` rows of `buffer` to the next stage. */
  send(buffer: Buf, rows: number, stream?: Stream): void;
  /** Receive the rows last sent into the first `rows` rows of `buffer`. */
  recv(buffer: Buf, rows: number, stream?: Stream): void;
  /** Release what the link holds. */
  close(): void;
}

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

/** One stage's layers: `[firstLayer, endLayer)`. */
export interface StageRange {
  stage: number;
  firstLayer: number;
  endLayer: number;
  layers: number;
  /** Sum of the layers' weights (bytes when given, else the layer count). */
  bytes: number;
}

export interface StagePlan {
  numLayers: number;
  numStages: number;
  stages: StageRange[];
  totalBytes: number;
  maxStageBytes: number;
  /** maxStageBytes / (totalBytes / numStages); 1 is perfect balance. */
  imbalance: number;
}

/**
 * Split `numLayers` layers into `numStages` contiguous, non-empty ranges, minimizing the largest
 * stage's bytes (`layerBytes[i]` per layer; equal weights when omitted). Among optimal splits the
 * most even one is taken, earlier stages taking the extra layers on ties. Throws `TransportArgumentError` for numStages < 1,
 * numStages > numLayers, or malformed weights.
 */
export function planStages(numLayers: number, numStages: number, layerBytes?: readonly number[]): StagePlan {
  if (!Number.isInteger(numLayers) || numLayers < 1) throw new TransportArgumentError(`numLayers must be a positive integer, got ${numLayers}`);
  if (!Number.isInteger(numStages) || numStages < 1) throw new TransportArgumentError(`numStages must be a positive integer, got ${numStages}`);
  if (numStages > numLayers) throw new TransportArgumentError(`numStages (${numStages}) exceeds numLayers (${numLayers}): every stage needs a layer`);
  if (layerBytes !== undefined) {
    if (layerBytes.length !== numLayers) throw new TransportArgumentError(`layerBytes has ${layerBytes.length} entries for ${numLayers} layers`);
    layerBytes.forEach((b, i) => {
      if (!Number.isFinite(b) || b < 0) throw new TransportArgumentError(`layerBytes[${i}] = ${b} is not a non-negative number`);
    });
  }
  const given = layerBytes ?? new Array<number>(numLayers).fill(1);
  const total = given.reduce((a, b) => a + b, 0);
  const w = total > 0 ? given : new Array<number>(numLayers).fill(1);
  const prefix = [0];
  for (const x of w) prefix.push(prefix[prefix.length - 1] + x);
  const sum = (i: number, j: number) => prefix[j] - prefix[i];

  // best[s][i]: least possible max stage weight splitting the first i layers into s stages.
  let best = new Array<number>(numLayers + 1).fill(Infinity);
  for (let i = 1; i <= numLayers; i++) best[i] = sum(0, i);
  for (let s = 2; s <= numStages; s++) {
    const next = new Array<number>(numLayers + 1).fill(Infinity);
    for (let i = s; i <= numLayers; i++) {
      let m = Infinity;
      for (let j = s - 1; j < i; j++) m = Math.min(m, Math.max(best[j], sum(j, i)));
      next[i] = m;
    }
    best = next;
  }
  const limit = best[numLayers];

  // Among the splits that reach that limit, take the most even one (least sum of squared stage
  // weights), preferring larger earlier stages on ties. q[k][i]: least sum of squares splitting
  // layers i.. into k stages of at most `limit` each.
  const tol = (x: number) => 1e-9 * Math.max(1, Math.abs(x));
  const fits = (w: number) => w <= limit + tol(limit);
  const q: number[][] = [new Array<number>(numLayers + 1).fill(Infinity)];
  q[0][numLayers] = 0;
  for (let k = 1; k <= numStages; k++) {
    const row = new Array<number>(numLayers + 1).fill(Infinity);
    for (let i = 0; i < numLayers; i++) {
      for (let e = i + 1; e <= numLayers - (k - 1); e++) {
        const w = sum(i, e);
        if (!fits(w)) break;
        const v = w * w + q[k - 1][e];
        if (v < row[i]) row[i] = v;
      }
    }
    q.push(row);
  }
  const stages: StageRange[] = [];
  let pos = 0;
  for (let s = 0; s < numStages; s++) {
    const k = numStages - s;
    let pick = -1;
    let bestV = Infinity;
    for (let e = numLayers - (k - 1); e > pos; e--) {
      const w = sum(pos, e);
      if (!fits(w)) continue;
      const v = w * w + q[k - 1][e];
      if (Number.isFinite(v) && (pick < 0 || v < bestV - tol(bestV))) {
        bestV = v;
        pick = e;
      }
    }
    stages.push({ stage: s, firstLayer: pos, endLayer: pick, layers: pick - pos, bytes: total > 0 ? sum(pos, pick) : 0 });
    pos = pick;
  }
  const maxStageBytes = Math.max(...stages.map((s) => s.bytes));
  const totalBytes = total;
  const imbalance = totalBytes > 0 ? maxStageBytes / (totalBytes / numStages) : 1;
  return { numLayers, numStages, stages, totalBytes, maxStageBytes, imbalance };
}

/** The stage that runs `layer`. */
export function stageOfLayer(plan: StagePlan, layer: number): number {
  const s = plan.stages.find((st) => layer >= st.firstLayer && layer < st.endLayer);
  if (!s) throw new TransportArgumentError(`layer ${layer} is outside 0..${plan.numLayers - 1}`);
  return s.stage;
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
