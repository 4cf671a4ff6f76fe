import type { DecoderLayerWeights, DeviceBackend, DeviceBuffer, EventHandle, OpArgs, OpName, StreamHandle, Tier } from '@nerva/core';
import { DTYPE_BYTES } from '@nerva/core';
import type { ModelSpec } from '@nerva/models';
import { isMoeLayer, layerWindow } from '@nerva/models';
import { type KvCacheDtype, kvDtypeOf, type LayerWeights, layerBlockId, type ModelWeights } from './model-weights.js';

/**
 * Passes of at most this many rows run the fused layer ops (fused_matmul & co., the memory OS's
 * paths); larger ones (prefill) the unfused ops, whose matmuls can use the backend's GEMM. A batch
 * of decode rows (one row per sequence) takes op decoder_layers at any size: its matmuls switch
 * from GEMV to a GEMM with the fusions as an epilogue past 8 rows on CUDA.
 */
export const FUSED_MAX_ROWS = 8;

/** The default stream (id 0 on every backend), for waits that need a stream handle. */
const DEFAULT_STREAM: StreamHandle = Object.freeze({ id: 0 });

export interface RunnerLimits {
  /** Most token rows one forward pass takes (the scheduler's token budget). */
  maxRows: number;
  /** Most sequences one forward pass serves. */
  maxSeqs: number;
  blockSize: number;
  numBlocks: number;
  maxBlocksPerSeq: number;
  /** Capacity of the device token ring. */
  ringCapacity: number;
  /**
   * Tiered KV: pages of the warm pool (pinned host memory; the host tier of a CPU backend). With
   * warm pages, `numBlocks` is the hot pool and attention merges a host partial over warm pages.
   */
  warmBlocks?: number;
  /**
   * Tiered KV: the warm slots [0, linkPages) are the device's to attend over itself, while the
   * host CPU computes over the pages in the slots above. Each layer's leading `linkSpan` slots are
   * copied over the link from the pinned pool one layer ahead, on a stream of their own, by the
   * copy engine (one contiguous copy for K and one for V, no SM time), into one of two staging
   * buffers; meta.linkTables holds the staging index (the warm slot) per block. 0 or absent: none.
   */
  linkPages?: number;
  /** With linkPages: every warm page is staged, so there is no host partial. */
  linkOnly?: boolean;
  /** KV cache element type (default: kvDtypeOf(backend), i.e. by the backend's numerics). */
  kvDtype?: KvCacheDtype;
}

/** Where a tiered KV page sits when it moves (see @nerva/kv KvPageMove); cold pages are host arrays. */
export interface KvPageCopy {
  from: 'hot' | 'warm';
  fromSlot: number;
  to: 'hot' | 'warm';
  toSlot: number;
}

export const PROFILE_BUCKETS = ['embedding', 'norm', 'projection', 'attention', 'mlp', 'lm_head', 'sampling'] as const;
export type ProfileBucket = (typeof PROFILE_BUCKETS)[number];
/**
 * Op classes of a profiled pass beyond the op names (takeProfile's `ops`): the matmuls by the
 * projection they compute. Every other op is its own class, named as the op.
 */
export const PROFILE_OP_CLASSES = ['gemm_qkv', 'gemm_o', 'gemm_gate_up', 'gemm_down', 'gemm_host_mlp', 'gemm_router', 'lm_head', 'residual_add'] as const;
export type ProfileOpClass = (typeof PROFILE_OP_CLASSES)[number];

/** Buffers the host writes before a forward pass; kernels read per-step values only from these. */
export interface RunnerMeta {
  ids: DeviceBuffer;
  positions: DeviceBuffer;
  rowSeq: DeviceBuffer;
  slots: DeviceBuffer;
  blockTables: DeviceBuffer;
  logitRows: DeviceBuffer;
  /** Sampling parameters per logit row (temperature, topK, topP, minP) and rng (seed, counter). */
  sampleParams: DeviceBuffer;
  rng: DeviceBuffer;
  sampled: DeviceBuffer;
  /** Host-visible device token ring and its cursor. */
  ring: DeviceBuffer;
  ringCursor: DeviceBuffer;
  /** Tiered KV: each sequence's warm slot per block (-1 where the block is not warm). */
  warmTables?: DeviceBuffer;
  /** Tiered KV with limits.linkPages: the staging index per block of the pages staged into VRAM (-1 elsewhere). */
  linkTables?: DeviceBuffer;
}

/**
 * A pipeline stage's share of the model: decoder layers [firstLayer, endLayer). The stage with
 * layer 0 runs the embedding; the stage that ends at the last layer runs the final norm and the
 * LM head. A middle or last stage takes its input hidden states in `hidden` (act.residual) from the
 * stage before it (see StagePipeline).
 */
export interface RunnerStage {
  firstLayer: number;
  endLayer: number;
}

/** A run of the decoder stack for op decoder_layers: hot layers together, a streamed layer alone. */
type StackRun = { layers: DecoderLayerWeights[]; streamed?: string; layer?: number; split?: boolean };

/**
 * The decoder forward pass expressed over the backend contract: one batched, paged pass for
 * any mix of prefill chunks and decode rows. Every buffer is allocated here, before the hot
 * path; `forward` itself never allocates, so it can be captured as a graph and replayed.
 */
