/**
 * The op catalogue: every op the engine may ask of a backend, typed by name.
 *
 * Conventions (every backend keeps them; the CPU backend is the reference):
 * - Shapes are row-major. Matrices of weights are [out, in], as Hugging Face stores Linear.
 * - Scalars that change per decode step (token ids, positions, sequence lengths, slots) live in
 *   buffers, never in attributes, so a captured graph can be replayed with new values.
 * - Attributes (numbers, booleans) are fixed for a captured graph.
 * - Accumulation is at least float32; the declared precision of a backend bounds its error.
 *
 * bf16 numerics (a backend created with numerics 'bf16'): every value an op stores is rounded to
 * bfloat16 (nearest even, through float32) where transformers' bf16 eager forward rounds it, and
 * nowhere else. R(v) below is that rounding; sums and dot products accumulate in float32 or wider.
 * - embedding: R(table row). add: R(a + b). matmul: y = R(x.w + bias); accumulate: out = R(out + y).
 *   rmsnorm: residual = R(residual + x), out = R(R(x * inv) * weight), inv = 1/sqrt(mean(x^2) + eps)
 *   in float32.
 * - fused_matmul: the normalized input as rmsnorm's out; y = R(x.w + bias); glu: g = R(x.wg),
 *   u = R(x.wu), y = R(R(silu(g)) * u); accumulate: out = R(out + y). silu_mul likewise.
 * - rope / rope_append: QK-norm as rmsnorm; c = R(cos a), s = R(sin a) with the float32 angle
 *   a = positions[r] * invFreq[i]; x1' = R(R(x1 c) - R(x2 s)), x2' = R(R(x2 c) + R(x1 s)).
 * - attention: s_p = R(R(q.k_p) * scale) with scale in float32; p = R(softmax_f32(s)_p);
 *   out = R(sum_p p v_p) (eager attention: scores and probabilities are rounded).
 * - moe_route: topWeights = R(probability, renormalized when asked). moe_mlp: per expert in
 *   ascending expert id, y = R(down . R(R(silu(R(g))) * R(u))), acc = R(acc + R(y * weight)).
 * decoder_layers is its composition; argmax, sample and the index ops do not round.
 */
import type { DeviceBuffer } from './backend.js';

type Buf = DeviceBuffer;

/** One dense decoder layer's weights and KV cache, as op `decoder_layers` takes them. */
export interface DecoderLayerWeights {
  /** [hidden] input RMSNorm weight. */
  attnNorm: Buf;
  /**
   * [(numHeads + 2*numKvHeads)*headDim, hidden]: q, k and v projections stacked; with `qkvTail`,
   * only the q and k rows.
   */
  qkv: Buf;
  /**
   * The v rows, [numKvHeads*headDim, hidden], when they are stored apart: a block-quantized v of a
   * different block type than q and k (a Q4_K_M-style mix). As `weightTail` of op fused_matmul.
   */
  qkvTail?: Buf;
  qkvBias?: Buf;
  /** [headDim] per-head RMSNorm weights of q and k (QK-norm), when the model has them. */
  qNorm?: Buf;
  kNorm?: Buf;
  /** [hidden, numHeads*headDim] output projection. */
  o: Buf;
  oBias?: Buf;
  /** [hidden] post-attention RMSNorm weight. */
  mlpNorm: Buf;
  /** [2*intermediate, hidden]: gate rows, then up rows. */
  gateUp: Buf;
  /** [hidden, intermediate]. */
  down: Buf;
  /** This layer's paged cache, [slots, numKvHeads*headDim] each. */
  kCache: Buf;
  vCache: Buf;
}

/**
 * A weight matrix in two buffers: rows [0, tailFrom) in `weight`, rows [tailFrom, outDim) in
 * `weightTail` (its own dtype; row o of the matrix is row o - tailFrom of the tail). Lets a
 * fused projection keep each part in its own block type (a GGUF Q4_K_M stores v as Q6_K beside a
 * Q4_K q and k). Not with glu or weightOffset. Only where capabilities.opFields lists it for the
 * op; such a backend also takes op decoder_layers' `qkvTail`.
 */
export interface WeightTail {
  weightTail?: Buf;
  tailFrom?: number;
}

