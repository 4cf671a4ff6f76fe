/**
 * Pipeline parallelism: the decoder layers split into contiguous ranges (stages), one
 * `ModelRunner` per stage, hidden states handed from stage to stage through `StageLink`s.
 *
 * Where stages run:
 * - one backend object for every stage (the CPU backend by default, one GPU with
 *   `allowSingleDeviceStages`): the stages share the engine's meta buffers, the links are copies
 *   on the one stream, and a decode step is still captured as one graph. This is the mode that
 *   proves the pipeline exact; on one device it cannot be faster than one stage.
 * - a backend per stage (`stageDevices`: one CUDA backend per GPU with NCCL links; on the CPU
 *   backend, one CPU backend per distinct ordinal with host links): each stage has its own meta
 *   buffers, written by the engine for every stage, the sampled tokens (and, when the host
 *   samples, the logits) come back to stage 0, and passes run eagerly.
 *
 * Micro-batches: a pass's sequences are split into up to `microBatches` groups; stage s works on
 * group g while stage s + 1 works on group g - 1 (ops are issued tick by tick, later stages first,
 * so on separate GPUs they overlap). The last stage gathers every group's final hidden rows and
 * runs the final norm, LM head and sampling once over the whole batch, as one stage would.
 */
import type { BackendStats, DeviceBackend, DeviceBuffer, EventHandle } from '@nerva/core';
import { emptySyncCounts, NervaError, SYNC_KINDS } from '@nerva/core';
import type { ModelSpec } from '@nerva/models';
import { ModelRunner, PROFILE_BUCKETS, type ProfileBucket, type RunnerLimits, type RunnerMeta } from '../model-runner.js';
import { makeStageLink } from './links.js';
import type { PipelineStage, PreparedStages } from './placement.js';
import type { StageLink } from './plan.js';

/** What the engine drives: one ModelRunner, or a StagePipeline of several. */
export interface PassRunner {
  readonly meta: RunnerMeta;
  readonly logits: DeviceBuffer;
  readonly limits: RunnerLimits;
  readonly kvBytes: number;
  /** Weight bytes of host slices computed near the data, and read in place (paged weights; 0 in a pipeline). */
  hostComputeBytes: number;
  hostReadBytes: number;
  forward(rows: number, nLogits: number): void;
  sampleOnDevice(nLogits: number, out: DeviceBuffer): void;
  advance(rows: number): void;
  /** A captured decode step's tail: sampleOnDevice(rows, out) then advance(rows), in as few ops as the backend takes them. */
  sampleStep(rows: number, out: DeviceBuffer): void;
  setProfiling(on: boolean, maxEvents?: number): void;
  /** Bucket times of the last profiled pass; `ops` gets the time of each op class added (ModelRunner.takeProfile). */
  takeProfile(ops?: Record<string, number>): Record<ProfileBucket, number>;
  dispose(): void;
}

/** The host arrays the engine stages a pass in (Engine's `stage`). */
export interface HostMeta {
  ids: Int32Array;
  pos: Int32Array;
  seq: Int32Array;
  slots: Int32Array;
  tables: Int32Array;
  logitRows: Int32Array;
  params: Float32Array;
  rng: Int32Array;
}

/** One micro-batch of a pass: sequences [seq0, seq1), rows [row0, row1), `logits` of them sampled. */
interface MicroBatch {
  seq0: number;
  seq1: number;
  row0: number;
  row1: number;
  logits: number;
}

/** A description of the pipeline, for reports. */
export interface PipelineDescription {
  stages: { firstLayer: number; endLayer: number; device?: number; backend: string }[];
  links: string[];
  microBatches: number;
  shared: boolean;
  capturable: boolean;
}

/**
 * One ModelRunner per stage and the links between them, driven by the engine as it drives one
 * runner: the engine writes the meta (`writeMeta`), runs `forward`, samples on the device
 * (`sampleOnDevice`) or reads `logits` after `logitsHome`, and `advance`s captured decode steps.
 */
