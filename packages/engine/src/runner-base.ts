import type { DecoderLayerWeights, DeviceBackend, DeviceBuffer, EventHandle, OpArgs, OpName, StreamHandle, Tier } from '@nerva/core';
import { DTYPE_BYTES } from '@nerva/core';
import type { ModelSpec } from '@nerva/models';
import { layerWindow } from '@nerva/models';
import { type KvCacheDtype, kvDtypeOf, type LayerWeights, layerBlockId, type ModelWeights } from './model-weights.js';

/**
 * Passes of at most this many rows run the fused layer ops (fused_matmul & co., the memory OS's
 * paths); larger ones (prefill) the unfused ops, whose matmuls can use the backend's GEMM. A batch
 * of decode rows (one row per sequence) takes op decoder_layers at any size: its matmuls switch
 * from GEMV to a GEMM with the fusions as an epilogue past 8 rows on CUDA.
 */
export const FUSED_MAX_ROWS = 8;

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
 * What a model runner holds: every buffer of its passes (activations, meta, KV pools, tiered-KV
 * staging), allocated before the hot path, the layers' weights as the ops take them, and the
 * per-op profiling events. The passes themselves are ModelRunner's (model-runner.ts); tiered
 * attention is AttentionRunner's (tiered-attention.ts).
 */
export abstract class RunnerBase {
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
  protected readonly kStage: DeviceBuffer[] = [];
  protected readonly vStage: DeviceBuffer[] = [];
  readonly stageBytes: number = 0;
  /** The stream staged pages are copied on; staged[b]: buffer b holds its layer; stageFree[b]: its layer was attended. */
  protected linkStream: StreamHandle | undefined;
  protected staged: EventHandle[] = [];
  protected stageFree: EventHandle[] = [];
  protected linkFork: EventHandle | undefined;
  /** Tiered KV: the side stream warm partials run on, and the fork/join events. */
  protected sideStream: StreamHandle | undefined;
  protected forkEv: EventHandle | undefined;
  protected joinEv: EventHandle | undefined;
  protected readonly act: Record<string, DeviceBuffer> = {};
  protected readonly owned: DeviceBuffer[] = [];
  protected readonly qkvOut: number;
  /** Profiling: bucket -> accumulated ms, filled from device events. */
  protected profiling = false;
  protected readonly events: EventHandle[] = [];
  protected readonly eventBuckets: ProfileBucket[] = [];
  /** The op class of each bracketed op (its label, else the op's name): takeProfile's finer split. */
  protected readonly eventLabels: string[] = [];
  protected eventCount = 0;
  protected stream: StreamHandle | undefined;
  /** Whether the backend has the fused decode ops (fused_matmul, rope_append). */
  protected readonly fusedOps: boolean;
  /**
   * Matmul precision 'bf16' on a backend with capabilities.activationDtypes including bf16 (dense layers, no host
   * slices): passes of more than 8 rows have the norms before the qkv and gate_up projections and
   * silu_mul write bf16 (act.normedBf16, act.mlpActBf16), which those matmuls read as they are.
   * They round their inputs to bf16 anyway, so the results are the same, without a rounding pass
   * per matmul and with half the bytes written and read.
   */
  protected readonly bf16Act: boolean;
  /**
   * Every layer's weights and caches as op `decoder_layers` takes them, built once; undefined when
   * the backend lacks the op or the model has a sparse (MoE) layer, which the op does not cover.
   */
  protected readonly stack: readonly StackRun[] | undefined;
  /**
   * Sliding window of each decoder layer (indexed by layer; 0 = full attention), passed to op
   * `attention` as `window`: the op masks each row to its last `window` positions, whatever the
   * mix of prefill chunks and decode rows, so chunked prefill and prefix-cache hits need nothing more.
   */
  protected readonly windows: readonly number[];
  /** Decoder layers [firstLayer, endLayer) run here (every layer unless a pipeline stage). */
  readonly firstLayer: number;
  readonly endLayer: number;
  /** Runs the embedding (holds layer 0). */
  readonly first: boolean;
  /** Runs the final norm and the LM head (holds the last layer). */
  readonly last: boolean;

  protected constructor(
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
      this.act.gateUp = f32(maxRows * 2 * inter, 'act.gate_up');
      this.act.mlpAct = f32(maxRows * inter, 'act.mlp');
      // The o and down projections add into the residual stream; only a sparse MLP's sum lands
      // apart first (a tensor-parallel shard allocates its gathered outputs itself).
      if (s.moe) this.act.mlpOut = f32(maxRows * H, 'act.mlp_out');
      this.bf16Act = backend.capabilities.activationDtypes?.includes('bf16') === true && backend.capabilities.matmulPrecision === 'bf16' && !s.moe && !weights.hostParts && maxRows > FUSED_MAX_ROWS;
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
  protected decoderStack(): StackRun[] | undefined {
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
        ...(lw.qkvTail ? { qkvTail: lw.qkvTail } : {}),
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
  protected acquireLayer(l: number): LayerWeights {
    const hot = this.weights.layers[l];
    if (hot) return hot;
    return this.weights.pager!.acquire(layerBlockId(l), this.stream) as unknown as LayerWeights;
  }

  /** The ops of layer l are enqueued: a streamed layer's slot may take the next block. */
  protected releaseLayer(l: number): void {
    if (this.weights.layers[l] === undefined) this.weights.pager!.release(layerBlockId(l), this.stream);
  }

  /** The residual stream [maxRows, hidden]: a stage's output, and a later stage's input. */
  get hidden(): DeviceBuffer {
    return this.act.residual;
  }

  /** A weight only some pipeline stages hold (the embedding, final norm, LM head). */
  protected need(b: DeviceBuffer | undefined, what: string): DeviceBuffer {
    if (b === undefined) throw new RangeError(`this stage (layers ${this.firstLayer}-${this.endLayer - 1}) holds no ${what}`);
    return b;
  }

  protected own(b: DeviceBuffer): DeviceBuffer {
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

  protected op<K extends OpName>(bucket: ProfileBucket, name: K, args: OpArgs<K>, label?: ProfileOpClass): void {
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
