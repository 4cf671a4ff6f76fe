/**
 * One shard of a tensor-parallel group: a ModelRunner built over its shard spec (its q and KV
 * heads, its MLP channels; see shard-weights.ts), whose layers run in parts the group interleaves
 * with its all-gathers (tensor-parallel.ts). Every op is the op one device runs, with the same
 * arguments but the output rows narrowed to the shard's slice:
 *
 * - the residual stream is whole on every shard, and every op that reads it whole (the norms,
 *   the norm folded into the qkv / gate_up / LM head projections) computes the same floats on
 *   each shard as on one device;
 * - an output element is one dot product over the whole input, by one shard, in the backend's
 *   reduction order for that element; the CPU backend's order does not depend on the output
 *   count (float64 accumulation along inDim), so a narrower projection gives the same bits.
 *
 * Which path a pass takes (fused decode ops or the per-layer ops) is decided as ModelRunner
 * decides it, so a shard runs the float order of the path one device would run.
 */
import type { DeviceBackend, DeviceBuffer } from '@nerva/core';
import type { ModelSpec } from '@nerva/models';
import { ModelRunner, FUSED_MAX_ROWS, type RunnerLimits, type RunnerStage } from '../model-runner.js';
import type { ModelWeights } from '../model-weights.js';
import { copyColumns } from './all-gather.js';
import type { ShardGeometry } from './shard-weights.js';

export class ShardRunner extends ModelRunner {
  /** Every head's attention output [maxRows, numHeads * headDim] (gathered): the o projection's input. */
  readonly attnFull: DeviceBuffer;
  /** Every MLP channel's activation [maxRows, intermediate] (gathered): the down projection's input. */
  readonly mlpFull: DeviceBuffer;
  /** This shard's output rows of o / down ([maxRows, hidden width]) and of the LM head ([maxSeqs, vocab width]). */
  readonly hiddenPart: DeviceBuffer;
  readonly headPart: DeviceBuffer;

  constructor(
    backend: DeviceBackend,
    /** The whole model's spec (the shard spec is derived from it and `geometry`). */
    readonly full: ModelSpec,
    shard: ModelSpec,
    weights: ModelWeights,
    limits: RunnerLimits,
    readonly geometry: ShardGeometry,
    /** Its layers when the group is one pipeline stage of several (default: every layer). */
    stage?: RunnerStage,
  ) {
    super(backend, shard, weights, limits, stage);
    const f32 = (length: number, label: string) => this.own(backend.alloc({ dtype: 'f32', length, usage: 'activations', label: `tp${geometry.index}.${label}` }));
    try {
      this.attnFull = f32(limits.maxRows * full.numHeads * full.headDim, 'attn_full');
      this.mlpFull = f32(limits.maxRows * full.intermediateSize, 'mlp_full');
      this.hiddenPart = f32(limits.maxRows * geometry.hidden.width, 'hidden_part');
      this.headPart = f32(limits.maxSeqs * geometry.vocab.width, 'head_part');
      // The per-layer path's gathered o and MLP outputs, added to the stream after the gathers
      // (one device adds them inside its projections; a sparse MLP's sum has a buffer already).
      this.act.o = f32(limits.maxRows * full.hiddenSize, 'o');
      this.act.mlpOut ??= f32(limits.maxRows * full.hiddenSize, 'mlp_out');
    } catch (e) {
      this.dispose();
      throw e;
    }
  }

  /** The shard's attention output [rows, its heads * headDim]. */
  get attnPart(): DeviceBuffer {
    return this.act.attn;
  }

  /** The shard's MLP activation [rows, its channels]. */
  get mlpPart(): DeviceBuffer {
    return this.act.mlpAct;
  }

  /** The per-layer path's o output ([rows, hidden], gathered). */
  get oFull(): DeviceBuffer {
    return this.act.o;
  }

  /** The per-layer path's MLP output ([rows, hidden], gathered), not yet added to `hidden`. */
  get mlpOut(): DeviceBuffer {
    return this.act.mlpOut;
  }

