/**
 * Tensor-parallel weight shards: what one shard of a tensor-parallel group holds. Every
 * projection is split by its output rows (column parallel), so each output element is one dot
 * product over the whole, replicated input, computed by exactly one shard:
 *
 * - qkv: the shard's q heads and the KV heads they read (GQA groups stay whole), as
 *   [q rows; k rows; v rows] like the fused buffer of one device, with the bias sliced alike;
 * - o and down: output rows [hiddenOffset, +hiddenWidth) over the whole input (attention output
 *   of every head, every MLP channel);
 * - gate_up: the shard's MLP channels, gate rows then up rows of the same channels, so the
 *   SiLU-GLU epilogue pairs gate j with up j as it does on one device;
 * - LM head: vocabulary rows [vocabOffset, +vocabWidth);
 * - norms, the embedding table and RoPE frequencies: whole on every shard (the residual stream
 *   is replicated, and every shard normalizes its own copy of it, bit for bit the same).
 *
 * Block-quantized checkpoints (GGUF) split the same way: a row of a ggml matrix is whole blocks
 * (blocks run along the input dimension), so a shard's output rows are a contiguous run of the
 * tensor's blocks, stored as they are; a v projection in another block type than q and k goes
 * apart (`qkvTail`), as on one device.
 */
import type { DeviceBackend, DeviceBuffer, DType, HostArray } from '@nerva/core';
import { isQuantDType, NervaError, QUANT_BLOCKS } from '@nerva/core';
import type { ModelSpec, WeightSlot, WeightStore } from '@nerva/models';
import { ropeInvFreq } from '@nerva/models';
import { checkpointFormat, type LayerWeights, type ModelWeights, qkvStorage, readBlocks, storageDtypes, type UploadPart, type UploadProgress, weightSlots } from '../model-weights.js';

/** A tensor-parallel option or model is one the group cannot split. */
export class TensorParallelConfigError extends NervaError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('TENSOR_PARALLEL_CONFIG', message, options);
  }
}

/** [offset, offset + width) of a dimension of `n` split into `count` near-equal parts, part `index`. */
export function splitRange(n: number, count: number, index: number): { offset: number; width: number } {
  const offset = Math.floor((index * n) / count);
  return { offset, width: Math.floor(((index + 1) * n) / count) - offset };
}

/** Where shard `index` of `count` sits in each split dimension. */
export interface ShardGeometry {
  index: number;
  count: number;
  /** Its q heads [qHeadOffset, +qHeads) and KV heads [kvHeadOffset, +kvHeads). */
  qHeadOffset: number;
  qHeads: number;
  kvHeadOffset: number;
  kvHeads: number;
  hidden: { offset: number; width: number };
  inter: { offset: number; width: number };
  vocab: { offset: number; width: number };
}

/**
 * The geometry of every shard of a `count`-way split of `spec`, or a TensorParallelConfigError
 * naming what cannot be split: a MoE layer (experts are not sharded yet), KV heads that `count`
 * does not divide (a GQA group would straddle two shards), or a dimension narrower than `count`.
 */
export function shardGeometry(spec: ModelSpec, count: number): ShardGeometry[] {
  if (!Number.isInteger(count) || count < 1) throw new TensorParallelConfigError(`tensorParallel must be a positive integer (the number of shards), got ${String(count)}`);
  if (spec.moe !== undefined) throw new TensorParallelConfigError(`tensorParallel ${count}: the model has sparse (MoE) layers, whose experts are not sharded yet; run it with tensorParallel 1 or pipeline stages`);
  const nkv = spec.numKvHeads;
  if (nkv % count !== 0)
    throw new TensorParallelConfigError(`tensorParallel ${count} does not divide the model's ${nkv} KV head(s): each shard holds whole GQA groups (a KV head and the q heads that read it)`);
  if (spec.intermediateSize < count || spec.hiddenSize < count) throw new TensorParallelConfigError(`tensorParallel ${count} exceeds the model's hidden (${spec.hiddenSize}) or intermediate (${spec.intermediateSize}) size`);
  const qPer = spec.numHeads / count;
  const kvPer = nkv / count;
  return Array.from({ length: count }, (_, index) => ({
    index,
    count,
    qHeadOffset: index * qPer,
    qHeads: qPer,
    kvHeadOffset: index * kvPer,
    kvHeads: kvPer,
    hidden: splitRange(spec.hiddenSize, count, index),
    inter: splitRange(spec.intermediateSize, count, index),
    vocab: splitRange(spec.vocabSize, count, index),
  }));
}