export class StagePipeline implements PassRunner {
  readonly runners: ModelRunner[];
  /** links[s] carries hidden states from stage s to stage s + 1. */
  readonly links: StageLink[] = [];
  readonly limits: RunnerLimits;
  readonly kvBytes: number;
  /** Paged weights do not run in a pipeline (a budget is rejected), so nothing is computed near the data. */
  hostComputeBytes = 0;
  hostReadBytes = 0;
  readonly shared: boolean;
  readonly microBatches: number;
  /** A decode step can be captured as one graph: every stage on one backend, one micro-batch. */
  readonly capturable: boolean;
  /** Stage 0's meta (slot 0): what the engine writes, and the token ring it reads. */
  readonly meta: RunnerMeta;
  private readonly stages: PipelineStage[];
  /** Per stage, the meta of each micro-batch (fast mode: every stage shares stage 0's). */
  private readonly slots: RunnerMeta[][] = [];
  private readonly tokenLink: StageLink | undefined;
  private readonly logitsLink: StageLink | undefined;
  private readonly homeLogits: DeviceBuffer | undefined;
  private readonly gathered: DeviceBuffer | undefined;
  private readonly owned: { backend: DeviceBackend; buf: DeviceBuffer }[] = [];
  private readonly distinct: DeviceBackend[];
  /** The split of the pass last written by writeMeta. */
  private split: MicroBatch[] = [];
  private readonly rowSeqScratch: Int32Array;
  /**
   * Eager passes: an event pair per stage and micro-batch around its layers (`compute`, the last
   * stage's head in `head`), and around each handoff it receives (`link`, from stage 1), each on
   * the stage's own backend; made once. `timedGroups`: micro-batches of the last pass.
   */
  private readonly timing: { compute: [EventHandle, EventHandle][][]; link: [EventHandle, EventHandle][][]; head: [EventHandle, EventHandle] } | undefined;
  private timedGroups = 0;
  private disposed = false;

  constructor(spec: ModelSpec, limits: RunnerLimits, prepared: PreparedStages) {
    this.limits = limits;
    this.stages = prepared.stages;
    this.shared = prepared.shared;
    this.microBatches = prepared.microBatches;
    this.capturable = this.shared && this.microBatches === 1;
    this.distinct = [...new Set(this.stages.map((s) => s.backend))];
    this.rowSeqScratch = new Int32Array(limits.maxRows);
    const S = this.stages.length;
    this.runners = [];
    try {
      for (const st of this.stages) this.runners.push(new ModelRunner(st.backend, spec, st.weights, limits, { firstLayer: st.firstLayer, endLayer: st.endLayer }));
      const first = this.runners[0];
      const H = spec.hiddenSize;
      for (let s = 0; s + 1 < S; s++) {
        this.links.push(
          makeStageLink(
            { backend: this.stages[s].backend, rank: this.stages[s].rank },
            { backend: this.stages[s + 1].backend, rank: this.stages[s + 1].rank },
            { fromStage: s, toStage: s + 1, rowWidth: H, maxRows: limits.maxRows, dtype: 'f32' },
            { nccl: prepared.nccl, staged: true },
          ),
        );
      }
      if (this.capturable) {
        // Every stage reads stage 0's meta: the engine's writes, advance_positions and the token ring serve all.
        for (const r of this.runners) r.meta = first.meta;
        this.slots = this.runners.map(() => [first.meta]);
      } else {
        for (let s = 0; s < S; s++) {
          const be = this.stages[s].backend;
          const own = this.runners[s].meta;
          const list = [own];
          for (let g = 1; g < this.microBatches; g++) list.push(this.allocMeta(be, own, `stage${s}.mb${g}`));
          this.slots.push(list);
        }
      }
      const firstBe = this.stages[0].backend;
      const lastBe = this.stages[S - 1].backend;
      if (firstBe !== lastBe) {
        const ends = [
          { backend: lastBe, rank: this.stages[S - 1].rank },
          { backend: firstBe, rank: this.stages[0].rank },
        ] as const;
        this.tokenLink = makeStageLink(ends[0], ends[1], { fromStage: S - 1, toStage: 0, rowWidth: 1, maxRows: limits.maxSeqs, dtype: 'i32' }, { nccl: prepared.nccl });
        this.logitsLink = makeStageLink(ends[0], ends[1], { fromStage: S - 1, toStage: 0, rowWidth: spec.vocabSize, maxRows: limits.maxSeqs, dtype: 'f32' }, { nccl: prepared.nccl });
        this.homeLogits = this.alloc(firstBe, { dtype: 'f32', length: limits.maxSeqs * spec.vocabSize, usage: 'activations', label: 'pipeline.logits' });
      }
      if (this.microBatches > 1) this.gathered = this.alloc(lastBe, { dtype: 'f32', length: limits.maxRows * H, usage: 'activations', label: 'pipeline.gathered_hidden' });
      if (!this.capturable) {
        const pair = (be: DeviceBackend): [EventHandle, EventHandle] => [be.createEvent(), be.createEvent()];
        const perGroup = (be: DeviceBackend) => Array.from({ length: this.microBatches }, () => pair(be));
        this.timing = {
          compute: this.stages.map((st) => perGroup(st.backend)),
          link: this.stages.map((st, s) => (s === 0 ? [] : perGroup(st.backend))),
          head: pair(lastBe),
        };
      }
      this.meta = first.meta;
    } catch (e) {
      this.disposeParts();
      throw e;
    }
    this.kvBytes = this.runners.reduce((t, r) => t + r.kvBytes, 0);
  }

