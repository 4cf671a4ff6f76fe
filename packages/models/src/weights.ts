import { isMoeLayer, type ModelSpec } from './config.js';
import { CheckpointError } from './errors.js';
import { isWeightDType, type WeightDType } from './safetensors.js';
import type { WeightStore } from './weight-store.js';

/**
 * One expected tensor: `slot` is NERVA's canonical id (stable across architectures, used as a
 * block id), `name` the Hugging Face tensor name, `shape` the expected shape in HF layout
 * (`[out, in]` for linear weights).
 */
export interface WeightSlot {
  readonly slot: string;
  readonly name: string;
  readonly shape: readonly number[];
}

/** Dense SwiGLU MLP: down(silu(gate(x)) * up(x)). */
export interface DenseMlpSlots<S> {
  readonly kind: 'dense';
  readonly gate: S;
  readonly up: S;
  readonly down: S;
}

/** One routed expert's SwiGLU MLP. */
export interface ExpertSlots<S> {
  readonly gate: S;
  readonly up: S;
  readonly down: S;
}

/** Routed-expert MLP: a router (`[numExperts, hidden]`) and per-expert MLPs. */
export interface MoeMlpSlots<S> {
  readonly kind: 'moe';
  readonly router: S;
  readonly experts: readonly ExpertSlots<S>[];
}

/** Every tensor of one decoder layer. Optional members are absent when the spec has no such tensor. */
export interface LayerSlots<S> {
  readonly index: number;
  readonly inputNorm: S;
  readonly q: S;
  readonly k: S;
  readonly v: S;
  readonly o: S;
  readonly qBias?: S;
  readonly kBias?: S;
  readonly vBias?: S;
  readonly oBias?: S;
  readonly qNorm?: S;
  readonly kNorm?: S;
  readonly postAttentionNorm: S;
  readonly mlp: DenseMlpSlots<S> | MoeMlpSlots<S>;
}

/** The whole model's tensors. `lmHead` is the embedding slot itself when embeddings are tied. */
export interface ModelSlots<S> {
  readonly embed: S;
  readonly layers: readonly LayerSlots<S>[];
  readonly finalNorm: S;
  readonly lmHead: S;
  /** True when `lmHead` is the embedding matrix (no `lm_head.weight` tensor). */
  readonly tiedLmHead: boolean;
}

/** The expected tensors of a spec, without a checkpoint. */
export type CanonicalWeights = ModelSlots<WeightSlot>;

/** A slot found in a checkpoint: where it lives and its stored dtype. */
export interface ResolvedWeight extends WeightSlot {
  readonly dtype: WeightDType;
  /** Absolute path of the shard holding it. */
  readonly file: string;
  readonly byteOffset: number;
  readonly byteLength: number;
}

/** The tensors of a spec, each located in a checkpoint and shape-checked. */
export type ResolvedWeights = ModelSlots<ResolvedWeight>;

/** The expected tensor names and shapes of `spec`, in HF naming. */
export function canonicalWeightNames(spec: ModelSpec): CanonicalWeights {
  const { hiddenSize: h, numHeads, numKvHeads, headDim, vocabSize } = spec;
  const qDim = numHeads * headDim;
  const kvDim = numKvHeads * headDim;
  const w = (slot: string, name: string, shape: number[]): WeightSlot => ({ slot, name, shape });
  const mlp = (slot: string, prefix: string, inter: number) => ({
    gate: w(`${slot}.gate`, `${prefix}.gate_proj.weight`, [inter, h]),
    up: w(`${slot}.up`, `${prefix}.up_proj.weight`, [inter, h]),
    down: w(`${slot}.down`, `${prefix}.down_proj.weight`, [h, inter]),
  });

  const layers: LayerSlots<WeightSlot>[] = [];
  for (let i = 0; i < spec.numLayers; i++) {
    const p = `model.layers.${i}`;
    const s = `layers.${i}`;
    const attn = `${p}.self_attn`;
    let mlpSlots: DenseMlpSlots<WeightSlot> | MoeMlpSlots<WeightSlot>;
    if (spec.moe && isMoeLayer(spec, i)) {
      const experts: ExpertSlots<WeightSlot>[] = [];
      for (let e = 0; e < spec.moe.numExperts; e++) experts.push(mlp(`${s}.experts.${e}`, `${p}.mlp.experts.${e}`, spec.moe.moeIntermediateSize));
      mlpSlots = { kind: 'moe', router: w(`${s}.router`, `${p}.mlp.gate.weight`, [spec.moe.numExperts, h]), experts };
    } else {
      mlpSlots = { kind: 'dense', ...mlp(`${s}.mlp`, `${p}.mlp`, spec.intermediateSize) };
    }
    layers.push({
      index: i,
      inputNorm: w(`${s}.input_norm`, `${p}.input_layernorm.weight`, [h]),
      q: w(`${s}.q`, `${attn}.q_proj.weight`, [qDim, h]),
      k: w(`${s}.k`, `${attn}.k_proj.weight`, [kvDim, h]),
      v: w(`${s}.v`, `${attn}.v_proj.weight`, [kvDim, h]),
      o: w(`${s}.o`, `${attn}.o_proj.weight`, [h, qDim]),
      ...(spec.attentionBias && {
        qBias: w(`${s}.q_bias`, `${attn}.q_proj.bias`, [qDim]),
        kBias: w(`${s}.k_bias`, `${attn}.k_proj.bias`, [kvDim]),
        vBias: w(`${s}.v_bias`, `${attn}.v_proj.bias`, [kvDim]),
      }),
      ...(spec.oProjBias && { oBias: w(`${s}.o_bias`, `${attn}.o_proj.bias`, [h]) }),
      ...(spec.qkNorm && {
        qNorm: w(`${s}.q_norm`, `${attn}.q_norm.weight`, [headDim]),
        kNorm: w(`${s}.k_norm`, `${attn}.k_norm.weight`, [headDim]),
      }),
      postAttentionNorm: w(`${s}.post_attention_norm`, `${p}.post_attention_layernorm.weight`, [h]),
      mlp: mlpSlots,
    });
  }
  const embed = w('embed', 'model.embed_tokens.weight', [vocabSize, h]);
  return {
    embed,
    layers,
    finalNorm: w('final_norm', 'model.norm.weight', [h]),
    lmHead: spec.tieWordEmbeddings ? embed : w('lm_head', 'lm_head.weight', [vocabSize, h]),
    tiedLmHead: spec.tieWordEmbeddings,
  };
}