export class ModelRunner {
  /** The meta buffers its ops read; a StagePipeline may point stages at shared or per-micro-batch sets. */
  meta: RunnerMeta;
  readonly logits: DeviceBuffer;
  readonly kCache: DeviceBuffer[] = [];
  readonly vCache: DeviceBuffer[] = [];
  /** Tiered KV: the warm pool of each layer (host tier), and its bytes. */
  readonly kWarm: DeviceBuffer[] = [];
  readonly vWarm: DeviceBuffer[] = [];
  readonly warmKvBytes: number = 0;
  readonly kvBytes: number;
  /** Tiered KV with linkPages: the two staging buffers (K and V) and their bytes. */
  private readonly kStage: DeviceBuffer[] = [];
  private readonly vStage: DeviceBuffer[] = [];
  readonly stageBytes: number = 0;
  /**
   * Tiered KV with linkPages: the leading warm slots each layer's staging copies this pass (set by
   * the engine before forward; a captured graph keeps the value it was captured with).
   */
  linkSpan = 0;
  /** Ids sampled on the device are below this (the tokenizer's id space; default the vocab). */
  sampleLimit = Number.POSITIVE_INFINITY;
  /**
   * Op decoder_layers' maxKeys: an upper bound on every decode row's keys while a pass (or a graph
   * captured with it) runs, 0 when none is known. Set by the engine around a decode capture.
   */
  decodeKeyBound = 0;
  /** The stream staged pages are copied on; staged[b]: buffer b holds its layer; stageFree[b]: its layer was attended. */
  private linkStream: StreamHandle | undefined;
  private staged: EventHandle[] = [];
  private stageFree: EventHandle[] = [];
  private linkFork: EventHandle | undefined;
  /** Tiered KV: the side stream warm partials run on, and the fork/join events. */
  private sideStream: StreamHandle | undefined;
  private forkEv: EventHandle | undefined;
  private joinEv: EventHandle | undefined;
  /** Forward passes run with host partials over warm pages. */
  tieredPasses = 0;
  private readonly act: Record<string, DeviceBuffer> = {};
  private readonly owned: DeviceBuffer[] = [];
  private readonly qkvOut: number;
  /** Profiling: bucket -> accumulated ms, filled from device events. */
  private profiling = false;
  private readonly events: EventHandle[] = [];
  private readonly eventBuckets: ProfileBucket[] = [];
  /** The op class of each bracketed op (its label, else the op's name): takeProfile's finer split. */
  private readonly eventLabels: string[] = [];
  private eventCount = 0;
  private stream: StreamHandle | undefined;
  /** Whether the backend has the fused decode ops (fused_matmul, rope_append). */
  private readonly fusedOps: boolean;
  /**
   * Matmul precision 'bf16' on a backend with capabilities.bf16Activations (dense layers, no host
   * slices): passes of more than 8 rows have the norms before the qkv and gate_up projections and
   * silu_mul write bf16 (act.normedBf16, act.mlpActBf16), which those matmuls read as they are.
   * They round their inputs to bf16 anyway, so the results are the same, without a rounding pass
   * per matmul and with half the bytes written and read.
   */
  private readonly bf16Act: boolean;
  /**
   * Every layer's weights and caches as op `decoder_layers` takes them, built once; undefined when
   * the backend lacks the op or the model has a sparse (MoE) layer, which the op does not cover.
   */
  private readonly stack: readonly StackRun[] | undefined;
  /**
   * Sliding window of each decoder layer (indexed by layer; 0 = full attention), passed to op
   * `attention` as `window`: the op masks each row to its last `window` positions, whatever the
   * mix of prefill chunks and decode rows, so chunked prefill and prefix-cache hits need nothing more.
   */
  private readonly windows: readonly number[];
  /** Decoder layers [firstLayer, endLayer) run here (every layer unless a pipeline stage). */
  readonly firstLayer: number;
  readonly endLayer: number;
  /** Runs the embedding (holds layer 0). */
  readonly first: boolean;
  /** Runs the final norm and the LM head (holds the last layer). */
  readonly last: boolean;