  private alloc(backend: DeviceBackend, spec: Parameters<DeviceBackend['alloc']>[0]): DeviceBuffer {
    const buf = backend.alloc(spec);
    this.owned.push({ backend, buf });
    return buf;
  }

  /** A micro-batch's meta: its own per-row buffers, the stage's token ring. */
  private allocMeta(be: DeviceBackend, own: RunnerMeta, label: string): RunnerMeta {
    const { maxRows, maxSeqs, maxBlocksPerSeq } = this.limits;
    const i32 = (length: number, what: string) => this.alloc(be, { dtype: 'i32', length, usage: 'io', label: `${label}.${what}` });
    return {
      ids: i32(maxRows, 'ids'),
      positions: i32(maxRows, 'positions'),
      rowSeq: i32(maxRows, 'row_seq'),
      slots: i32(maxRows, 'slots'),
      blockTables: i32(maxSeqs * maxBlocksPerSeq, 'block_tables'),
      logitRows: i32(maxSeqs, 'logit_rows'),
      sampleParams: own.sampleParams,
      rng: own.rng,
      sampled: own.sampled,
      ring: own.ring,
      ringCursor: own.ringCursor,
    };
  }

  /** The logits the engine reads: on stage 0's backend (brought home by `logitsHome` when the last stage is elsewhere). */
  get logits(): DeviceBuffer {
    return this.homeLogits ?? this.runners[this.runners.length - 1].logits;
  }

  /** Where the stages run and how they are linked. */
  describe(): PipelineDescription {
    return {
      stages: this.stages.map((s) => ({ firstLayer: s.firstLayer, endLayer: s.endLayer, backend: s.backend.name, ...(s.device !== undefined ? { device: s.device } : {}) })),
      links: this.links.map((l) => l.kind),
      microBatches: this.microBatches,
      shared: this.shared,
      capturable: this.capturable,
    };
  }

