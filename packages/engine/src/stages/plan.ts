/**
 * Pipeline stages: `StageLink`, the interface a stage pipeline passes rows (hidden states,
 * sampled tokens, logits) through from one stage to another (links.ts implements it over
 * backends), and `planStages`, the split of a model's decoder layers into contiguous per-stage
 * ranges (pipeline.ts runs them).
 */
import type { DeviceBuffer, DType, StreamHandle } from '@nerva/core';
import { NervaError } from '@nerva/core';

/** How a link moves rows: within one process's host memory, by a device-to-device copy, or through NCCL. */
export type StageLinkKind = 'in-process' | 'device-copy' | 'nccl';

/**
 * Passes rows of `rowWidth` elements from one stage to another. A `send` is matched by exactly
 * one `recv` of the same row count before the next `send`; both are ordered on the given stream
 * (the backend's default stream when omitted) and neither allocates. The sender may write its
 * buffer again once `recv` has been issued.
 */
export interface StageLink<Buf extends DeviceBuffer = DeviceBuffer, Stream extends StreamHandle = StreamHandle> {
  readonly kind: StageLinkKind;
  readonly fromStage: number;
  readonly toStage: number;
  /** Elements per row (the hidden size for hidden states). */
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

/** A stage plan was asked for with arguments outside their domain. */
export class StagePlanError extends NervaError {
  constructor(message: string) {
    super('STAGE_PLAN', message);
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
  /** The largest stage's load, (fixed + bytes) / capacity (with neither given: maxStageBytes). */
  maxLoad: number;
}

/**
 * Per-stage terms of the split: stage s carries `fixed[s]` bytes besides its layers (the
 * embedding on stage 0, activation buffers) and may hold `capacity[s]` bytes (its memory budget).
 * A stage's load is (fixed + layer bytes) / capacity; the split minimizes the largest load.
 */
export interface StageCapacities {
  capacity?: readonly number[];
  fixed?: readonly number[];
}

/**
 * Split `numLayers` layers into `numStages` contiguous, non-empty ranges, minimizing the largest
 * stage's load (`layerBytes[i]` per layer, equal weights when omitted; with `caps`, each stage's
 * fixed bytes and capacity, so stages on smaller budgets take fewer layers). Among optimal splits
 * the most even one is taken (least sum of squared loads), earlier stages taking the extra layers
 * on ties. Throws `StagePlanError` for numStages < 1, numStages > numLayers, or malformed weights.
 */
export function planStages(numLayers: number, numStages: number, layerBytes?: readonly number[], caps: StageCapacities = {}): StagePlan {
  if (!Number.isInteger(numLayers) || numLayers < 1) throw new StagePlanError(`numLayers must be a positive integer, got ${numLayers}`);
  if (!Number.isInteger(numStages) || numStages < 1) throw new StagePlanError(`numStages must be a positive integer, got ${numStages}`);
  if (numStages > numLayers) throw new StagePlanError(`numStages (${numStages}) exceeds numLayers (${numLayers}): every stage needs a layer`);
  if (layerBytes !== undefined) {
    if (layerBytes.length !== numLayers) throw new StagePlanError(`layerBytes has ${layerBytes.length} entries for ${numLayers} layers`);
    layerBytes.forEach((b, i) => {
      if (!Number.isFinite(b) || b < 0) throw new StagePlanError(`layerBytes[${i}] = ${b} is not a non-negative number`);
    });
  }
  const perStage = (name: string, v: readonly number[] | undefined, fill: number, positive: boolean): number[] => {
    if (v === undefined) return new Array<number>(numStages).fill(fill);
    if (v.length !== numStages) throw new StagePlanError(`${name} has ${v.length} entries for ${numStages} stages`);
    v.forEach((x, i) => {
      if (!Number.isFinite(x) || x < 0 || (positive && x === 0)) throw new StagePlanError(`${name}[${i}] = ${x} is not a ${positive ? 'positive' : 'non-negative'} number`);
    });
    return [...v];
  };
  const cap = perStage('capacity', caps.capacity, 1, true);
  const fixed = perStage('fixed', caps.fixed, 0, false);
  const given = layerBytes ?? new Array<number>(numLayers).fill(1);
  const total = given.reduce((a, b) => a + b, 0);
  const w = total > 0 ? given : new Array<number>(numLayers).fill(1);
  const prefix = [0];
  for (const x of w) prefix.push(prefix[prefix.length - 1] + x);
  const sum = (i: number, j: number) => prefix[j] - prefix[i];
  /** Stage s's load holding layers [i, j). */
  const load = (s: number, i: number, j: number) => (fixed[s] + sum(i, j)) / cap[s];

  // best[i]: least possible largest load giving the first i layers to stages 0..s-1.
  let best = new Array<number>(numLayers + 1).fill(Infinity);
  for (let i = 1; i <= numLayers; i++) best[i] = load(0, 0, i);
  for (let s = 2; s <= numStages; s++) {
    const next = new Array<number>(numLayers + 1).fill(Infinity);
    for (let i = s; i <= numLayers; i++) {
      let m = Infinity;
      for (let j = s - 1; j < i; j++) m = Math.min(m, Math.max(best[j], load(s - 1, j, i)));
      next[i] = m;
    }
    best = next;
  }
  const limit = best[numLayers];

  // Among the splits that reach that limit, take the most even one (least sum of squared loads),
  // preferring larger earlier stages on ties. q[k][i]: least sum of squares giving layers i.. to
  // the last k stages, each at most `limit`.
  const tol = (x: number) => 1e-9 * Math.max(1, Math.abs(x));
  const fits = (x: number) => x <= limit + tol(limit);
  const q: number[][] = [new Array<number>(numLayers + 1).fill(Infinity)];
  q[0][numLayers] = 0;
  for (let k = 1; k <= numStages; k++) {
    const s = numStages - k;
    const row = new Array<number>(numLayers + 1).fill(Infinity);
    for (let i = 0; i < numLayers; i++) {
      for (let e = i + 1; e <= numLayers - (k - 1); e++) {
        const x = load(s, i, e);
        if (!fits(x)) break;
        const v = x * x + q[k - 1][e];
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
      const x = load(s, pos, e);
      if (!fits(x)) continue;
      const v = x * x + q[k - 1][e];
      if (Number.isFinite(v) && (pick < 0 || v < bestV - tol(bestV))) {
        bestV = v;
        pick = e;
      }
    }
    stages.push({ stage: s, firstLayer: pos, endLayer: pick, layers: pick - pos, bytes: total > 0 ? sum(pos, pick) : 0 });
    pos = pick;
  }
  const maxStageBytes = Math.max(...stages.map((s) => s.bytes));
  const imbalance = total > 0 ? maxStageBytes / (total / numStages) : 1;
  return { numLayers, numStages, stages, totalBytes: total, maxStageBytes, imbalance, maxLoad: limit };
}

/** The stage that runs `layer`. */
export function stageOfLayer(plan: StagePlan, layer: number): number {
  const s = plan.stages.find((st) => layer >= st.firstLayer && layer < st.endLayer);
  if (!s) throw new StagePlanError(`layer ${layer} is outside 0..${plan.numLayers - 1}`);
  return s.stage;
}