/**
 * The spec a shard's runner is built with: its own heads and MLP channels, so its KV cache,
 * attention and per-shard activations are sized and indexed for them; hidden and vocab stay whole
 * (the residual stream and the logits the group gathers are full width).
 */
export function shardSpec(spec: ModelSpec, g: ShardGeometry): ModelSpec {
  return { ...spec, numHeads: g.qHeads, numKvHeads: g.kvHeads, intermediateSize: g.inter.width };
}

/**
 * Upload shard `g` of the checkpoint to `backend` (see the file comment for what each tensor
 * holds): of every layer, or of a pipeline stage's layers (`part`: the embedding with layer 0, the
 * final norm and LM head slice with the last layer). Block-quantized tensors keep their blocks
 * where one device would (`storageDtypes`), a shard's rows sliced as whole blocks.
 */
export async function uploadShardWeights(
  backend: DeviceBackend,
  spec: ModelSpec,
  ckpt: WeightStore,
  g: ShardGeometry,
  onProgress?: (p: UploadProgress) => void,
  part?: UploadPart,
): Promise<ModelWeights> {
  const from = part?.firstLayer ?? 0;
  const end = part?.endLayer ?? spec.numLayers;
  const wantHead = end === spec.numLayers;
  const dtypeOf = storageDtypes(backend, ckpt);
  const H = spec.hiddenSize;
  const hd = spec.headDim;
  const nq = spec.numHeads;
  const buffers: DeviceBuffer[] = [];
  const storedBytes: Record<string, number> = {};
  let bytes = 0;
  let done = 0;
  const alloc = (length: number, label: string, dtype: DType): DeviceBuffer => {
    const b = backend.alloc({ dtype, length, usage: 'weights', label: `tp${g.index}.${label}` });
    buffers.push(b);
    storedBytes[dtype] = (storedBytes[dtype] ?? 0) + b.byteLength;
    bytes += b.byteLength;
    return b;
  };
  /** A tensor as the destination dtype takes it (raw 16-bit bits when they match, raw blocks for a quantized one), as uploadWeights reads it. */
  const read = async (dtype: DType, slot: WeightSlot): Promise<HostArray> => {
    const info = ckpt.info(slot.name);
    done += info.byteLength;
    onProgress?.({ done, total: ckpt.totalBytes, tensor: slot.name });
    if (isQuantDType(dtype)) return readBlocks(ckpt, slot.name);
    if ((dtype === 'bf16' && info.dtype === 'BF16') || (dtype === 'f16' && info.dtype === 'F16')) {
      const raw = await ckpt.readRaw(slot.name);
      return raw.byteOffset % 2 === 0 ? new Uint16Array(raw.buffer, raw.byteOffset, raw.byteLength / 2) : new Uint16Array(raw.slice().buffer);
    }
    return ckpt.readF32(slot.name);
  };
  /** Rows [from, from + n) of a row-major tensor with `rowLen` elements a row, written at element `at` (a quantized row: its whole blocks). */
  const rows = async (dst: DeviceBuffer, slot: WeightSlot, from: number, n: number, rowLen: number, at: number) => {
    const data = await read(dst.dtype, slot);
    let unit = rowLen;
    if (isQuantDType(dst.dtype)) {
      const b = QUANT_BLOCKS[dst.dtype];
      if (rowLen % b.elements !== 0) throw new TensorParallelConfigError(`tensor ${slot.name}: a row of ${rowLen} elements is not whole ${dst.dtype} blocks`);
      unit = (rowLen / b.elements) * b.bytes;
    }
    backend.write(dst, data.subarray(from * unit, (from + n) * unit), at);
  };
  const whole = async (slot: WeightSlot, length: number, dtype: DType) => {
    const b = alloc(length, slot.name, dtype);
    backend.write(b, await read(dtype, slot));
    return b;
  };
  const normDt: DType = backend.capabilities.numerics === 'bf16' ? 'bf16' : 'f32';
  const slots = weightSlots(spec);
  try {
    const embed = from === 0 ? await whole(slots.embed, spec.vocabSize * H, dtypeOf(slots.embed, [])) : undefined;
    const headSlot = spec.tieWordEmbeddings ? slots.embed : slots.lmHead;
    let lmHead: DeviceBuffer | undefined;
    if (wantHead) {
      lmHead = alloc(g.vocab.width * H, 'lm_head.shard', dtypeOf(headSlot, []));
      await rows(lmHead, headSlot, g.vocab.offset, g.vocab.width, H, 0);
    }
    const finalNorm = wantHead ? await whole(slots.finalNorm, H, normDt) : undefined;
    const invFreq = alloc(hd / 2, 'rope.inv_freq', 'f32');
    backend.write(invFreq, Float32Array.from(ropeInvFreq(spec)));
    const qW = g.qHeads * hd;
    const kvW = g.kvHeads * hd;
    const I = g.inter.width;
    const layers: (LayerWeights | undefined)[] = [];
    for (const [i, L] of slots.layers.entries()) {
      if (i < from || i >= end) {
        layers.push(undefined);
        continue;
      }
      if (L.mlp.kind !== 'dense') throw new TensorParallelConfigError(`layer ${i} is sparse (MoE): not sharded`);
      const p = `layers.${i}.`;
      // q and k (and v, unless it is held apart in another block type) in one buffer, as on one device.
      const qkvDt = qkvStorage(backend, ckpt, dtypeOf, L);
      const qkv = alloc((qW + (qkvDt.tail ? 1 : 2) * kvW) * H, `${p}qkv`, qkvDt.qkv);
      const qkvTail = qkvDt.tail ? alloc(kvW * H, `${p}qkv_tail`, qkvDt.tail) : undefined;
      await rows(qkv, L.q, g.qHeadOffset * hd, qW, H, 0);
      await rows(qkv, L.k, g.kvHeadOffset * hd, kvW, H, qW * H);
      if (qkvTail) await rows(qkvTail, L.v, g.kvHeadOffset * hd, kvW, H, 0);
      else await rows(qkv, L.v, g.kvHeadOffset * hd, kvW, H, (qW + kvW) * H);
      let qkvBias: DeviceBuffer | undefined;
      if (L.qBias && L.kBias && L.vBias) {
        qkvBias = alloc(qW + 2 * kvW, `${p}qkv_bias`, 'f32');
        await rows(qkvBias, L.qBias, g.qHeadOffset * hd, qW, 1, 0);
        await rows(qkvBias, L.kBias, g.kvHeadOffset * hd, kvW, 1, qW);
        await rows(qkvBias, L.vBias, g.kvHeadOffset * hd, kvW, 1, qW + kvW);
      }
      const o = alloc(g.hidden.width * nq * hd, `${p}o`, dtypeOf(L.o, []));
      await rows(o, L.o, g.hidden.offset, g.hidden.width, nq * hd, 0);
      let oBias: DeviceBuffer | undefined;
      if (L.oBias) {
        oBias = alloc(g.hidden.width, `${p}o_bias`, 'f32');
        await rows(oBias, L.oBias, g.hidden.offset, g.hidden.width, 1, 0);
      }
      const gateUp = alloc(2 * I * H, `${p}gate_up`, dtypeOf(L.mlp.gate, [L.mlp.up]));
      await rows(gateUp, L.mlp.gate, g.inter.offset, I, H, 0);
      await rows(gateUp, L.mlp.up, g.inter.offset, I, H, I * H);
      const down = alloc(g.hidden.width * spec.intermediateSize, `${p}down`, dtypeOf(L.mlp.down, []));
      await rows(down, L.mlp.down, g.hidden.offset, g.hidden.width, spec.intermediateSize, 0);
      layers.push({
        attnNorm: await whole(L.inputNorm, H, normDt),
        qkv,
        ...(qkvTail ? { qkvTail } : {}),
        ...(qkvBias ? { qkvBias } : {}),
        ...(L.qNorm && L.kNorm ? { qNorm: await whole(L.qNorm, hd, normDt), kNorm: await whole(L.kNorm, hd, normDt) } : {}),
        o,
        ...(oBias ? { oBias } : {}),
        mlpNorm: await whole(L.postAttentionNorm, H, normDt),
        gateUp,
        down,
      });
    }
    return { embed, lmHead, finalNorm, invFreq, layers, bytes, hotBytes: bytes, buffers, format: { ...checkpointFormat(ckpt), storedBytes } };
  } catch (e) {
    for (const b of buffers) backend.free(b);
    throw e;
  }
}