export interface OpCatalogue {
  /** out[r, :] = table[ids[r], :]. ids: i32[rows]. */
  embedding: { table: Buf; ids: Buf; out: Buf; rows: number; hidden: number };
  /**
   * RMSNorm with optional fused residual add. With `residual`: residual += x (in place; the
   * residual stream), then out = rmsnorm(residual) * weight. Without: out = rmsnorm(x) * weight.
   * `out` may be bf16 on a backend with capabilities.activationDtypes including 'bf16' (values rounded on store).
   */
  rmsnorm: { x: Buf; weight: Buf; out: Buf; rows: number; dim: number; eps: number; residual?: Buf };
  /**
   * out[r, o] = sum_i x[r, i] * weight[weightOffset + o*inDim + i] (+ bias[o]).
   * One op for one row (GEMV) and for many (GEMM); the backend picks the kernel. `x` may be bf16
   * over more than 8 rows of a float weight on a backend with capabilities.activationDtypes
   * including 'bf16' (a block-quantized weight reads f32 x and rounds it itself).
   * With `accumulate`, that value y is added to out in place: out[r, o] = R(out[r, o] + y), the
   * residual stream's update (op rmsnorm's residual add) done by the projection that makes it, so
   * a prompt's residual rows are not written and read once more between the two. (A backend whose
   * y is a sum of float32 products, as a split-bf16 GEMM's hi and lo halves, may add them to out
   * one at a time: the same float32 grade, not the same bits.)
   */
  matmul: { x: Buf; weight: Buf; out: Buf; rows: number; inDim: number; outDim: number; bias?: Buf; weightOffset?: number; accumulate?: boolean } & WeightTail;
  /**
   * In place on `numHeads` heads of size headDim starting at element `headOffset` of each row
   * of x (row stride `rowStride`): optional per-head RMSNorm with `normWeight` [headDim]
   * (QK-norm), then rotary embedding in the rotate-half (NeoX) layout: pairs (i, i + headDim/2)
   * rotated by angle positions[r] * invFreq[i]. positions: i32[rows], invFreq: f32[headDim/2].
   */
  rope: {
    x: Buf;
    positions: Buf;
    invFreq: Buf;
    rows: number;
    numHeads: number;
    headDim: number;
    rowStride: number;
    headOffset: number;
    normWeight?: Buf;
    eps?: number;
  };
  /**
   * Store keys and values of each row into the paged cache. src rows have stride rowStride; the
   * key is at kOffset, the value at vOffset, each numKvHeads*headDim wide. The cache is
   * [slots, numKvHeads*headDim]; slots: i32[rows], a negative slot means padding (skip).
   */
  kv_append: {
    src: Buf;
    kCache: Buf;
    vCache: Buf;
    slots: Buf;
    rows: number;
    numKvHeads: number;
    headDim: number;
    rowStride: number;
    kOffset: number;
    vOffset: number;
  };
  /**
   * Paged causal attention, one mechanism for prefill (many rows per sequence, chunked or not)
   * and decode (one row per sequence). Row r belongs to sequence rowSeq[r] and sits at
   * position positions[r]; it attends to that sequence's positions 0..positions[r] inclusive,
   * whose keys live at slot blockTables[seq*maxBlocksPerSeq + p/blockSize]*blockSize + p%blockSize.
   * q heads are read from q at qOffset with row stride qRowStride; GQA maps head h to KV head
   * floor(h / (numHeads/numKvHeads)). out: [rows, numHeads*headDim].
   */
  attention: {
    q: Buf;
    kCache: Buf;
    vCache: Buf;
    out: Buf;
    blockTables: Buf;
    rowSeq: Buf;
    positions: Buf;
    rows: number;
    numHeads: number;
    numKvHeads: number;
    headDim: number;
    blockSize: number;
    maxBlocksPerSeq: number;
    qRowStride: number;
    qOffset: number;
    scale: number;
    /**
     * Sliding-window attention: when given and > 0, a row at position p attends to positions
     * max(0, p - window + 1)..p only (transformers' sliding mask: key k is seen when p - k < window).
     * Block-table entries of blocks wholly before the window are not read.
     */
    window?: number;
    /**
     * Partial attention (tiered KV: some of a sequence's blocks live in another cache). With `lse`
     * (f32 [rows*numHeads]), a block-table entry < 0 means "this block is not in this cache" and
     * its positions are skipped; `out` is the attention over the positions that remain, normalized
     * over them, and lse[r*numHeads + h] = m + ln(sum_p exp(s_p - m)) of their scaled scores s_p
     * (m their max; -Infinity, with out = 0, when none remain). Two partials over disjoint position
     * sets combine exactly with op `attention_merge`. Exact numerics only: a backend with bf16
     * numerics rejects `lse` (eager bf16 attention rounds probabilities of the whole row).
     */
    lse?: Buf;
    /**
     * A promise of the caller: every row belongs to sequence rowSeq[0] and the rows are in
     * increasing position order (a pass of one prompt chunk). The result is the same; a backend
     * may skip work that only rows of other sequences (decode rows, sequence seams) need, and
     * read the chunk's last position from its last row. Ignored when false or absent.
     */
    oneSequence?: boolean;
    /**
     * Host staging for caches in a host tier on a device backend (compute near data: the host CPU
     * computes over the pages where they lie): qHost f32 [rows, numHeads*headDim] receives the q
     * heads, outHost (same shape) and lseHost (f32 [rows*numHeads]) the result before it is copied
     * to `out` and `lse`. Given once, so the op allocates nothing. A backend whose compute tier is
     * host memory ignores them. Without them, a device backend attends over a cache in mapped host
     * memory itself, reading the pages through the mapping.
     */
    qHost?: Buf;
    outHost?: Buf;
    lseHost?: Buf;
  };
  /**
   * Combine two partial attentions over disjoint key sets (op `attention` with `lse`), in place:
   * for each row r and head h, M = max(lse, otherLse), wa = exp(lse - M), wb = exp(otherLse - M),
   * out = (out * wa + other * wb) / (wa + wb) and lse = M + ln(wa + wb); when both are -Infinity
   * out = 0 and lse stays -Infinity. The online-softmax rule: merging the partials of a split of a
   * row's positions gives the attention over all of them, up to float rounding.
   * out, other: f32 [rows, numHeads*headDim]; lse, otherLse: f32 [rows*numHeads].
   */
  attention_merge: { out: Buf; lse: Buf; other: Buf; otherLse: Buf; rows: number; numHeads: number; headDim: number };
  /**
   * A matmul with its neighbours fused in: y[r, j] = sum_i in[r, i] * weight[j*inDim + i]
   * (+ bias[j]), where in[r, :] = rmsnorm(x[r, :]) * normWeight (float32, as op `rmsnorm` without
   * residual) when normWeight is given, x[r, :] otherwise. Then
   * - with `glu`, weight holds 2*outDim rows (gate rows, then up rows) and
   *   out[r, o] = silu(y[r, o]) * y[r, outDim + o] (y rounded to float32 first, as op `silu_mul`
   *   on the matmul output); bias is not allowed with glu;
   * - otherwise out[r, o] = y[r, o].
   * With `accumulate` the float32 result is added to out in place (out += ...): the residual
   * stream update of op `rmsnorm`'s `residual`, fused into the projection.
   * Lets a decoder layer run as 6 kernels instead of 12.
   */
  fused_matmul: {
    x: Buf;
    weight: Buf;
    out: Buf;
    rows: number;
    inDim: number;
    outDim: number;
    bias?: Buf;
    normWeight?: Buf;
    eps?: number;
    glu?: boolean;
    accumulate?: boolean;
  } & WeightTail;
  /**
   * Op `rope` over the q heads (at 0, with qNorm) and the k heads (at numHeads*headDim, with
   * kNorm) of a packed qkv row [q | k | v] of stride rowStride, in place, then op `kv_append` of
   * the rotated keys and the values (at (numHeads+numKvHeads)*headDim) at `slots`.
   */
  rope_append: {
    qkv: Buf;
    positions: Buf;
    invFreq: Buf;
    slots: Buf;
    kCache: Buf;
    vCache: Buf;
    rows: number;
    numHeads: number;
    numKvHeads: number;
    headDim: number;
    rowStride: number;
    qNorm?: Buf;
    kNorm?: Buf;
    eps?: number;
  };
  /**
   * A whole stack of dense decoder layers over the residual stream `x` [rows, hidden], in place:
   * for each entry of `layers`, in order, exactly
   *   fused_matmul(x -> qkv, weight qkv, bias qkvBias, normWeight attnNorm, eps)
   *   rope_append(qkv, qNorm, kNorm, eps; keys and values to kCache/vCache at `slots`)
   *   attention(q heads of qkv -> attn, scale)
   *   fused_matmul(attn -> x, weight o, bias oBias, accumulate)
   *   fused_matmul(x -> mlp, weight gateUp, normWeight mlpNorm, eps, glu)
   *   fused_matmul(mlp -> x, weight down, accumulate)
   * with qkv [rows, (numHeads + 2*numKvHeads)*headDim], attn [rows, numHeads*headDim] and
   * mlp [rows, intermediate] as scratch (their contents afterwards are unspecified).
   * Precondition: every row belongs to a different sequence (decode rows). A row does not see
   * keys that other rows of the same call append, so rows of one sequence's prefill must use the
   * per-layer ops. Lets a backend run the decoder as one persistent kernel per step.
   */
  decoder_layers: {
    x: Buf;
    qkv: Buf;
    attn: Buf;
    mlp: Buf;
    positions: Buf;
    slots: Buf;
    blockTables: Buf;
    rowSeq: Buf;
    invFreq: Buf;
    layers: readonly DecoderLayerWeights[];
    rows: number;
    hidden: number;
    numHeads: number;
    numKvHeads: number;
    headDim: number;
    intermediate: number;
    blockSize: number;
    maxBlocksPerSeq: number;
    eps: number;
    scale: number;
    /**
     * An upper bound on every row's keys (its position + 1) for as long as this call runs, a
     * captured graph's replays included; 0 or absent: none known. A backend may choose its
     * attention kernel by it (see capabilities.shortContextKeys); within exact numerics the
     * results are the same either way.
     */
    maxKeys?: number;
    /**
     * A lower bound on every row's keys for as long as this call runs (keys only grow while a
     * row decodes); 0 or absent: none known. A backend may choose its attention kernel by it
     * (see capabilities.longContextKeys); within exact numerics the results agree either way.
     */
    minKeys?: number;
    /**
     * The residual rows come from an embedding table first: x[r] = table[ids[r]] (op `embedding`
     * into x, then the layers). A backend may fold the gather into the first layer's kernels (the
     * step's first kernel less on a decode step); x holds the embedded rows' results either way.
     * Only where capabilities.opFields lists it (decoder_layers: ['embed']).
     */
    embed?: { table: Buf; ids: Buf };
  };
  /**
   * out[r, i] = silu(x[r, i]) * x[r, dim + i]; x is [rows, 2*dim] (gate then up). `out` may be
   * bf16 on a backend with capabilities.activationDtypes including 'bf16' (values rounded on store).
   */
  silu_mul: { x: Buf; out: Buf; rows: number; dim: number };
  /** out = a + b, elementwise over `length`. */
  add: { a: Buf; b: Buf; out: Buf; length: number };
  /**
   * out[i, :] = x[rowIdx[i], :]; a negative rowIdx[i] leaves out[i, :] as it is (so a captured
   * pass can gather a varying number of rows into fixed capacity). rowIdx: i32[n]. out has x's
   * dtype (or f32). On a device backend x may lie in mapped host memory: the rows cross the link.
   */
  gather_rows: { x: Buf; rowIdx: Buf; out: Buf; n: number; dim: number };
  /**
   * Router: softmax over the experts of each row (float32), the topK largest (ties: lower
   * index), renormalized to sum 1 when `normalize`. topIds: i32[rows*topK], topWeights: f32.
   */
  moe_route: { logits: Buf; topIds: Buf; topWeights: Buf; rows: number; numExperts: number; topK: number; normalize: boolean };
  /**
   * Sparse MLP: out[r] = sum_k topWeights[r,k] * down_e(silu(gate_e x[r]) * up_e x[r]) with
   * e = topIds[r,k]. gateUp: [numExperts, 2*inter, hidden] (gate rows then up rows);
   * down: [numExperts, hidden, inter].
   */
  moe_mlp: {
    x: Buf;
    topIds: Buf;
    topWeights: Buf;
    gateUp: Buf;
    down: Buf;
    out: Buf;
    rows: number;
    hidden: number;
    inter: number;
    topK: number;
  };
  /**
   * A slice of a dense MLP, from the residual stream (compute near data: the weights may live in
   * a host tier, and a GPU backend then computes it on the host CPU, stream-ordered):
   * n = rmsnorm(x[r, :]) * normWeight (as op `rmsnorm` without residual),
   * a[j] = silu(gate[j] . n) * (up[j] . n) for j < inter (as `fused_matmul` with glu), and
   * out[r, h] = sum_j down[h*inter + j] * a[j] (written, not accumulated).
   * gateUp: [2*inter, hidden] (inter gate rows, then inter up rows); down: [hidden, inter];
   * bf16 on every backend (a backend may also take f32: the CPU reference does).
   * The caller adds `out` into the residual stream. `xHost` and `yHost` ([rows, hidden] f32 in a
   * host tier) are staging a backend may need to move x to the weights and the result back;
   * given once, so the op allocates nothing.
   */
  mlp_slice: {
    x: Buf;
    normWeight: Buf;
    gateUp: Buf;
    down: Buf;
    out: Buf;
    rows: number;
    hidden: number;
    inter: number;
    eps: number;
    xHost?: Buf;
    yHost?: Buf;
  };
  /** out[r] = argmax over logits[r, :] (lowest index on ties). out: i32[rows]. */
  argmax: { logits: Buf; out: Buf; rows: number; vocab: number };
  /**
   * Stochastic sampling, identical on every backend given the same logits (see `sampleRow` in
   * core for the exact algorithm). params: f32[rows*4] = temperature, topK (0 = off), topP,
   * minP. rng: i32[rows*2] = seed, counter; the op draws uniformFromSeed(seed, counter) and then
   * increments counter, on the device. out: i32[rows].
   */
  sample: {
    logits: Buf;
    params: Buf;
    rng: Buf;
    out: Buf;
    rows: number;
    vocab: number;
    /**
     * Sample only ids below `limit` (default `vocab`; `vocab` stays the row stride): a checkpoint
     * whose embedding rows outnumber its tokenizer's ids never yields an id without a token.
     */
    limit?: number;
    /**
     * Token masks (constrained decoding): row r with `index[r] >= 0` may sample id t only where
     * bit (t & 31) of `bits[index[r] * words + (t >> 5)]` is set; the other ids count as logit
     * -infinity (the masked rule is sampleRow over the allowed ids alone). `index[r] < 0`: the row is
     * unmasked. bits: i32[masks * words], index: i32[rows], words >= ceil(limit / 32). A masked
     * row that allows no id below `limit` is an error. The logits are not modified. Only where
     * capabilities.opFields lists it (sample: ['mask']).
     */
    mask?: { bits: Buf; index: Buf; words: number };
    /**
     * Then push `out` into the token ring (op ring_push with src = out over these rows). Only
     * where capabilities.opFields lists it (sample: ['push', 'advance']).
     */
    push?: { ring: Buf; cursor: Buf; capacity: number };
    /**
     * Then advance the step (op advance_positions over these rows): a decode step's tail in one
     * op, so a backend may run it as one kernel. Only where capabilities.opFields lists it (sample: ['push', 'advance']).
     */
    advance?: { positions: Buf; slots: Buf; blockTables: Buf; rowSeq: Buf; blockSize: number; maxBlocksPerSeq: number };
  };
  /**
   * The device token ring: ring[(cursor[0] + r) % capacity] = src[r] for r < rows, then
   * cursor[0] += rows. Lets the host observe tokens later without a sync per token.
   */
  ring_push: { src: Buf; ring: Buf; cursor: Buf; rows: number; capacity: number };
  /**
   * Advance a decode step on the device: positions[r] += 1, then slots[r] = the KV slot of the
   * new position (blockTables[rowSeq[r]*maxBlocksPerSeq + pos/blockSize]*blockSize +
   * pos%blockSize). The host preallocates blocks ahead, so a captured decode step needs no host
   * write per token.
   */
  advance_positions: {
    positions: Buf;
    slots: Buf;
    blockTables: Buf;
    rowSeq: Buf;
    rows: number;
    blockSize: number;
    maxBlocksPerSeq: number;
  };
}

export type OpName = keyof OpCatalogue;
export type OpArgs<K extends OpName> = OpCatalogue[K];

export const OP_NAMES: readonly OpName[] = [
  'embedding',
  'rmsnorm',
  'matmul',
  'rope',
  'kv_append',
  'attention',
  'silu_mul',
  'add',
  'gather_rows',
  'moe_route',
  'moe_mlp',
  'argmax',
  'sample',
  'ring_push',
  'advance_positions',
  'fused_matmul',
  'rope_append',
  'decoder_layers',
  'mlp_slice',
  'attention_merge',
];