  /**
   * Whether a pass of `rows` rows and `nLogits` logits runs the fused decode ops, as
   * ModelRunner.forward decides (op decoder_layers is the fused ops in one op, so a shard runs
   * them one by one: the same floats). `stackable`: whether one device would have the stack op.
   */
  fusedPass(rows: number, nLogits: number, stackable = this.stackable): boolean {
    const wholeStack = stackable && nLogits === rows && !this.repeatedLogitRows && !this.profiling;
    return wholeStack || (rows <= FUSED_MAX_ROWS && this.fusedOps);
  }

  /** Whether this runner's layers could run as op decoder_layers (a group with stages asks every stage: one device has the whole stack or none). */
  get stackable(): boolean {
    return this.stack !== undefined;
  }

  /** The embedding of the pass's ids into the (replicated) residual stream. */
  embed(rows: number): void {
    this.op('embedding', 'embedding', { table: this.need(this.weights.embed, 'embedding'), ids: this.meta.ids, out: this.act.residual, rows, hidden: this.full.hiddenSize });
  }

  /** Layer l up to attention: the shard's q/k/v heads, its KV cache slice appended, its heads attended -> attnPart. */
  attention(l: number, rows: number, fused: boolean): void {
    const s = this.spec;
    const a = this.act;
    const lw = this.weights.layers[l]!;
    const H = s.hiddenSize;
    const eps = s.rmsNormEps;
    const qkvOut = this.qkvOut;
    if (fused) {
      // The input norm folded into the qkv projection: each shard normalizes the whole row itself.
      this.op('projection', 'fused_matmul', { x: a.residual, weight: lw.qkv, ...this.qkvTail(lw), bias: lw.qkvBias, out: a.qkv, rows, inDim: H, outDim: qkvOut, normWeight: lw.attnNorm, eps }, 'gemm_qkv');
    } else {
      // Float32 normed input: one device's bf16 activations (matmulPrecision 'bf16') are the same
      // values the matmul would round to itself, so the shards skip them.
      // The first layer of a runner finds the residual stream complete (embedding, or a stage's handoff).
      if (l === this.firstLayer) this.op('norm', 'rmsnorm', { x: a.residual, weight: lw.attnNorm, out: a.normed, rows, dim: H, eps });
      else this.op('norm', 'rmsnorm', { x: a.mlpOut, residual: a.residual, weight: lw.attnNorm, out: a.normed, rows, dim: H, eps });
      this.op('projection', 'matmul', { x: a.normed, weight: lw.qkv, ...this.qkvTail(lw), bias: lw.qkvBias, out: a.qkv, rows, inDim: H, outDim: qkvOut }, 'gemm_qkv');
    }
    this.ropeAppend(l, lw, rows);
    this.attend(l, rows);
  }

  /**
   * The o projection's rows of this shard over every head's output (attnFull) -> hiddenPart.
   * Fused: the op accumulates into the stream (out = R(out + R(dot))); the shard first copies
   * its columns of the residual into hiddenPart so the accumulate adds to the very floats one
   * device adds to, in the same order, and the gather puts the sums back into the stream.
   */
  oProjection(l: number, rows: number, fused: boolean): void {
    const lw = this.weights.layers[l]!;
    const f = this.full;
    const g = this.geometry.hidden;
    if (fused) copyColumns(this.backend, this.hiddenPart, this.act.residual, rows, f.hiddenSize, g.offset, g.width, true);
    this.op('projection', fused ? 'fused_matmul' : 'matmul', {
      x: this.attnFull,
      weight: lw.o,
      bias: lw.oBias,
      out: this.hiddenPart,
      rows,
      inDim: f.numHeads * f.headDim,
      outDim: g.width,
      ...(fused ? { accumulate: true } : {}),
    }, 'gemm_o');
  }