  constructor(
    readonly backend: DeviceBackend,
    readonly spec: ModelSpec,
    readonly weights: ModelWeights,
    readonly limits: RunnerLimits,
    stage?: RunnerStage,
  ) {
    const s = spec;
    this.firstLayer = stage?.firstLayer ?? 0;
    this.endLayer = stage?.endLayer ?? s.numLayers;
    if (!Number.isInteger(this.firstLayer) || !Number.isInteger(this.endLayer) || this.firstLayer < 0 || this.endLayer > s.numLayers || this.firstLayer >= this.endLayer)
      throw new RangeError(`stage layers [${this.firstLayer}, ${this.endLayer}) are not a non-empty range of the model's ${s.numLayers} layers`);
    this.first = this.firstLayer === 0;
    this.last = this.endLayer === s.numLayers;
    this.windows = Array.from({ length: s.numLayers }, (_, l) => layerWindow(s, l));
    const { maxRows, maxSeqs } = limits;
    const hd = s.headDim;
    this.qkvOut = (s.numHeads + 2 * s.numKvHeads) * hd;
    this.fusedOps = backend.capabilities.ops.includes('fused_matmul') && backend.capabilities.ops.includes('rope_append');
    const hostTier = backend.capabilities.computeTier === 'vram' ? 'pinned' : backend.capabilities.computeTier;
    const i32 = (length: number, label: string, tier?: Tier) =>
      this.own(backend.alloc({ dtype: 'i32', length, usage: 'io', label, ...(tier ? { tier } : {}) }));
    const f32 = (length: number, label: string) => this.own(backend.alloc({ dtype: 'f32', length, usage: 'activations', label }));
    try {
      this.meta = {
        ids: i32(maxRows, 'meta.ids'),
        positions: i32(maxRows, 'meta.positions'),
        rowSeq: i32(maxRows, 'meta.row_seq'),
        slots: i32(maxRows, 'meta.slots'),
        blockTables: i32(maxSeqs * limits.maxBlocksPerSeq, 'meta.block_tables'),
        logitRows: i32(maxSeqs, 'meta.logit_rows'),
        sampleParams: this.own(backend.alloc({ dtype: 'f32', length: maxSeqs * 4, usage: 'io', label: 'meta.sample_params' })),
        rng: i32(maxSeqs * 2, 'meta.rng'),
        sampled: i32(maxSeqs, 'meta.sampled'),
        ring: i32(limits.ringCapacity, 'token_ring', hostTier),
        ringCursor: i32(1, 'token_ring.cursor', hostTier),
      };
      const H = s.hiddenSize;
      const inter = s.moe ? Math.max(s.intermediateSize, s.moe.moeIntermediateSize) : s.intermediateSize;
      this.act.residual = f32(maxRows * H, 'act.residual');
      this.act.normed = f32(maxRows * H, 'act.normed');
      this.act.qkv = f32(maxRows * this.qkvOut, 'act.qkv');
      this.act.attn = f32(maxRows * s.numHeads * hd, 'act.attn');
      this.act.o = f32(maxRows * H, 'act.o');
      this.act.gateUp = f32(maxRows * 2 * inter, 'act.gate_up');
      this.act.mlpAct = f32(maxRows * inter, 'act.mlp');
      this.act.mlpOut = f32(maxRows * H, 'act.mlp_out');
      this.bf16Act = backend.capabilities.bf16Activations === true && backend.capabilities.matmulPrecision === 'bf16' && !s.moe && !weights.hostParts && maxRows > FUSED_MAX_ROWS;
      if (this.bf16Act) {
        this.act.normedBf16 = this.own(backend.alloc({ dtype: 'bf16', length: maxRows * H, usage: 'activations', label: 'act.normed_bf16' }));
        this.act.mlpActBf16 = this.own(backend.alloc({ dtype: 'bf16', length: maxRows * inter, usage: 'activations', label: 'act.mlp_bf16' }));
      }
      if (weights.hostParts) {
        // Compute near data: the host slice's output, and host staging for decode rows.
        this.act.hostOut = f32(maxRows * H, 'act.host_mlp_out');
        const fusedRows = Math.min(maxRows, FUSED_MAX_ROWS);
        this.act.xHost = this.own(backend.alloc({ dtype: 'f32', length: fusedRows * H, usage: 'io', tier: 'pinned', label: 'act.host_mlp_x' }));
        this.act.yHost = this.own(backend.alloc({ dtype: 'f32', length: fusedRows * H, usage: 'io', tier: 'pinned', label: 'act.host_mlp_y' }));
      }
      this.act.last = f32(maxSeqs * H, 'act.last_hidden');
      if (s.moe) {
        this.act.routerLogits = f32(maxRows * s.moe.numExperts, 'act.router_logits');
        this.act.topW = f32(maxRows * s.moe.topK, 'act.top_weights');
        this.act.topIds = i32(maxRows * s.moe.topK, 'act.top_ids');
      }
      // Only the last stage computes logits.
      this.logits = f32(this.last ? maxSeqs * s.vocabSize : 1, 'act.logits');
      const slotsTotal = limits.numBlocks * limits.blockSize;
      const kvWidth = s.numKvHeads * hd;
      const kvDtype = limits.kvDtype ?? kvDtypeOf(backend);
      // Caches of this runner's layers only, indexed by layer.
      for (let l = this.firstLayer; l < this.endLayer; l++) {
        this.kCache[l] = this.own(backend.alloc({ dtype: kvDtype, length: slotsTotal * kvWidth, usage: 'kv', label: `kv.k.${l}` }));
        this.vCache[l] = this.own(backend.alloc({ dtype: kvDtype, length: slotsTotal * kvWidth, usage: 'kv', label: `kv.v.${l}` }));
      }
      this.kvBytes = 2 * (this.endLayer - this.firstLayer) * slotsTotal * kvWidth * DTYPE_BYTES[kvDtype];
      const warm = limits.warmBlocks ?? 0;
      if (warm > 0) {
        // The warm pool lives where the host CPU computes over it: pinned memory on a GPU backend.
        const warmSlots = warm * limits.blockSize;
        for (let l = this.firstLayer; l < this.endLayer; l++) {
          this.kWarm[l] = this.own(backend.alloc({ dtype: kvDtype, length: warmSlots * kvWidth, usage: 'kv', tier: 'pinned', label: `kv.warm.k.${l}` }));
          this.vWarm[l] = this.own(backend.alloc({ dtype: kvDtype, length: warmSlots * kvWidth, usage: 'kv', tier: 'pinned', label: `kv.warm.v.${l}` }));
        }
        this.warmKvBytes = 2 * (this.endLayer - this.firstLayer) * warmSlots * kvWidth * DTYPE_BYTES[kvDtype];
        this.meta.warmTables = i32(maxSeqs * limits.maxBlocksPerSeq, 'meta.warm_tables');
        const qw = s.numHeads * hd;
        this.act.hotLse = f32(maxRows * s.numHeads, 'act.attn_lse');
        this.act.warmOut = f32(maxRows * qw, 'act.warm_attn');
        this.act.warmLse = f32(maxRows * s.numHeads, 'act.warm_attn_lse');
        const lp = limits.linkPages ?? 0;
        if (lp > 0) {
          this.meta.linkTables = i32(maxSeqs * limits.maxBlocksPerSeq, 'meta.link_tables');
          this.act.linkOut = f32(maxRows * qw, 'act.link_attn');
          this.act.linkLse = f32(maxRows * s.numHeads, 'act.link_attn_lse');
          // Two staging buffers: layer l's pages in buffer l % 2 while layer l + 1's arrive in the other.
          const stage = (kv: string, b: number) => this.own(backend.alloc({ dtype: kvDtype, length: lp * limits.blockSize * kvWidth, usage: 'kv', label: `kv.stage.${kv}.${b}` }));
          for (const b of [0, 1]) {
            this.kStage.push(stage('k', b));
            this.vStage.push(stage('v', b));
          }
          this.stageBytes = 4 * lp * limits.blockSize * kvWidth * DTYPE_BYTES[kvDtype];
          this.linkStream = backend.createStream();
          for (const _ of [0, 1]) {
            this.staged.push(backend.createEvent());
            this.stageFree.push(backend.createEvent());
          }
          this.linkFork = backend.createEvent();
        }
        const pinned = (length: number, label: string) => this.own(backend.alloc({ dtype: 'f32', length, usage: 'io', tier: 'pinned', label }));
        this.act.qHost = pinned(maxRows * qw, 'act.warm_q_host');
        this.act.outHost = pinned(maxRows * qw, 'act.warm_out_host');
        this.act.lseHost = pinned(maxRows * s.numHeads, 'act.warm_lse_host');
        this.sideStream = backend.createStream();
        this.forkEv = backend.createEvent();
        this.joinEv = backend.createEvent();
      }
      // Op decoder_layers has no sliding window: a model with a windowed layer runs per-layer ops.
      const windowed = this.windows.slice(this.firstLayer, this.endLayer).some((w) => w > 0);
      this.stack = backend.capabilities.ops.includes('decoder_layers') && s.moe === undefined && !windowed ? this.decoderStack() : undefined;
      backend.write(this.meta.ringCursor, new Int32Array(1));
    } catch (e) {
      this.dispose();
      throw e;
    }
  }

