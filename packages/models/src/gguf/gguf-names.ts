/**
 * llama.cpp's tensor names and layouts against the Hugging Face names of `weights.ts`:
 * `token_embd`, `blk.N.attn_q`, ... `output`; dimensions in ggml order (`ne[0]` innermost, the
 * reverse of the PyTorch shape); routed experts stacked into one 3-D tensor per projection; and the
 * q/k row order llama.cpp's converter uses for the `llama` architecture.
 */
import type { ModelArch } from '../config.js';

/** GGUF `general.architecture` of each architecture NERVA runs. */
export const GGUF_ARCH_NAMES: Readonly<Record<ModelArch, string>> = {
  llama: 'llama',
  qwen2: 'qwen2',
  qwen3: 'qwen3',
  qwen3_moe: 'qwen3moe',
};

/** The architecture of a GGUF `general.architecture`, or undefined when NERVA does not run it. */
export function modelArchOfGguf(name: string): ModelArch | undefined {
  return (Object.keys(GGUF_ARCH_NAMES) as ModelArch[]).find((a) => GGUF_ARCH_NAMES[a] === name);
}

/** Per-layer tensors: HF suffix after `model.layers.N.` and GGUF suffix after `blk.N.`. */
const LAYER_NAMES: readonly (readonly [string, string])[] = [
  ['input_layernorm.weight', 'attn_norm.weight'],
  ['self_attn.q_proj.weight', 'attn_q.weight'],
  ['self_attn.k_proj.weight', 'attn_k.weight'],
  ['self_attn.v_proj.weight', 'attn_v.weight'],
  ['self_attn.o_proj.weight', 'attn_output.weight'],
  ['self_attn.q_proj.bias', 'attn_q.bias'],
  ['self_attn.k_proj.bias', 'attn_k.bias'],
  ['self_attn.v_proj.bias', 'attn_v.bias'],
  ['self_attn.o_proj.bias', 'attn_output.bias'],
  ['self_attn.q_norm.weight', 'attn_q_norm.weight'],
  ['self_attn.k_norm.weight', 'attn_k_norm.weight'],
  ['post_attention_layernorm.weight', 'ffn_norm.weight'],
  ['mlp.gate_proj.weight', 'ffn_gate.weight'],
  ['mlp.up_proj.weight', 'ffn_up.weight'],
  ['mlp.down_proj.weight', 'ffn_down.weight'],
  ['mlp.gate.weight', 'ffn_gate_inp.weight'],
];
/** Routed-expert projections: HF `mlp.experts.E.<proj>.weight` ↔ GGUF stacked `<name>.weight`. */
const EXPERT_NAMES: readonly (readonly [string, string])[] = [
  ['gate_proj', 'ffn_gate_exps'],
  ['up_proj', 'ffn_up_exps'],
  ['down_proj', 'ffn_down_exps'],
];
const GLOBAL_NAMES: readonly (readonly [string, string])[] = [
  ['model.embed_tokens.weight', 'token_embd.weight'],
  ['model.norm.weight', 'output_norm.weight'],
  ['lm_head.weight', 'output.weight'],
];

/** Where an HF tensor lives in a GGUF file: a tensor, or one expert's slice of a stacked one. */
export interface GgufLocation {
  readonly name: string;
  /** Index along the outermost dimension of a stacked expert tensor. */
  readonly expert?: number;
}

const HF_LAYER = /^model\.layers\.(\d+)\.(.+)$/;
const HF_EXPERT = /^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$/;
const GGUF_LAYER = /^blk\.(\d+)\.(.+)$/;

/** The GGUF location of HF tensor `hf`, or undefined for a name llama.cpp has no slot for. */
export function ggufLocationOf(hf: string): GgufLocation | undefined {
  const g = GLOBAL_NAMES.find(([h]) => h === hf);
  if (g) return { name: g[1] };
  const m = HF_LAYER.exec(hf);
  if (!m) return undefined;
  const layer = Number(m[1]);
  const rest = m[2];
  const l = LAYER_NAMES.find(([h]) => h === rest);
  if (l) return { name: `blk.${layer}.${l[1]}` };
  const e = HF_EXPERT.exec(rest);
  if (e) return { name: `blk.${layer}.${EXPERT_NAMES.find(([h]) => h === e[2])![1]}.weight`, expert: Number(e[1]) };
  return undefined;
}

/**
 * The HF names a GGUF tensor serves: one name, or for a stacked expert tensor one per expert
 * (`experts` = its outermost dimension). Undefined for names with no HF counterpart (e.g.
 * `rope_freqs.weight`), which are served under their GGUF name.
 */
export function hfNamesOf(gguf: string, experts = 0): string[] | undefined {
  const g = GLOBAL_NAMES.find(([, n]) => n === gguf);
  if (g) return [g[0]];
  const m = GGUF_LAYER.exec(gguf);
  if (!m) return undefined;
  const layer = Number(m[1]);
  const l = LAYER_NAMES.find(([, n]) => n === m[2]);
  if (l) return [`model.layers.${layer}.${l[0]}`];
  const e = EXPERT_NAMES.find(([, n]) => `${n}.weight` === m[2]);
  if (e) return Array.from({ length: experts }, (_, i) => `model.layers.${layer}.mlp.experts.${i}.${e[0]}.weight`);
  return undefined;
}

/**
 * How many heads' rows llama.cpp's `llama` converter reordered in GGUF tensor `gguf`, or 0 when
 * it did not: q (weight and bias) over the query heads, k over the KV heads. Qwen2/Qwen3 use NEOX
 * RoPE on the HF layout and keep it.
 */
export function ropePermutedHeads(arch: ModelArch, gguf: string, numHeads: number, numKvHeads: number): number {
  if (arch !== 'llama') return 0;
  if (/^blk\.\d+\.attn_q\.(weight|bias)$/.test(gguf)) return numHeads;
  if (/^blk\.\d+\.attn_k\.(weight|bias)$/.test(gguf)) return numKvHeads;
  return 0;
}

/**
 * Reorder the rows of a `[rows, rowBytes]` matrix between HF's rotary layout and llama.cpp's.
 * Each head's `d` rows are HF-ordered as two halves (the pairs RoPE rotates are rows j and
 * j + d/2); llama.cpp's converter interleaves them (rows 2j and 2j + 1), so that its interleaved
 * RoPE rotates the same pairs. `toGguf` applies that reordering, `!toGguf` undoes it. Rows are
 * whole ggml blocks, so this works on quantized bytes as well as on floats.
 */
export function permuteRopeRows(src: Uint8Array, rows: number, heads: number, toGguf: boolean): Uint8Array {
  if (heads <= 0 || rows % heads !== 0 || (rows / heads) % 2 !== 0 || src.byteLength % rows !== 0) {
    throw new RangeError(`cannot reorder ${rows} rows (${src.byteLength} bytes) as ${heads} rotary heads`);
  }
  const rowBytes = src.byteLength / rows;
  const d = rows / heads;
  const half = d / 2;
  const out = new Uint8Array(src.byteLength);
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < 2; i++) {
      for (let j = 0; j < half; j++) {
        const hfRow = h * d + i * half + j;
        const ggRow = h * d + 2 * j + i;
        const [from, to] = toGguf ? [hfRow, ggRow] : [ggRow, hfRow];
        out.set(src.subarray(from * rowBytes, (from + 1) * rowBytes), to * rowBytes);
      }
    }
  }
  return out;
}
