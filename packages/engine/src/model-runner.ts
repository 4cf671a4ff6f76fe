import { type DeviceBackend, type DeviceBuffer, isQuantDType, type StreamHandle } from '@nerva/core';
import type { ModelSpec } from '@nerva/models';
import { isMoeLayer } from '@nerva/models';
import type { LayerWeights, ModelWeights } from './model-weights.js';
import { FUSED_MAX_ROWS, type RunnerLimits, type RunnerStage } from './runner-base.js';
import { AttentionRunner } from './tiered-attention.js';

export * from './runner-base.js';

/**
 * The decoder forward pass expressed over the backend contract: one batched, paged pass for
 * any mix of prefill chunks and decode rows. Every buffer is allocated here, before the hot
 * path; `forward` itself never allocates, so it can be captured as a graph and replayed.
 */export class ModelRunner extends AttentionRunner {
  /**
   * Op decoder_layers' maxKeys: an upper bound on every decode row's keys while a pass (or a graph
   * captured with it) runs, 0 when none is known. Set by the engine around a decode capture.
   */
  decodeKeyBound = 0;
  /** Op decoder_layers' minKeys: a lower bound on every decode row's keys, likewise (0: none). */
  decodeKeyFloor = 0;

  /**
   * Calibration hook: called with l and rows at the start of each decoder layer of an unfused
   * pass, and with l = the end layer after the last, when the stream is complete in `hidden`.
   * Reads there synchronize: calibration only.
   */
  layerProbe: ((l: number, rows: number) => void) | undefined;
  /** Weight bytes of host slices enqueued through op mlp_slice (computed near the data). */
  hostComputeBytes = 0;
  /** Weight bytes of host slices read in place by the device (prefill passes). */
  hostReadBytes = 0;

  constructor(backend: DeviceBackend, spec: ModelSpec, weights: ModelWeights, limits: RunnerLimits, stage?: RunnerStage) {
    super(backend, spec, weights, limits, stage);
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
  /** Ids sampled on the device are below this (the tokenizer's id space; default the vocab). */
  sampleLimit = Number.POSITIVE_INFINITY;
  /** Token masks of the next device sampling (op sample's mask: constrained decoding); set per step by the context. */
  sampleMask: { bits: DeviceBuffer; index: DeviceBuffer; words: number } | undefined = undefined;

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
      this.first && wholeStack && this.backend.capabilities.opFields?.decoder_layers?.includes('embed') === true && this.stack![0]?.split !== true
        ? { table: this.need(w.embed, 'embedding'), ids: m.ids }
        : undefined;
    if (this.first && !embed) this.op('embedding', 'embedding', { table: this.need(w.embed, 'embedding'), ids: m.ids, out: a.residual, rows, hidden: H });
    // A batch-invariant backend computes a fused_matmul row the same way at any row count; op
    // matmul may pick its GEMM by the row count, so a prompt chunk in a step of several prompts
    // would not get its bits alone: every pass takes the fused layers there.
    const bi = this.backend.capabilities.batchInvariant === true;
    if (wholeStack || ((rows <= FUSED_MAX_ROWS || bi) && this.fusedOps)) {
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
    // The projections' inputs in bf16 (see bf16Act): a bf16 x is for more than 8 rows over float
    // weights (a block-quantized weight reads f32 activations and rounds them itself).
    const bfa = this.bf16Act && rows > FUSED_MAX_ROWS;
    const bf16In = (...ws: (DeviceBuffer | undefined)[]) => bfa && ws.every((w) => w === undefined || !isQuantDType(w.dtype));
    for (let l = this.firstLayer; l < this.endLayer; l++) {
      this.layerProbe?.(l, rows);
      const lw = this.acquireLayer(l);
      const normed = bf16In(lw.qkv, lw.qkvTail) ? a.normedBf16 : a.normed;
      // The residual stream is complete between sublayers: the o and down projections add into it
      // (matmul's accumulate), so the norms read it alone.
      this.op('norm', 'rmsnorm', { x: a.residual, weight: lw.attnNorm, out: normed, rows, dim: H, eps });
      this.op('projection', 'matmul', { x: normed, weight: lw.qkv, ...this.qkvTail(lw), bias: lw.qkvBias, out: a.qkv, rows, inDim: H, outDim: qkvOut }, 'gemm_qkv');
      this.ropeAppend(l, lw, rows);
      this.attend(l, rows);
      this.op('projection', 'matmul', { x: a.attn, weight: lw.o, bias: lw.oBias, out: a.residual, rows, inDim: nq * hd, outDim: H, accumulate: true }, 'gemm_o');
      const mlpNormed = bf16In(lw.gateUp) ? a.normedBf16 : a.normed;
      const mlpAct = bf16In(lw.down) ? a.mlpActBf16 : a.mlpAct;
      this.op('norm', 'rmsnorm', { x: a.residual, weight: lw.mlpNorm, out: mlpNormed, rows, dim: H, eps });
      if (s.moe && isMoeLayer(s, l)) {
        this.moeMlp(rows, lw);
        this.op('mlp', 'add', { a: a.residual, b: a.mlpOut, out: a.residual, length: rows * H }, 'residual_add');
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
        this.op('mlp', 'matmul', { x: mlpNormed, weight: lw.gateUp!, out: a.gateUp, rows, inDim: H, outDim: 2 * I }, 'gemm_gate_up');
        this.op('mlp', 'silu_mul', { x: a.gateUp, out: mlpAct, rows, dim: I });
        this.op('mlp', 'matmul', { x: mlpAct, weight: lw.down!, out: a.residual, rows, inDim: I, outDim: H, accumulate: true }, 'gemm_down');
        // The host slice's sum after the device's, as the fused layers add them.
        if (hp) this.op('mlp', 'add', { a: a.residual, b: a.hostOut, out: a.residual, length: rows * H });
      }
      this.releaseLayer(l);
    }
    this.layerProbe?.(this.endLayer, rows);
    // The stream is complete here, a later stage's input as it is.
    if (head) {
      this.op('norm', 'rmsnorm', { x: a.residual, weight: this.need(w.finalNorm, 'final norm'), out: a.normed, rows, dim: H, eps });
      this.lmHead(nLogits);
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

  /**
   * After a pass: the final norm of the first `rows` rows of the residual stream into act.normed,
   * which is returned ([rows, hidden]). Every forward path leaves the complete stream in
   * act.residual, and this is the norm the LM head reads (embeddings: the states whose logits
   * those are). The pass is done with act.normed by then.
   */
  finalHidden(rows: number): DeviceBuffer {
    this.stream = undefined;
    const H = this.spec.hiddenSize;
    this.op('norm', 'rmsnorm', { x: this.act.residual, weight: this.need(this.weights.finalNorm, 'final norm'), out: this.act.normed, rows, dim: H, eps: this.spec.rmsNormEps });
    return this.act.normed;
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

  /**
   * QK-norm, RoPE and the KV append of layer l's rows of act.qkv: op rope_append where the runner
   * fuses ops, else the three ops it stands for (the same arithmetic).
   */
  protected ropeAppend(l: number, lw: LayerWeights, rows: number): void {
    const s = this.spec;
    const a = this.act;
    const m = this.meta;
    const nq = s.numHeads;
    const nkv = s.numKvHeads;
    const hd = s.headDim;
    const rowStride = this.qkvOut;
    const eps = s.rmsNormEps;
    const invFreq = this.weights.invFreq;
    if (this.fusedOps) {
      this.op('attention', 'rope_append', {
        qkv: a.qkv,
        positions: m.positions,
        invFreq,
        slots: m.slots,
        kCache: this.kCache[l],
        vCache: this.vCache[l],
        rows,
        numHeads: nq,
        numKvHeads: nkv,
        headDim: hd,
        rowStride,
        qNorm: lw.qNorm,
        kNorm: lw.kNorm,
        eps,
      });
      return;
    }
    const rope = { x: a.qkv, positions: m.positions, invFreq, rows, headDim: hd, rowStride, eps };
    this.op('attention', 'rope', { ...rope, numHeads: nq, headOffset: 0, normWeight: lw.qNorm });
    this.op('attention', 'rope', { ...rope, numHeads: nkv, headOffset: nq * hd, normWeight: lw.kNorm });
    const kv = { src: a.qkv, kCache: this.kCache[l], vCache: this.vCache[l], slots: m.slots, rows, numKvHeads: nkv, headDim: hd, rowStride };
    this.op('attention', 'kv_append', { ...kv, kOffset: nq * hd, vOffset: (nq + nkv) * hd });
  }

  /** A layer's v rows apart (see LayerWeights.qkvTail), as the qkv projection's weightTail. */
  protected qkvTail(lw: LayerWeights): { weightTail?: DeviceBuffer; tailFrom?: number } {
    return lw.qkvTail ? { weightTail: lw.qkvTail, tailFrom: (this.spec.numHeads + this.spec.numKvHeads) * this.spec.headDim } : {};
  }

  /** One decoder layer as fused ops (see forwardFusedLayers), its weights acquired and released. */
  private fusedLayer(l: number, rows: number): void {
    const s = this.spec;
    const w = this.weights;
    const a = this.act;
    const H = s.hiddenSize;
    const hd = s.headDim;
    const nq = s.numHeads;
    const qkvOut = this.qkvOut;
    const eps = s.rmsNormEps;
    {
      const lw = this.acquireLayer(l);
      // The input RMSNorm is folded into the GEMV (the backend normalizes the row once per block).
      this.op('projection', 'fused_matmul', {
        x: a.residual,
        weight: lw.qkv,
        ...this.qkvTail(lw),
        bias: lw.qkvBias,
        out: a.qkv,
        rows,
        inDim: H,
        outDim: qkvOut,
        normWeight: lw.attnNorm,
        eps,
      }, 'gemm_qkv');
      this.ropeAppend(l, lw, rows);
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
   * a backend may run fused across layers. The residual stream stays in act.residual;
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
        ...(this.decodeKeyFloor > 0 ? { minKeys: this.decodeKeyFloor } : {}),
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
   * where the backend folds them (capabilities.opFields.sample lists push and advance: one kernel for a row on CUDA).
   */
  sampleStep(rows: number, out: DeviceBuffer): void {
    if (this.backend.capabilities.opFields?.sample?.includes('push') !== true) {
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
    const mask = this.sampleMask ? { mask: this.sampleMask } : {};
    return { logits: this.logits, params: m.sampleParams, rng: m.rng, out, rows, vocab: this.spec.vocabSize, ...limit, ...mask };
  }

  private advanceArgs() {
    const m = this.meta;
    return { positions: m.positions, slots: m.slots, blockTables: m.blockTables, rowSeq: m.rowSeq, blockSize: this.limits.blockSize, maxBlocksPerSeq: this.limits.maxBlocksPerSeq };
  }
}