  /**
   * The dense layers' weights with their KV caches, in the shape op `decoder_layers` takes: runs of
   * hot layers, and each streamed layer alone over the staging slot it always passes through.
   */
  private decoderStack(): StackRun[] | undefined {
    const runs: StackRun[] = [];
    const pager = this.weights.pager;
    for (let l = this.firstLayer; l < this.endLayer; l++) {
      const id = layerBlockId(l);
      const streamed = pager?.isStreamed(id) ?? false;
      const lw = streamed ? (pager!.slotFor(id) as unknown as LayerWeights) : this.weights.layers[l];
      if (lw === undefined || lw.gateUp === undefined || lw.down === undefined) return undefined;
      const w: DecoderLayerWeights = {
        attnNorm: lw.attnNorm,
        qkv: lw.qkv,
        qkvBias: lw.qkvBias,
        qNorm: lw.qNorm,
        kNorm: lw.kNorm,
        o: lw.o,
        oBias: lw.oBias,
        mlpNorm: lw.mlpNorm,
        gateUp: lw.gateUp,
        down: lw.down,
        kCache: this.kCache[l],
        vCache: this.vCache[l],
      };
      const last = runs[runs.length - 1];
      // A split layer runs as fused ops around its host slice (the stack op has no place for it).
      if (streamed) runs.push({ layers: [w], streamed: id, layer: l, split: this.weights.hostParts?.[l] !== undefined });
      else if (last && last.streamed === undefined) last.layers.push(w);
      else runs.push({ layers: [w] });
    }
    return runs;
  }

  /** Layer l's weights for ops enqueued next: hot buffers, or the slot the pager loaded it into. */
  private acquireLayer(l: number): LayerWeights {
    const hot = this.weights.layers[l];
    if (hot) return hot;
    return this.weights.pager!.acquire(layerBlockId(l), this.stream) as unknown as LayerWeights;
  }

  /** The ops of layer l are enqueued: a streamed layer's slot may take the next block. */
  private releaseLayer(l: number): void {
    if (this.weights.layers[l] === undefined) this.weights.pager!.release(layerBlockId(l), this.stream);
  }

  /**
   * Calibration hook: called with l and rows at the start of each decoder layer of an unfused
   * pass, and with l = the end layer after the last, when the stream is complete in
   * `hidden` (+ `mlpOut` after the first layer). Reads there synchronize: calibration only.
   */
  layerProbe: ((l: number, rows: number) => void) | undefined;

  /** The last layer's MLP output, not yet added to `hidden` in an unfused pass. */
  get mlpOut(): DeviceBuffer {
    return this.act.mlpOut;
  }

  /** Weight bytes of host slices enqueued through op mlp_slice (computed near the data). */
  hostComputeBytes = 0;
  /** Weight bytes of host slices read in place by the device (prefill passes). */
  hostReadBytes = 0;

  /** The residual stream [maxRows, hidden]: a stage's output, and a later stage's input. */
  get hidden(): DeviceBuffer {
    return this.act.residual;
  }

  /** A weight only some pipeline stages hold (the embedding, final norm, LM head). */
  private need(b: DeviceBuffer | undefined, what: string): DeviceBuffer {
    if (b === undefined) throw new RangeError(`this stage (layers ${this.firstLayer}-${this.endLayer - 1}) holds no ${what}`);
    return b;
  }

  private own(b: DeviceBuffer): DeviceBuffer {
    this.owned.push(b);
    return b;
  }

  /** Turn per-op device timing on: ops are bracketed by events (only outside graph capture). */
  setProfiling(on: boolean, maxEvents = 8192): void {
    this.profiling = on;
    while (on && this.events.length < maxEvents) this.events.push(this.backend.createEvent());
  }

  /**
   * Sum the bucket times of the last pass; call after the stream finished. `ops`, when given,
   * also gets the time of each op class (PROFILE_OP_CLASSES: the projection of a matmul, or the
   * op's name) added to it.
   */
  takeProfile(ops?: Record<string, number>): Record<ProfileBucket, number> {
    const out = Object.fromEntries(PROFILE_BUCKETS.map((b) => [b, 0])) as Record<ProfileBucket, number>;
    for (let i = 0; i + 1 < this.eventCount; i += 2) {
      const ms = this.backend.elapsedMs(this.events[i], this.events[i + 1]);
      out[this.eventBuckets[i >> 1]] += ms;
      if (ops) {
        const k = this.eventLabels[i >> 1];
        ops[k] = (ops[k] ?? 0) + ms;
      }
    }
    this.eventCount = 0;
    return out;
  }

  private op<K extends OpName>(bucket: ProfileBucket, name: K, args: OpArgs<K>, label?: ProfileOpClass): void {
    if (this.profiling && this.eventCount + 2 <= this.events.length) {
      const i = this.eventCount;
      this.backend.record(this.events[i], this.stream);
      this.backend.run(name, args, this.stream);
      this.backend.record(this.events[i + 1], this.stream);
      this.eventBuckets[i >> 1] = bucket;
      this.eventLabels[i >> 1] = label ?? name;
      this.eventCount += 2;
    } else {
      this.backend.run(name, args, this.stream);
    }
  }

  /**
   * One forward pass over `rows` token rows described by the meta buffers; writes the logits of
   * the `nLogits` rows listed in meta.logitRows to `logits` ([nLogits, vocab]).
   *
   * A pipeline stage runs its layers only: the embedding when it holds layer 0 (else `hidden`
   * holds its input rows), the final norm and LM head when it holds the last layer and `head` is
   * not false; otherwise it leaves the complete residual stream of its rows in `hidden`.
   */
  /**
   * Set (by the engine, around one pass) when meta.logitRows lists a row more than once: the pass
   * that samples a prompt's last row once per shared-prefix fork. nLogits === rows then no longer
   * means one row per sequence, so the pass keeps the per-layer ops.
   */
  repeatedLogitRows = false;
  /**
   * Set (by the engine, around one eager pass) when every row of the pass belongs to one
   * sequence: op attention gets `oneSequence`, so a backend may skip what sequence seams need.
   */
  oneSequence = false;