  /** gate_up of this shard's channels and SiLU-GLU -> mlpPart (after the o output is in the stream). */
  gateUp(l: number, rows: number, fused: boolean): void {
    const lw = this.weights.layers[l]!;
    const a = this.act;
    const H = this.full.hiddenSize;
    const I = this.spec.intermediateSize;
    const eps = this.spec.rmsNormEps;
    if (fused) {
      // Norm and SiLU-GLU folded into the projection, gate j and up j of the same channel here.
      this.op('mlp', 'fused_matmul', { x: a.residual, weight: lw.gateUp!, out: a.mlpAct, rows, inDim: H, outDim: I, normWeight: lw.mlpNorm, eps, glu: true }, 'gemm_gate_up');
      return;
    }
    // The residual add of the o output happens here on the whole row (op rmsnorm's residual), as on one device.
    this.op('norm', 'rmsnorm', { x: a.o, residual: a.residual, weight: lw.mlpNorm, out: a.normed, rows, dim: H, eps });
    this.op('mlp', 'matmul', { x: a.normed, weight: lw.gateUp!, out: a.gateUp, rows, inDim: H, outDim: 2 * I }, 'gemm_gate_up');
    this.op('mlp', 'silu_mul', { x: a.gateUp, out: a.mlpAct, rows, dim: I });
  }

  /** The down projection's rows of this shard over every channel (mlpFull) -> hiddenPart (accumulated into the stream's copy when fused, as oProjection). */
  down(l: number, rows: number, fused: boolean): void {
    const lw = this.weights.layers[l]!;
    const f = this.full;
    const g = this.geometry.hidden;
    if (fused) copyColumns(this.backend, this.hiddenPart, this.act.residual, rows, f.hiddenSize, g.offset, g.width, true);
    this.op('mlp', fused ? 'fused_matmul' : 'matmul', {
      x: this.mlpFull,
      weight: lw.down!,
      out: this.hiddenPart,
      rows,
      inDim: f.intermediateSize,
      outDim: g.width,
      ...(fused ? { accumulate: true } : {}),
    }, 'gemm_down');
  }

  /**
   * The end of a stage that hands its rows to the next: the per-layer path leaves the last MLP
   * output beside the stream, so it is added here, as the next layer's norm would add it (the
   * same float32 sum, as ModelRunner does at a stage's end); the fused path's stream is complete.
   */
  finishStage(rows: number, fused: boolean): void {
    if (!fused) this.op('mlp', 'add', { a: this.act.residual, b: this.act.mlpOut, out: this.act.residual, length: rows * this.full.hiddenSize }, 'residual_add');
  }

  /**
   * The final norm and this shard's vocabulary rows of the LM head -> headPart ([nLogits, vocab
   * width]), with the op one device uses for the same pass (the norm folded in for a batch of
   * decode rows; gather_rows then matmul, or fused_matmul on a batch-invariant backend).
   */
  headSlice(rows: number, nLogits: number, fused: boolean): void {
    const a = this.act;
    const f = this.full;
    const H = f.hiddenSize;
    const eps = f.rmsNormEps;
    const w = this.weights;
    const V = this.geometry.vocab.width;
    const lmHead = this.need(w.lmHead, 'LM head');
    const finalNorm = this.need(w.finalNorm, 'final norm');
    if (fused && nLogits === rows && !this.repeatedLogitRows) {
      this.op('lm_head', 'fused_matmul', { x: a.residual, weight: lmHead, out: this.headPart, rows, inDim: H, outDim: V, normWeight: finalNorm, eps }, 'lm_head');
      return;
    }
    if (fused) this.op('norm', 'rmsnorm', { x: a.residual, weight: finalNorm, out: a.normed, rows, dim: H, eps });
    else this.op('norm', 'rmsnorm', { x: a.mlpOut, residual: a.residual, weight: finalNorm, out: a.normed, rows, dim: H, eps });
    this.op('lm_head', 'gather_rows', { x: a.normed, rowIdx: this.meta.logitRows, out: a.last, n: nLogits, dim: H });
    const op = this.backend.capabilities.batchInvariant === true ? 'fused_matmul' : 'matmul';
    this.op('lm_head', op, { x: a.last, weight: lmHead, out: this.headPart, rows: nLogits, inDim: H, outDim: V }, 'lm_head');
  }
}