  /**
   * Write a pass's meta from the engine's host arrays. Shared mode: stage 0's buffers, as the
   * engine writes one runner's. Otherwise: split the sequences into micro-batches and write each
   * stage's buffers for each (ids to stage 0, rows rebased to the micro-batch), and the logit rows
   * and sampling parameters of the whole pass to the last stage.
   */
  writeMeta(h: HostMeta, rows: number, nl: number, withSampling: boolean): void {
    const mb = this.limits.maxBlocksPerSeq;
    let seqs = 0;
    for (let r = 0; r < rows; r++) seqs = Math.max(seqs, h.seq[r] + 1);
    if (this.capturable) {
      const be = this.stages[0].backend;
      const m = this.meta;
      be.write(m.ids, h.ids.subarray(0, rows));
      be.write(m.positions, h.pos.subarray(0, rows));
      be.write(m.rowSeq, h.seq.subarray(0, rows));
      be.write(m.slots, h.slots.subarray(0, rows));
      be.write(m.blockTables, h.tables.subarray(0, seqs * mb));
      if (nl > 0) be.write(m.logitRows, h.logitRows.subarray(0, nl));
      if (withSampling && nl > 0) {
        be.write(m.sampleParams, h.params.subarray(0, nl * 4));
        be.write(m.rng, h.rng.subarray(0, nl * 2));
      }
      this.split = [{ seq0: 0, seq1: seqs, row0: 0, row1: rows, logits: nl }];
      return;
    }
    // Sequences in even groups; a sequence's rows are contiguous and in sequence order.
    const groups = Math.max(1, Math.min(this.microBatches, seqs));
    const split: MicroBatch[] = [];
    let row = 0;
    let li = 0;
    for (let g = 0; g < groups; g++) {
      const seq0 = Math.floor((g * seqs) / groups);
      const seq1 = Math.floor(((g + 1) * seqs) / groups);
      const row0 = row;
      while (row < rows && h.seq[row] < seq1) row++;
      let logits = 0;
      while (li < nl && h.logitRows[li] < row) {
        li++;
        logits++;
      }
      split.push({ seq0, seq1, row0, row1: row, logits });
    }
    const S = this.stages.length;
    for (let s = 0; s < S; s++) {
      const be = this.stages[s].backend;
      split.forEach((p, g) => {
        const m = this.slots[s][g];
        const n = p.row1 - p.row0;
        if (s === 0) be.write(m.ids, h.ids.subarray(p.row0, p.row1));
        be.write(m.positions, h.pos.subarray(p.row0, p.row1));
        for (let r = 0; r < n; r++) this.rowSeqScratch[r] = h.seq[p.row0 + r] - p.seq0;
        be.write(m.rowSeq, this.rowSeqScratch.subarray(0, n));
        be.write(m.slots, h.slots.subarray(p.row0, p.row1));
        be.write(m.blockTables, h.tables.subarray(p.seq0 * mb, p.seq1 * mb));
      });
    }
    // The head runs once over the whole pass on the last stage: its logit rows are absolute.
    const be = this.stages[S - 1].backend;
    const m = this.slots[S - 1][0];
    if (nl > 0) be.write(m.logitRows, h.logitRows.subarray(0, nl));
    if (withSampling && nl > 0) {
      be.write(m.sampleParams, h.params.subarray(0, nl * 4));
      be.write(m.rng, h.rng.subarray(0, nl * 2));
    }
    this.split = split;
  }

  /**
   * One forward pass through every stage: logits of the pass's `nLogits` rows on the last stage.
   * Micro-batches are issued tick by tick: at tick t, stage s runs micro-batch t - s, the last
   * stage first, so a stage's handoff of group g is received before it starts on group g + 1.
   */
  forward(rows: number, nLogits: number): void {
    const S = this.runners.length;
    if (this.capturable) {
      for (let s = 0; s < S; s++) {
        const r = this.runners[s];
        if (s > 0) this.links[s - 1].recv(r.hidden, rows);
        r.forward(rows, nLogits);
        if (s + 1 < S) this.links[s].send(r.hidden, rows);
      }
      return;
    }
    const split = this.split;
    if (split.length === 0 || split[split.length - 1].row1 !== rows) throw new NervaError('PIPELINE_STATE', `pipeline forward of ${rows} rows without its meta (writeMeta first)`);
    const G = split.length;
    const last = this.runners[S - 1];
    for (let t = 0; t < G + S - 1; t++) {
      for (let s = S - 1; s >= 0; s--) {
        const g = t - s;
        if (g < 0 || g >= G) continue;
        const r = this.runners[s];
        const p = split[g];
        const n = p.row1 - p.row0;
        r.meta = this.slots[s][g];
        const be = this.stages[s].backend;
        const time = this.timing!;
        if (s > 0) {
          be.record(time.link[s][g][0]);
          this.links[s - 1].recv(r.hidden, n);
          be.record(time.link[s][g][1]);
        }
        be.record(time.compute[s][g][0]);
        if (s + 1 < S) {
          r.forward(n, p.logits, undefined, false);
          be.record(time.compute[s][g][1]);
          this.links[s].send(r.hidden, n);
        } else if (G === 1) {
          r.forward(n, p.logits);
          be.record(time.compute[s][g][1]);
        } else {
          r.forward(n, p.logits, undefined, false);
          be.record(time.compute[s][g][1]);
          be.copy(this.gathered!, r.hidden, n * last.spec.hiddenSize, p.row0 * last.spec.hiddenSize, 0);
        }
      }
    }
    for (let s = 0; s < S; s++) this.runners[s].meta = this.slots[s][0];
    const lastBe = this.stages[S - 1].backend;
    lastBe.record(this.timing!.head[0]);
    if (G > 1) last.head(rows, nLogits, this.gathered!);
    lastBe.record(this.timing!.head[1]);
    this.timedGroups = G;
  }