  forward(rows: number, nLogits: number, stream?: StreamHandle, head = this.last, tiered = false): void {
    this.stream = stream;
    if (tiered && this.meta.warmTables === undefined) throw new RangeError('a tiered pass needs a runner created with warm KV blocks');
    this.tiered = tiered;
    if (tiered) {
      this.tieredPasses++;
      if (this.linkStream) this.beginStaging();
    }
    const s = this.spec;
    const w = this.weights;
    const a = this.act;
    const m = this.meta;
    const H = s.hiddenSize;
    const hd = s.headDim;
    const nq = s.numHeads;
    const nkv = s.numKvHeads;
    const qkvOut = this.qkvOut;
    const eps = s.rmsNormEps;

    // The whole stack as one op needs every row to be a different sequence (op decoder_layers'
    // precondition). meta.logitRows lists one row per sequence (its last), so nLogits === rows
    // means every sequence of the pass has exactly one row: a batch of decode rows. Profiling
    // keeps the per-layer ops, so device time still splits into norm/projection/attention/mlp.
    // Split layers (compute near data) stage host rows in buffers of FUSED_MAX_ROWS rows.
    const wholeStack =
      this.stack !== undefined && nLogits === rows && !this.repeatedLogitRows && !this.profiling && !tiered && (rows <= FUSED_MAX_ROWS || !this.stack.some((r) => r.split));
    // The embedding folded into the stack's first op where the backend takes it (op
    // decoder_layers' embed: a decode step's first kernel then gathers its row itself).
    const embed =
      this.first && wholeStack && this.backend.capabilities.decoderLayersEmbed === true && this.stack![0]?.split !== true
        ? { table: this.need(w.embed, 'embedding'), ids: m.ids }
        : undefined;
    if (this.first && !embed) this.op('embedding', 'embedding', { table: this.need(w.embed, 'embedding'), ids: m.ids, out: a.residual, rows, hidden: H });
    if (wholeStack || (rows <= FUSED_MAX_ROWS && this.fusedOps)) {
      if (wholeStack) this.forwardStack(rows, embed);
      else this.forwardFusedLayers(rows);
      if (head) {
        // One logit row per row (decode rows, see wholeStack): meta.logitRows is 0..rows-1, so
        // the LM head reads the residual rows as they are, with the final norm folded into it
        // (one kernel fewer a token; H100 0.6B: 1361-1362 against 1355 tok/s, same tokens).
        if (nLogits === rows && !this.repeatedLogitRows) {
          this.op('lm_head', 'fused_matmul', { x: a.residual, weight: this.need(w.lmHead, 'LM head'), out: this.logits, rows, inDim: H, outDim: s.vocabSize, normWeight: this.need(w.finalNorm, 'final norm'), eps }, 'lm_head');
        } else {
          this.op('norm', 'rmsnorm', { x: a.residual, weight: this.need(w.finalNorm, 'final norm'), out: a.normed, rows, dim: H, eps });
          this.lmHead(nLogits);
        }
      }
      // The compute stream waits for the loads that start the next pass (they overlapped lm_head).
      w.pager?.endPass(this.stream);
      return;
    }
    // The projections' inputs in bf16 (see bf16Act): a bf16 x is for more than 8 rows.
    const bfa = this.bf16Act && rows > FUSED_MAX_ROWS;
    const normed = bfa ? a.normedBf16 : a.normed;
    const mlpAct = bfa ? a.mlpActBf16 : a.mlpAct;
    for (let l = this.firstLayer; l < this.endLayer; l++) {
      this.layerProbe?.(l, rows);
      const lw = this.acquireLayer(l);
      // The first layer of a runner finds the residual stream complete (embedding, or a stage's handoff).
      if (l === this.firstLayer) this.op('norm', 'rmsnorm', { x: a.residual, weight: lw.attnNorm, out: normed, rows, dim: H, eps });
      else this.op('norm', 'rmsnorm', { x: a.mlpOut, residual: a.residual, weight: lw.attnNorm, out: normed, rows, dim: H, eps });
      this.op('projection', 'matmul', { x: normed, weight: lw.qkv, bias: lw.qkvBias, out: a.qkv, rows, inDim: H, outDim: qkvOut }, 'gemm_qkv');
      if (this.fusedOps) {
        // QK-norm, RoPE and the KV append in one op (the same arithmetic as the three below).
        this.op('attention', 'rope_append', {
          qkv: a.qkv,
          positions: m.positions,
          invFreq: w.invFreq,
          slots: m.slots,
          kCache: this.kCache[l],
          vCache: this.vCache[l],
          rows,
          numHeads: nq,
          numKvHeads: nkv,
          headDim: hd,
          rowStride: qkvOut,
          qNorm: lw.qNorm,
          kNorm: lw.kNorm,
          eps,
        });
      } else {
        const rope = { x: a.qkv, positions: m.positions, invFreq: w.invFreq, rows, headDim: hd, rowStride: qkvOut, eps };
        this.op('attention', 'rope', { ...rope, numHeads: nq, headOffset: 0, normWeight: lw.qNorm });
        this.op('attention', 'rope', { ...rope, numHeads: nkv, headOffset: nq * hd, normWeight: lw.kNorm });
        this.op('attention', 'kv_append', {
          src: a.qkv,
          kCache: this.kCache[l],
          vCache: this.vCache[l],
          slots: m.slots,
          rows,
          numKvHeads: nkv,
          headDim: hd,
          rowStride: qkvOut,
          kOffset: nq * hd,
          vOffset: (nq + nkv) * hd,
        });
      }
      this.attend(l, rows);
      this.op('projection', 'matmul', { x: a.attn, weight: lw.o, bias: lw.oBias, out: a.o, rows, inDim: nq * hd, outDim: H }, 'gemm_o');
      this.op('norm', 'rmsnorm', { x: a.o, residual: a.residual, weight: lw.mlpNorm, out: normed, rows, dim: H, eps });
      if (s.moe && isMoeLayer(s, l)) {
        this.moeMlp(rows, lw);
      } else {
        const hp = w.hostParts?.[l];
        const I = s.intermediateSize - (hp?.inter ?? 0);
        if (hp) {
          // A prefill pass reads the host slice's weights in place (once per pass, like a load).
          const c = hp.inter;
          this.hostReadBytes += hp.gateUp.byteLength + hp.down.byteLength;
          this.op('mlp', 'matmul', { x: a.normed, weight: hp.gateUp, out: a.gateUp, rows, inDim: H, outDim: 2 * c }, 'gemm_host_mlp');
          this.op('mlp', 'silu_mul', { x: a.gateUp, out: a.mlpAct, rows, dim: c });
          this.op('mlp', 'matmul', { x: a.mlpAct, weight: hp.down, out: a.hostOut, rows, inDim: c, outDim: H }, 'gemm_host_mlp');
        }
        this.op('mlp', 'matmul', { x: normed, weight: lw.gateUp!, out: a.gateUp, rows, inDim: H, outDim: 2 * I }, 'gemm_gate_up');
        this.op('mlp', 'silu_mul', { x: a.gateUp, out: mlpAct, rows, dim: I });
        this.op('mlp', 'matmul', { x: mlpAct, weight: lw.down!, out: a.mlpOut, rows, inDim: I, outDim: H }, 'gemm_down');
        if (hp) this.op('mlp', 'add', { a: a.mlpOut, b: a.hostOut, out: a.mlpOut, length: rows * H });
      }
      this.releaseLayer(l);
    }
    this.layerProbe?.(this.endLayer, rows);
    if (head) {
      this.op('norm', 'rmsnorm', { x: a.mlpOut, residual: a.residual, weight: this.need(w.finalNorm, 'final norm'), out: a.normed, rows, dim: H, eps });
      this.lmHead(nLogits);
    } else {
      // The handoff carries the complete stream: the last layer's MLP output is added here, as the
      // next layer's fused norm would (the same float32 sum, R(residual + x)).
      this.op('mlp', 'add', { a: a.residual, b: a.mlpOut, out: a.residual, length: rows * H }, 'residual_add');
    }
    w.pager?.endPass(this.stream);
  }