/** Every distinct slot of `weights` in load order (embedding, layers, final norm, LM head unless tied). */
export function listWeightSlots<S extends WeightSlot>(weights: ModelSlots<S>): S[] {
  const out: S[] = [weights.embed];
  for (const l of weights.layers) {
    out.push(l.inputNorm, l.q, l.k, l.v, l.o);
    for (const s of [l.qBias, l.kBias, l.vBias, l.oBias, l.qNorm, l.kNorm]) if (s) out.push(s);
    out.push(l.postAttentionNorm);
    if (l.mlp.kind === 'dense') out.push(l.mlp.gate, l.mlp.up, l.mlp.down);
    else {
      out.push(l.mlp.router);
      for (const e of l.mlp.experts) out.push(e.gate, e.up, e.down);
    }
  }
  out.push(weights.finalNorm);
  if (!weights.tiedLmHead) out.push(weights.lmHead);
  return out;
}

/**
 * Locate every tensor `spec` needs in `checkpoint` and check its shape and dtype. Throws
 * {@link CheckpointError} MISSING_TENSOR, SHAPE_MISMATCH or UNSUPPORTED_DTYPE naming the tensor
 * and file. Tensors the spec does not use are ignored (as HF does for e.g. `rotary_emb.inv_freq`).
 */
export function resolveWeights(spec: ModelSpec, checkpoint: WeightStore): ResolvedWeights {
  const canon = canonicalWeightNames(spec);
  const where = checkpoint.source;
  const resolve = (s: WeightSlot): ResolvedWeight => {
    if (!checkpoint.has(s.name)) throw new CheckpointError('MISSING_TENSOR', where, `required by ${spec.arch} (slot ${s.slot}) but absent`, s.name);
    const info = checkpoint.info(s.name);
    if (info.shape.length !== s.shape.length || info.shape.some((d, i) => d !== s.shape[i])) {
      throw new CheckpointError('SHAPE_MISMATCH', info.file, `shape [${info.shape.join(', ')}] but the config implies [${s.shape.join(', ')}]`, s.name);
    }
    if (!isWeightDType(info.dtype)) {
      throw new CheckpointError('UNSUPPORTED_DTYPE', info.file, `dtype ${info.dtype} is not a weight dtype (F32, F16, BF16)`, s.name);
    }
    return { ...s, dtype: info.dtype, file: info.file, byteOffset: info.byteOffset, byteLength: info.byteLength };
  };
  const embed = resolve(canon.embed);
  return {
    embed,
    layers: canon.layers.map((l) => mapSlots(l, resolve) as LayerSlots<ResolvedWeight>),
    finalNorm: resolve(canon.finalNorm),
    lmHead: canon.tiedLmHead ? embed : resolve(canon.lmHead),
    tiedLmHead: canon.tiedLmHead,
  };
}

/** Structure-preserving map over the WeightSlot leaves of a layer. */
function mapSlots(v: unknown, f: (s: WeightSlot) => ResolvedWeight): unknown {
  if (Array.isArray(v)) return v.map((x) => mapSlots(x, f));
  if (typeof v !== 'object' || v === null) return v;
  if ('slot' in v && 'name' in v && 'shape' in v) return f(v as WeightSlot);
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, mapSlots(x, f)]));
}