  /**
   * The last eager pass's device time per stage (its layers, and the last stage's head) and per
   * handoff (entry s - 1: the time stage s's stream spent receiving from stage s - 1, its wait
   * included), from the events each stage's backend recorded. Read once the pass has completed
   * (the step's tokens are home); undefined for a captured pipeline or before any eager pass.
   */
  stageTimes(): { stageMs: number[]; linkMs: number[] } | undefined {
    const t = this.timing;
    if (!t || this.timedGroups === 0) return undefined;
    const G = this.timedGroups;
    this.timedGroups = 0;
    const S = this.stages.length;
    // A pass without sampled rows (a prompt chunk) is not waited for through the tokens coming
    // home: wait for each later stage's last event before reading its times.
    for (let s = 1; s < S; s++) {
      const be = this.stages[s].backend;
      const last = s === S - 1 ? t.head[1] : t.compute[s][G - 1][1];
      if (be.synchronizeEvent) be.synchronizeEvent(last, 'hard');
      else be.synchronize('hard');
    }
    const span = (s: number, pairs: [EventHandle, EventHandle][]) => pairs.slice(0, G).reduce((sum, [a, b]) => sum + this.stages[s].backend.elapsedMs(a, b), 0);
    const stageMs = this.stages.map((_, s) => span(s, t.compute[s]));
    stageMs[S - 1] += this.stages[S - 1].backend.elapsedMs(t.head[0], t.head[1]);
    return { stageMs, linkMs: this.stages.slice(1).map((_, i) => span(i + 1, t.link[i + 1])) };
  }

  /**
   * Sample the pass's logit rows on the last stage into `out` (a buffer of stage 0's meta: the
   * engine passes meta.ids in a captured decode step, meta.sampled otherwise) and push them into
   * stage 0's token ring. From another backend the tokens travel home over the token link.
   */
  sampleOnDevice(nLogits: number, out: DeviceBuffer): void {
    const S = this.runners.length;
    const last = this.runners[S - 1];
    if (this.capturable) {
      last.sampleOnDevice(nLogits, out);
      return;
    }
    const lastBe = this.stages[S - 1].backend;
    const lm = this.slots[S - 1][0];
    const fm = this.meta;
    const into = this.tokenLink ? lm.sampled : out;
    lastBe.run('sample', { logits: last.logits, params: lm.sampleParams, rng: lm.rng, out: into, rows: nLogits, vocab: last.spec.vocabSize, ...(last.sampleLimit < last.spec.vocabSize ? { limit: last.sampleLimit } : {}) });
    if (this.tokenLink) {
      this.tokenLink.send(lm.sampled, nLogits);
      this.tokenLink.recv(out, nLogits);
    }
    this.stages[0].backend.run('ring_push', { src: out, ring: fm.ring, cursor: fm.ringCursor, rows: nLogits, capacity: this.limits.ringCapacity });
  }

