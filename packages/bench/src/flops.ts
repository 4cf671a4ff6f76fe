import type { ModelSpec } from '@nerva/models';
import { isMoeLayer, layerWindow } from '@nerva/models';

/**
 * Model FLOPs of one prefill, counted from what the engine's prefill pass computes
 * (ModelRunner.forward on more than 8 rows): every FLOP of a matrix product, two per
 * multiply-add; element-wise work (norms, RoPE, SiLU, softmax, residual adds) is not counted, as
 * is usual for MFU.
 *
 * - flops_gemm = 2 · T · P_layers + 2 · R · H · V, where P_layers is the matmul parameter count of
 *   the decoder layers: per layer q/k/v (H · (n_q + 2·n_kv) · d), o (n_q · d · H), and the MLP:
 *   dense gate/up + down (3 · H · I), or on a sparse (MoE) layer the router (H · E) plus top-k
 *   experts' gate/up + down (k · 3 · H · I_moe: the experts a token is routed to, not all of
 *   them). Embeddings are a lookup (no FLOPs). The LM head runs on the R rows whose logits are
 *   needed only (R = 1 per prompt: the engine gathers each sequence's last row before the head),
 *   so it adds 2 · R · H · V, not 2 · T · H · V.
 * - flops_attention = Σ_layers 4 · n_q · d · Σ_{p=0}^{T-1} min(p + 1, W_l): each query row at
 *   position p scores p + 1 keys (causal; W_l on a sliding-window layer) with QKᵀ (2·d FLOPs per
 *   key) and sums as many values with PV (2·d): on a full-attention layer 4 · n_q · d · T(T+1)/2,
 *   i.e. the usual causal 4·L·H·d·T²/2 with the diagonal counted exactly. The same pairs are
 *   computed whether the prompt runs as one chunk or several, so the count does not depend on it.
 */
export interface PrefillFlops {
  /** Matmul FLOPs of the projections and the LM head's rows. */
  gemm: number;
  /** Causal attention FLOPs (QKᵀ and PV). */
  attention: number;
  total: number;
  /** P_layers: matmul parameters of the decoder layers a token passes through (active experts only). */
  layerMatmulParams: number;
  /** H · V: the LM head's parameters (counted for `logitRows` rows only). */
  lmHeadParams: number;
}

/** Matmul parameters one token passes through in decoder layer `l` (active experts only on an MoE layer). */
export function layerMatmulParams(spec: ModelSpec, l: number): number {
  const H = spec.hiddenSize;
  const d = spec.headDim;
  const attn = H * (spec.numHeads + 2 * spec.numKvHeads) * d + spec.numHeads * d * H;
  if (spec.moe && isMoeLayer(spec, l)) {
    const m = spec.moe;
    return attn + H * m.numExperts + m.topK * 3 * H * m.moeIntermediateSize;
  }
  return attn + 3 * H * spec.intermediateSize;
}

/** Σ_{p=0}^{T-1} min(p + 1, W) (W = 0: no window): the query-key pairs of a causal T-token prompt. */
export function causalPairs(tokens: number, window = 0): number {
  if (window <= 0 || window >= tokens) return (tokens * (tokens + 1)) / 2;
  // Rows 0..W-1 see p + 1 keys, the remaining T - W rows see W each.
  return (window * (window + 1)) / 2 + (tokens - window) * window;
}

/** FLOPs of prefilling `tokens` prompt tokens of one sequence (see PrefillFlops for the formula). */
export function prefillFlops(spec: ModelSpec, tokens: number, logitRows = 1): PrefillFlops {
  if (!Number.isSafeInteger(tokens) || tokens < 1) throw new RangeError(`prefillFlops: tokens must be a positive integer, got ${tokens}`);
  if (!Number.isSafeInteger(logitRows) || logitRows < 0) throw new RangeError(`prefillFlops: logitRows must be a non-negative integer, got ${logitRows}`);
  let params = 0;
  let attention = 0;
  for (let l = 0; l < spec.numLayers; l++) {
    params += layerMatmulParams(spec, l);
    attention += 4 * spec.numHeads * spec.headDim * causalPairs(tokens, layerWindow(spec, l));
  }
  const lmHeadParams = spec.hiddenSize * spec.vocabSize;
  const gemm = 2 * tokens * params + 2 * logitRows * lmHeadParams;
  return { gemm, attention, total: gemm + attention, layerMatmulParams: params, lmHeadParams };
}

/** FLOPs of a prefill by the op class that computes them (the classes of a profiled pass, Engine.takeProfiles). */
export interface PrefillFlopsByClass {
  gemm_qkv: number;
  gemm_o: number;
  /** Dense layers' gate/up and down projections (an MoE layer's experts run in op moe_mlp, not counted here). */
  gemm_gate_up: number;
  gemm_down: number;
  lm_head: number;
  attention: number;
}

/** prefillFlops split by op class: every term of flops_gemm and flops_attention under the class that computes it. */
export function prefillFlopsByClass(spec: ModelSpec, tokens: number, logitRows = 1): PrefillFlopsByClass {
  const f = prefillFlops(spec, tokens, logitRows);
  const H = spec.hiddenSize;
  const d = spec.headDim;
  let dense = 0;
  for (let l = 0; l < spec.numLayers; l++) if (!(spec.moe && isMoeLayer(spec, l))) dense++;
  const L = spec.numLayers;
  return {
    gemm_qkv: 2 * tokens * L * H * (spec.numHeads + 2 * spec.numKvHeads) * d,
    gemm_o: 2 * tokens * L * spec.numHeads * d * H,
    gemm_gate_up: 2 * tokens * dense * H * 2 * spec.intermediateSize,
    gemm_down: 2 * tokens * dense * spec.intermediateSize * H,
    lm_head: 2 * logitRows * f.lmHeadParams,
    attention: f.attention,
  };
}