  /**
   * The final norm and LM head over `rows` complete residual rows in `x` (a pipeline's last stage
   * after its micro-batches were gathered): logits of the meta.logitRows rows, as forward writes them.
   */
  head(rows: number, nLogits: number, x: DeviceBuffer, stream?: StreamHandle): void {
    this.stream = stream;
    const H = this.spec.hiddenSize;
    this.op('norm', 'rmsnorm', { x, weight: this.need(this.weights.finalNorm, 'final norm'), out: this.act.normed, rows, dim: H, eps: this.spec.rmsNormEps });
    this.lmHead(nLogits);
  }

  /** The pass being enqueued merges host partials over warm pages. */
  private tiered = false;

  /**
   * Paged attention of layer l over the q heads of act.qkv -> act.attn (both forward paths). In a
   * tiered pass: the warm partial runs on the side stream (on the host, where the pages lie) while
   * the hot partial runs here, and attention_merge joins them (the online-softmax rule: exact).
   */
  private attend(l: number, rows: number): void {
    if (this.tiered) return this.attendTiered(l, rows);
    const s = this.spec;
    const m = this.meta;
    this.op('attention', 'attention', {
      q: this.act.qkv,
      kCache: this.kCache[l],
      vCache: this.vCache[l],
      out: this.act.attn,
      blockTables: m.blockTables,
      rowSeq: m.rowSeq,
      positions: m.positions,
      rows,
      numHeads: s.numHeads,
      numKvHeads: s.numKvHeads,
      headDim: s.headDim,
      blockSize: this.limits.blockSize,
      maxBlocksPerSeq: this.limits.maxBlocksPerSeq,
      qRowStride: this.qkvOut,
      qOffset: 0,
      scale: 1 / Math.sqrt(s.headDim),
      ...this.windowArg(l),
      ...(this.oneSequence ? { oneSequence: true } : {}),
    });
  }

  /** `window` for op attention on a sliding layer; nothing on a full-attention one. */
  private windowArg(l: number): { window?: number } {
    const w = this.windows[l];
    return w > 0 ? { window: w } : {};
  }

  private attendTiered(l: number, rows: number): void {
    const s = this.spec;
    const m = this.meta;
    const a = this.act;
    const be = this.backend;
    const common = {
      q: a.qkv,
      rowSeq: m.rowSeq,
      positions: m.positions,
      rows,
      numHeads: s.numHeads,
      numKvHeads: s.numKvHeads,
      headDim: s.headDim,
      blockSize: this.limits.blockSize,
      maxBlocksPerSeq: this.limits.maxBlocksPerSeq,
      qRowStride: this.qkvOut,
      qOffset: 0,
      scale: 1 / Math.sqrt(s.headDim),
      // Both partials mask to the window; positions outside it are in neither.
      ...this.windowArg(l),
    };
    const hostPartial = !this.limits.linkOnly;
    const main = this.stream;
    if (hostPartial) {
      const side = this.sideStream!;
      be.record(this.forkEv!, this.stream);
      be.waitEvent(side, this.forkEv!);
      this.stream = side;
      this.op('attention', 'attention', {
        ...common,
        kCache: this.kWarm[l],
        vCache: this.vWarm[l],
        out: a.warmOut,
        lse: a.warmLse,
        blockTables: m.warmTables!,
        qHost: a.qHost,
        outHost: a.outHost,
        lseHost: a.lseHost,
      });
      be.record(this.joinEv!, side);
      this.stream = main;
    }
    this.op('attention', 'attention', { ...common, kCache: this.kCache[l], vCache: this.vCache[l], out: a.attn, lse: a.hotLse, blockTables: m.blockTables });
    if (this.linkStream) {
      // The device's own partial over the warm pages staged for this layer (copied a layer
      // ahead), merged before the host's result is awaited; then the buffer takes layer l + 2's.
      const b = (l - this.firstLayer) % 2;
      be.waitEvent(main ?? DEFAULT_STREAM, this.staged[b]);
      this.op('attention', 'attention', { ...common, kCache: this.kStage[b], vCache: this.vStage[b], out: a.linkOut, lse: a.linkLse, blockTables: m.linkTables! });
      this.op('attention', 'attention_merge', { out: a.attn, lse: a.hotLse, other: a.linkOut, otherLse: a.linkLse, rows, numHeads: s.numHeads, headDim: s.headDim });
      if (l + 2 < this.endLayer) {
        be.record(this.stageFree[b], main);
        be.waitEvent(this.linkStream, this.stageFree[b]);
        this.stage(l + 2, b);
      }
    }
    if (hostPartial) {
      be.waitEvent(main ?? DEFAULT_STREAM, this.joinEv!);
      this.op('attention', 'attention_merge', { out: a.attn, lse: a.hotLse, other: a.warmOut, otherLse: a.warmLse, rows, numHeads: s.numHeads, headDim: s.headDim });
    }
  }

  /** Starts a tiered pass's staging: the first two layers' pages, after the step's tables are written. */
  private beginStaging(): void {
    const be = this.backend;
    be.record(this.linkFork!, this.stream);
    be.waitEvent(this.linkStream!, this.linkFork!);
    for (let l = this.firstLayer; l < Math.min(this.endLayer, this.firstLayer + 2); l++) this.stage(l, (l - this.firstLayer) % 2);
  }

  /**
   * Copies layer l's leading linkSpan warm slots from the pinned pool into buffer b, on the link
   * stream. Copies, not a gather kernel: a kernel reading mapped host memory holds SMs while it
   * waits on the link and its time added to the step's (session 12: 455 MB of warm KV a token cost
   * 8.3 ms on top of an 8 ms step); the copy engine overlaps the layers before it.
   */
  private stage(l: number, b: number): void {
    const n = this.linkSpan * this.limits.blockSize * this.spec.numKvHeads * this.spec.headDim;
    if (n > 0) {
      this.backend.copy(this.kStage[b], this.kWarm[l], n, 0, 0, this.linkStream);
      this.backend.copy(this.vStage[b], this.vWarm[l], n, 0, 0, this.linkStream);
    }
    this.backend.record(this.staged[b], this.linkStream);
  }

