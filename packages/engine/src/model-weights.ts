import type { DeviceBackend, DeviceBuffer, DType } from '@nerva/core';
import type { Checkpoint, ModelSpec } from '@nerva/models';
import { isMoeLayer, ropeInvFreq } from '@nerva/models';

export interface LayerWeights {
  attnNorm: DeviceBuffer;
  /** q, k and v projections fused along the output dimension: [(nq + 2 nkv) * headDim, hidden]. */
  qkv: DeviceBuffer;
  qkvBias?: DeviceBuffer;
  qNorm?: DeviceBuffer;
  kNorm?: DeviceBuffer;
  o: DeviceBuffer;
  oBias?: DeviceBuffer;
  mlpNorm: DeviceBuffer;
  /** Dense MLP: gate and up fused: [2 * inter, hidden]. */
  gateUp?: DeviceBuffer;
  down?: DeviceBuffer;
  /** MoE: router [experts, hidden], experts' gate/up [E, 2 * inter, hidden], down [E, hidden, inter]. */
  router?: DeviceBuffer;
  expertsGateUp?: DeviceBuffer;
  expertsDown?: DeviceBuffer;
}

export interface ModelWeights {
  embed: DeviceBuffer;
  lmHead: DeviceBuffer;
  finalNorm: DeviceBuffer;
  invFreq: DeviceBuffer;
  layers: LayerWeights[];
  bytes: number;
  buffers: DeviceBuffer[];
}

export interface UploadProgress {
  done: number;
  total: number;
  tensor: string;
}

/**
 * Upload a checkpoint to the backend once, in the backend's weight dtype, fusing q/k/v and
 * gate/up so the hot path reads each layer's weights with fewer, larger matmuls. Tensors are
 * read one at a time (bounded range reads) and written at their offset in the fused buffer, so
 * no host copy of the whole model is ever made.
 */