  /** Bring the last stage's logits to stage 0's backend, where the engine reads them (a no-op when they are there). */
  logitsHome(nLogits: number): void {
    if (!this.logitsLink || nLogits === 0) return;
    const last = this.runners[this.runners.length - 1];
    this.logitsLink.send(last.logits, nLogits);
    this.logitsLink.recv(this.homeLogits!, nLogits);
  }

  /** The device side of a captured decode step (shared mode only: the stages share stage 0's meta). */
  advance(rows: number): void {
    if (!this.capturable) throw new NervaError('PIPELINE_STATE', 'advance is part of a captured decode step; this pipeline runs its passes eagerly');
    this.runners[0].advance(rows);
  }

  /** The tail of a captured decode step: the stages' ops as they are (stage 0 advances). */
  sampleStep(rows: number, out: DeviceBuffer): void {
    this.sampleOnDevice(rows, out);
    this.advance(rows);
  }

  setProfiling(on: boolean, maxEvents?: number): void {
    for (const r of this.runners) r.setProfiling(on, maxEvents);
  }

  takeProfile(ops?: Record<string, number>): Record<ProfileBucket, number> {
    return sumProfiles(this.runners, ops);
  }

  /** Counters summed over the stages' backends (each counted once). */
  stats(): BackendStats {
    return sumBackendStats(this.distinct);
  }

  private disposeParts(): void {
    for (const l of [...this.links, this.tokenLink, this.logitsLink]) l?.close();
    const t = this.timing;
    if (t) {
      this.stages.forEach((st, s) => [...t.compute[s], ...t.link[s]].forEach(([a, b]) => (st.backend.destroyEvent(a), st.backend.destroyEvent(b))));
      const lastBe = this.stages[this.stages.length - 1].backend;
      lastBe.destroyEvent(t.head[0]);
      lastBe.destroyEvent(t.head[1]);
    }
    for (const { backend, buf } of this.owned) backend.free(buf);
    this.owned.length = 0;
    for (const r of this.runners) r.dispose();
  }

  /** Free the runners, links and buffers (what prepareStages made, the model frees). */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.disposeParts();
  }
}

/** The device time by bucket of several runners' passes, summed (each runner's profile taken). */
export function sumProfiles(runners: readonly ModelRunner[], ops?: Record<string, number>): Record<ProfileBucket, number> {
  const out = Object.fromEntries(PROFILE_BUCKETS.map((b) => [b, 0])) as Record<ProfileBucket, number>;
  for (const r of runners) for (const [k, v] of Object.entries(r.takeProfile(ops))) out[k as ProfileBucket] += v;
  return out;
}

/** Counters summed over several backends (each given once): a pipeline's stages, a tensor-parallel group's shards. */
export function sumBackendStats(distinct: readonly DeviceBackend[]): BackendStats {
  if (distinct.length === 1) return distinct[0].stats();
  const all = distinct.map((b) => b.stats());
  const sum = (k: Exclude<keyof BackendStats, 'syncs' | 'hostComputeMsByOp'>) => all.reduce((t, s) => t + (s[k] ?? 0), 0);
  const byOp = all.filter((s) => s.hostComputeMsByOp !== undefined).map((s) => s.hostComputeMsByOp!);
  const syncs = emptySyncCounts();
  for (const s of all) for (const k of SYNC_KINDS) syncs[k] += s.syncs[k];
  return {
    liveBuffers: sum('liveBuffers'),
    liveBytes: sum('liveBytes'),
    allocCalls: sum('allocCalls'),
    freeCalls: sum('freeCalls'),
    hotPathAllocations: sum('hotPathAllocations'),
    h2dBytes: sum('h2dBytes'),
    d2hBytes: sum('d2hBytes'),
    d2dBytes: sum('d2dBytes'),
    launches: sum('launches'),
    graphReplays: sum('graphReplays'),
    syncs,
    ...(all.some((s) => s.hostComputeMs !== undefined) ? { hostComputeMs: sum('hostComputeMs') } : {}),
    ...(byOp.length ? { hostComputeMsByOp: { mlp_slice: byOp.reduce((t, b) => t + (b.mlp_slice ?? 0), 0), attention: byOp.reduce((t, b) => t + (b.attention ?? 0), 0) } } : {}),
  };
}