  /**
   * Tiered KV page moves between the hot and warm pools, every layer, in order on the compute
   * stream (a page's slot is vacated before it is reused). `rows` of each pool are blockSize.
   */
  copyKvPage(c: KvPageCopy): void {
    const w = this.spec.numKvHeads * this.spec.headDim * this.limits.blockSize;
    for (let l = this.firstLayer; l < this.endLayer; l++) {
      const [kd, vd] = c.to === 'hot' ? [this.kCache[l], this.vCache[l]] : [this.kWarm[l], this.vWarm[l]];
      const [ks, vs] = c.from === 'hot' ? [this.kCache[l], this.vCache[l]] : [this.kWarm[l], this.vWarm[l]];
      this.backend.copy(kd, ks, w, c.toSlot * w, c.fromSlot * w, this.stream);
      this.backend.copy(vd, vs, w, c.toSlot * w, c.fromSlot * w, this.stream);
    }
  }

  /** A warm page's K and V of every layer, read to the host (cold-tier spill): [layers][K | V]. */
  readWarmPage(slot: number): Float32Array {
    const w = this.spec.numKvHeads * this.spec.headDim * this.limits.blockSize;
    const n = this.endLayer - this.firstLayer;
    const out = new Float32Array(2 * n * w);
    for (let l = this.firstLayer; l < this.endLayer; l++) {
      const i = l - this.firstLayer;
      out.set(this.backend.read(this.kWarm[l], slot * w, w) as Float32Array, 2 * i * w);
      out.set(this.backend.read(this.vWarm[l], slot * w, w) as Float32Array, (2 * i + 1) * w);
    }
    return out;
  }

  /** The inverse of readWarmPage: a page read back from the cold tier into warm slot `slot`. */
  writeWarmPage(slot: number, data: Float32Array): void {
    const w = this.spec.numKvHeads * this.spec.headDim * this.limits.blockSize;
    for (let l = this.firstLayer; l < this.endLayer; l++) {
      const i = l - this.firstLayer;
      this.backend.write(this.kWarm[l], data.subarray(2 * i * w, (2 * i + 1) * w), slot * w);
      this.backend.write(this.vWarm[l], data.subarray((2 * i + 1) * w, (2 * i + 2) * w), slot * w);
    }
  }

  /** The LM head over the meta.logitRows rows of act.normed. */
  private lmHead(nLogits: number): void {
    const H = this.spec.hiddenSize;
    const a = this.act;
    this.op('lm_head', 'gather_rows', { x: a.normed, rowIdx: this.meta.logitRows, out: a.last, n: nLogits, dim: H });
    // A batch-invariant backend computes a fused_matmul row the same way at any row count; op
    // matmul may switch to a GEMM past 8 rows, so a first token sampled once per fork (or any
    // logit row of a large batch) would not be the token the request gets alone.
    const op = this.backend.capabilities.batchInvariant === true ? 'fused_matmul' : 'matmul';
    this.op('lm_head', op, { x: a.last, weight: this.need(this.weights.lmHead, 'LM head'), out: this.logits, rows: nLogits, inDim: H, outDim: this.spec.vocabSize }, 'lm_head');
  }

  /**
   * The decoder layers as fused ops (decode steps): the residual stream is kept complete in
   * act.residual, the norms run inside the projections that read them (qkv and gate_up), the o
   * and down projections add into the stream, and silu*up is the gate_up projection's epilogue.
   * 6 kernels per dense layer instead of 12; the same arithmetic up to float32 rounding.
   */
  private forwardFusedLayers(rows: number): void {
    for (let l = this.firstLayer; l < this.endLayer; l++) this.fusedLayer(l, rows);
  }

  /** One decoder layer as fused ops (see forwardFusedLayers), its weights acquired and released. */
  private fusedLayer(l: number, rows: number): void {
    const s = this.spec;
    const w = this.weights;
    const a = this.act;
    const m = this.meta;
    const H = s.hiddenSize;
    const hd = s.headDim;
    const nq = s.numHeads;
    const nkv = s.numKvHeads;
    const qkvOut = this.qkvOut;
    const eps = s.rmsNormEps;
    {
      const lw = this.acquireLayer(l);
      // The input RMSNorm is folded into the GEMV (the backend normalizes the row once per block).
      this.op('projection', 'fused_matmul', {
        x: a.residual,
        weight: lw.qkv,
        bias: lw.qkvBias,
        out: a.qkv,
        rows,
        inDim: H,
        outDim: qkvOut,
        normWeight: lw.attnNorm,
        eps,
      }, 'gemm_qkv');
      this.op('attention', 'rope_append', {
        qkv: a.qkv,
        positions: m.positions,
        invFreq: w.invFreq,
        slots: m.slots,
        kCache: this.kCache[l],
        vCache: this.vCache[l],
        rows,
        numHeads: nq,
        numKvHeads: nkv,
        headDim: hd,
        rowStride: qkvOut,
        qNorm: lw.qNorm,
        kNorm: lw.kNorm,
        eps,
      });
      this.attend(l, rows);
      this.op('projection', 'fused_matmul', { x: a.attn, weight: lw.o, bias: lw.oBias, out: a.residual, rows, inDim: nq * hd, outDim: H, accumulate: true }, 'gemm_o');
      if (s.moe && isMoeLayer(s, l)) {
        this.op('norm', 'rmsnorm', { x: a.residual, weight: lw.mlpNorm, out: a.normed, rows, dim: H, eps });
        this.moeMlp(rows, lw);
        this.op('mlp', 'add', { a: a.residual, b: a.mlpOut, out: a.residual, length: rows * H }, 'residual_add');
      } else {
        const hp = w.hostParts?.[l];
        // Compute near data: the host slice runs where its weights lie, from the stream before
        // this layer's MLP touches it; the rest runs here; the two sums meet in the stream.
        if (hp) {
          this.hostComputeBytes += hp.gateUp.byteLength + hp.down.byteLength;
          this.op('mlp', 'mlp_slice', {
            x: a.residual,
            normWeight: hp.normWeight,
            gateUp: hp.gateUp,
            down: hp.down,
            out: a.hostOut,
            rows,
            hidden: H,
            inter: hp.inter,
            eps,
            xHost: a.xHost,
            yHost: a.yHost,
          });
        }
        const I = s.intermediateSize - (hp?.inter ?? 0);
        // Norm and SiLU-GLU both fold into the gate_up GEMV.
        this.op('mlp', 'fused_matmul', { x: a.residual, weight: lw.gateUp!, out: a.mlpAct, rows, inDim: H, outDim: I, normWeight: lw.mlpNorm, eps, glu: true }, 'gemm_gate_up');
        this.op('mlp', 'fused_matmul', { x: a.mlpAct, weight: lw.down!, out: a.residual, rows, inDim: I, outDim: H, accumulate: true }, 'gemm_down');
        if (hp) this.op('mlp', 'add', { a: a.residual, b: a.hostOut, out: a.residual, length: rows * H });
      }
      this.releaseLayer(l);
    }
  }