export async function uploadWeights(
  backend: DeviceBackend,
  spec: ModelSpec,
  ckpt: Checkpoint,
  onProgress?: (p: UploadProgress) => void,
): Promise<ModelWeights> {
  const wd = backend.capabilities.weightDtype;
  const buffers: DeviceBuffer[] = [];
  const H = spec.hiddenSize;
  const hd = spec.headDim;
  const nq = spec.numHeads;
  const nkv = spec.numKvHeads;
  const total = ckpt.totalBytes;
  let done = 0;
  let bytes = 0;

  // Exact by default: a weight is never stored narrower than its checkpoint (an f32 checkpoint
  // stays f32 on a bf16-preferring backend); it is only narrowed when the backend cannot hold it.
  const fromCkpt: Record<string, DType> = { F32: 'f32', F16: 'f16', BF16: 'bf16' };
  const supported = backend.capabilities.dtypes;
  const dtypeOf = (name: string): DType => {
    const d = fromCkpt[ckpt.info(name).dtype];
    if (wd === 'f32' || !d) return wd;
    // bf16 numerics reproduces transformers' bf16 run, which casts every weight to bf16 (nearest even).
    if (backend.capabilities.numerics === 'bf16') return 'bf16';
    return supported.includes(d) ? d : wd;
  };
  const alloc = (length: number, label: string, dtype: DType = wd): DeviceBuffer => {
    const b = backend.alloc({ dtype, length, usage: 'weights', label });
    buffers.push(b);
    bytes += b.byteLength;
    return b;
  };
  const put = async (dst: DeviceBuffer, name: string, offset = 0): Promise<void> => {
    const info = ckpt.info(name);
    if ((dst.dtype === 'bf16' && info.dtype === 'BF16') || (dst.dtype === 'f16' && info.dtype === 'F16')) {
      // Same dtype on both sides: hand the raw bits over, no float32 detour.
      const raw = await ckpt.readRaw(name);
      const bits = raw.byteOffset % 2 === 0 ? new Uint16Array(raw.buffer, raw.byteOffset, raw.byteLength / 2) : new Uint16Array(raw.slice().buffer);
      backend.write(dst, bits, offset);
    } else {
      backend.write(dst, await ckpt.readF32(name), offset);
    }
    done += info.byteLength;
    onProgress?.({ done, total, tensor: name });
  };
  const tensor = async (name: string, length: number, dtype: DType = dtypeOf(name)): Promise<DeviceBuffer> => {
    const b = alloc(length, name, dtype);
    await put(b, name);
    return b;
  };
  // Norm weights stay f32: they are tiny and read once per row (bf16 under bf16 numerics, as
  // transformers casts them).
  const norm = (name: string, length: number) => tensor(name, length, backend.capabilities.numerics === 'bf16' ? 'bf16' : 'f32');

  try {
    const embed = await tensor('model.embed_tokens.weight', spec.vocabSize * H);
    const lmHead = spec.tieWordEmbeddings ? embed : await tensor('lm_head.weight', spec.vocabSize * H);
    const finalNorm = await norm('model.norm.weight', H);
    const invFreq = alloc(hd / 2, 'rope.inv_freq', 'f32');
    backend.write(invFreq, Float32Array.from(ropeInvFreq(spec)));

    const layers: LayerWeights[] = [];
    for (let i = 0; i < spec.numLayers; i++) {
      const p = `model.layers.${i}.`;
      const qkvOut = (nq + 2 * nkv) * hd;
      const qkv = alloc(qkvOut * H, `${p}self_attn.qkv`, dtypeOf(`${p}self_attn.q_proj.weight`));
      await put(qkv, `${p}self_attn.q_proj.weight`, 0);
      await put(qkv, `${p}self_attn.k_proj.weight`, nq * hd * H);
      await put(qkv, `${p}self_attn.v_proj.weight`, (nq + nkv) * hd * H);
      const lw: LayerWeights = {
        attnNorm: await norm(`${p}input_layernorm.weight`, H),
        qkv,
        o: await tensor(`${p}self_attn.o_proj.weight`, H * nq * hd),
        mlpNorm: await norm(`${p}post_attention_layernorm.weight`, H),
      };
      if (spec.attentionBias) {
        const b = alloc(qkvOut, `${p}self_attn.qkv_bias`, 'f32');
        await put(b, `${p}self_attn.q_proj.bias`, 0);
        await put(b, `${p}self_attn.k_proj.bias`, nq * hd);
        await put(b, `${p}self_attn.v_proj.bias`, (nq + nkv) * hd);
        lw.qkvBias = b;
      }
      if (spec.oProjBias) lw.oBias = await tensor(`${p}self_attn.o_proj.bias`, H, 'f32');
      if (spec.qkNorm) {
        lw.qNorm = await norm(`${p}self_attn.q_norm.weight`, hd);
        lw.kNorm = await norm(`${p}self_attn.k_norm.weight`, hd);
      }
      if (spec.moe && isMoeLayer(spec, i)) {
        const E = spec.moe.numExperts;
        const I = spec.moe.moeIntermediateSize;
        lw.router = await tensor(`${p}mlp.gate.weight`, E * H, 'f32');
        lw.expertsGateUp = alloc(E * 2 * I * H, `${p}mlp.experts.gate_up`, dtypeOf(`${p}mlp.experts.0.gate_proj.weight`));
        lw.expertsDown = alloc(E * H * I, `${p}mlp.experts.down`, dtypeOf(`${p}mlp.experts.0.down_proj.weight`));
        for (let e = 0; e < E; e++) {
          await put(lw.expertsGateUp, `${p}mlp.experts.${e}.gate_proj.weight`, e * 2 * I * H);
          await put(lw.expertsGateUp, `${p}mlp.experts.${e}.up_proj.weight`, e * 2 * I * H + I * H);
          await put(lw.expertsDown, `${p}mlp.experts.${e}.down_proj.weight`, e * H * I);
        }
      } else {
        const I = spec.intermediateSize;
        lw.gateUp = alloc(2 * I * H, `${p}mlp.gate_up`, dtypeOf(`${p}mlp.gate_proj.weight`));
        await put(lw.gateUp, `${p}mlp.gate_proj.weight`, 0);
        await put(lw.gateUp, `${p}mlp.up_proj.weight`, I * H);
        lw.down = await tensor(`${p}mlp.down_proj.weight`, H * I);
      }
      layers.push(lw);
    }
    return { embed, lmHead, finalNorm, invFreq, layers, bytes, buffers };
  } catch (e) {
    // Leave the backend as we found it.
    for (const b of buffers) backend.free(b);
    throw e;
  }
}

export function freeWeights(backend: DeviceBackend, w: ModelWeights): void {
  for (const b of w.buffers) backend.free(b);
  w.buffers.length = 0;
}

/**
 * The KV cache dtype: float32 (exact keys and values), or bf16 under bf16 numerics, where
 * transformers' cache holds bf16.
 */
export function kvDtypeOf(backend: DeviceBackend): 'f32' | 'bf16' {
  return backend.capabilities.numerics === 'bf16' ? 'bf16' : 'f32';
}