  /**
   * Every decoder layer as one op (a decode step): the arithmetic of forwardFusedLayers, which
   * a backend may run as a single persistent kernel. The residual stream stays in act.residual;
   * act.qkv, act.attn and act.mlpAct are its scratch.
   */
  private forwardStack(rows: number, embed?: { table: DeviceBuffer; ids: DeviceBuffer }): void {
    const s = this.spec;
    const a = this.act;
    const m = this.meta;
    const pager = this.weights.pager;
    for (const [i, run] of this.stack!.entries()) {
      if (run.split) {
        this.fusedLayer(run.layer!, rows);
        continue;
      }
      if (run.streamed !== undefined) pager!.acquire(run.streamed, this.stream);
      // Never profiled (forward takes the per-layer path then), so the bucket is nominal.
      this.op('projection', 'decoder_layers', {
        x: a.residual,
        qkv: a.qkv,
        attn: a.attn,
        mlp: a.mlpAct,
        positions: m.positions,
        slots: m.slots,
        blockTables: m.blockTables,
        rowSeq: m.rowSeq,
        invFreq: this.weights.invFreq,
        layers: run.layers,
        rows,
        hidden: s.hiddenSize,
        numHeads: s.numHeads,
        numKvHeads: s.numKvHeads,
        headDim: s.headDim,
        intermediate: s.intermediateSize,
        blockSize: this.limits.blockSize,
        maxBlocksPerSeq: this.limits.maxBlocksPerSeq,
        eps: s.rmsNormEps,
        scale: 1 / Math.sqrt(s.headDim),
        ...(this.decodeKeyBound > 0 ? { maxKeys: this.decodeKeyBound } : {}),
        ...(i === 0 && embed ? { embed } : {}),
      });
      if (run.streamed !== undefined) pager!.release(run.streamed, this.stream);
    }
  }

  /** The sparse MLP of a layer: act.normed -> act.mlpOut. */
  private moeMlp(rows: number, lw: LayerWeights): void {
    const s = this.spec;
    const moe = s.moe!;
    const a = this.act;
    const H = s.hiddenSize;
    this.op('mlp', 'matmul', { x: a.normed, weight: lw.router!, out: a.routerLogits, rows, inDim: H, outDim: moe.numExperts }, 'gemm_router');
    this.op('mlp', 'moe_route', {
      logits: a.routerLogits,
      topIds: a.topIds,
      topWeights: a.topW,
      rows,
      numExperts: moe.numExperts,
      topK: moe.topK,
      normalize: moe.normTopkProb,
    });
    this.op('mlp', 'moe_mlp', {
      x: a.normed,
      topIds: a.topIds,
      topWeights: a.topW,
      gateUp: lw.expertsGateUp!,
      down: lw.expertsDown!,
      out: a.mlpOut,
      rows,
      hidden: H,
      inter: moe.moeIntermediateSize,
      topK: moe.topK,
    });
  }

  /** Sample one token per logit row on the device into `out` and push them into the token ring. */
  sampleOnDevice(nLogits: number, out: DeviceBuffer): void {
    const m = this.meta;
    this.op('sampling', 'sample', this.sampleArgs(nLogits, out));
    this.op('sampling', 'ring_push', { src: out, ring: m.ring, cursor: m.ringCursor, rows: nLogits, capacity: this.limits.ringCapacity });
  }

  /** The device-side end of a decode step: next positions and KV slots for every row. */
  advance(rows: number): void {
    this.op('sampling', 'advance_positions', { ...this.advanceArgs(), rows });
  }

  /**
   * A captured decode step's tail: sampleOnDevice then advance, as op sample's push and advance
   * where the backend folds them (capabilities.sampleStepTail: one kernel for a row on CUDA).
   */
  sampleStep(rows: number, out: DeviceBuffer): void {
    if (this.backend.capabilities.sampleStepTail !== true) {
      this.sampleOnDevice(rows, out);
      this.advance(rows);
      return;
    }
    const m = this.meta;
    this.op('sampling', 'sample', {
      ...this.sampleArgs(rows, out),
      push: { ring: m.ring, cursor: m.ringCursor, capacity: this.limits.ringCapacity },
      advance: this.advanceArgs(),
    });
  }

  private sampleArgs(rows: number, out: DeviceBuffer) {
    const m = this.meta;
    const limit = this.sampleLimit < this.spec.vocabSize ? { limit: this.sampleLimit } : {};
    return { logits: this.logits, params: m.sampleParams, rng: m.rng, out, rows, vocab: this.spec.vocabSize, ...limit };
  }

  private advanceArgs() {
    const m = this.meta;
    return { positions: m.positions, slots: m.slots, blockTables: m.blockTables, rowSeq: m.rowSeq, blockSize: this.limits.blockSize, maxBlocksPerSeq: this.limits.maxBlocksPerSeq };
  }

  dispose(): void {
    if (this.sideStream) this.backend.destroyStream(this.sideStream);
    if (this.linkStream) this.backend.destroyStream(this.linkStream);
    for (const e of [...this.staged, ...this.stageFree, ...(this.linkFork ? [this.linkFork] : [])]) this.backend.destroyEvent(e);
    this.linkStream = this.linkFork = undefined;
    this.staged = [];
    this.stageFree = [];
    if (this.forkEv) this.backend.destroyEvent(this.forkEv);
    if (this.joinEv) this.backend.destroyEvent(this.joinEv);
    this.sideStream = this.forkEv = this.joinEv = undefined;
    for (const b of this.owned) this.backend.free(b);
    this.owned.length = 0;
    for (const e of this.events) this.backend.destroyEvent(e);
    this.events.length = 0;
  }
}
