import type { DeviceBackend, DeviceBuffer, DType, HostArray, Tier } from '@nerva/core';
import { DTYPE_BYTES, dtypeOfGgml, isQuantDType, takesOpField, type GgmlTypeName, type QuantDType } from '@nerva/core';
import type { PagedTensor, PlanBlock, WeightFormat, WeightPager } from '@nerva/memos';
import type { CanonicalWeights, LayerSlots, ModelSpec, WeightSlot, WeightStore } from '@nerva/models';
import { canonicalWeightNames, ropeInvFreq } from '@nerva/models';

export interface LayerWeights {
  attnNorm: DeviceBuffer;
  /** q, k and v projections fused along the output dimension: [(nq + 2 nkv) * headDim, hidden]. */
  qkv: DeviceBuffer;
  /**
   * The v projection apart, [nkv * headDim, hidden], when it is block-quantized in another block
   * type than q and k (a Q4_K_M-style mix): `qkv` then holds only the q and k rows.
   */
  qkvTail?: DeviceBuffer;
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
  /**
   * The embedding, LM head and final norm. A pipeline stage on a backend of its own holds only
   * what it runs (see `UploadPart`): the embedding on the first stage, the head on the last.
   */
  embed?: DeviceBuffer;
  lmHead?: DeviceBuffer;
  finalNorm?: DeviceBuffer;
  invFreq: DeviceBuffer;
  /** Per layer: its buffers when hot, undefined when the pager streams it (see `pager`). */
  layers: (LayerWeights | undefined)[];
  /** Bytes of every weight, wherever it lives. */
  bytes: number;
  /** Bytes of the weights resident in the compute tier (hot). */
  hotBytes: number;
  buffers: DeviceBuffer[];
  /** Streams the layers that are not hot (paged mode). */
  pager?: WeightPager;
  /**
   * Compute near data: per layer, the MLP channels computed where their host copy lies (op
   * `mlp_slice`), for streamed layers split by {@link HostSplit}; the slot then holds the rest.
   */
  hostParts?: (HostPart | undefined)[];
  /** How the weights are stored: the checkpoint's types and the bytes held by buffer dtype. */
  format: WeightFormat;
}

/** The host-computed slice of a streamed layer's MLP: channels [0, inter) of gate, up and down. */
export interface HostPart {
  /** A host-tier copy of the layer's post-attention norm weight. */
  normWeight: DeviceBuffer;
  /** [2*inter, hidden]: gate rows [0, inter), then up rows [0, inter). */
  gateUp: DeviceBuffer;
  /** [hidden, inter]: columns [0, inter) of down. */
  down: DeviceBuffer;
  inter: number;
}

/** How streamed dense layers split their MLP: `inter` channels near the data, in `tier`. */
export interface HostSplit {
  inter: number;
  tier: Tier;
}

/** The pager's block id of decoder layer l. */
export const layerBlockId = (l: number): string => `layer.${l}`;

/** One tensor slot of a layer (a LayerWeights key) with its storage dtype and length. */
interface TensorDesc extends PagedTensor {
  name: keyof LayerWeights;
}

/**
 * The storage dtype of every weight (the rules uploadWeights applies), without reading any data:
 * what the residency planner needs to size blocks.
 */
export function layerLayouts(backend: DeviceBackend, spec: ModelSpec, ckpt: WeightStore, hostInter = 0): TensorDesc[][] {
  const H = spec.hiddenSize;
  const hd = spec.headDim;
  const nq = spec.numHeads;
  const nkv = spec.numKvHeads;
  const dt = storageDtypes(backend, ckpt);
  const normDt: DType = backend.capabilities.numerics === 'bf16' ? 'bf16' : 'f32';
  const out: TensorDesc[][] = [];
  for (const L of weightSlots(spec).layers) {
    const qkvOut = (nq + 2 * nkv) * hd;
    const qkv = qkvStorage(backend, ckpt, dt, L);
    const t: TensorDesc[] = [
      { name: 'attnNorm', dtype: normDt, length: H },
      ...(qkv.tail
        ? [{ name: 'qkv', dtype: qkv.qkv, length: (nq + nkv) * hd * H } as const, { name: 'qkvTail', dtype: qkv.tail, length: nkv * hd * H } as const]
        : [{ name: 'qkv', dtype: qkv.qkv, length: qkvOut * H } as const]),
      { name: 'o', dtype: dt(L.o, []), length: H * nq * hd },
      { name: 'mlpNorm', dtype: normDt, length: H },
    ];
    if (spec.attentionBias) t.push({ name: 'qkvBias', dtype: 'f32', length: qkvOut });
    if (spec.oProjBias) t.push({ name: 'oBias', dtype: 'f32', length: H });
    if (spec.qkNorm) t.push({ name: 'qNorm', dtype: normDt, length: hd }, { name: 'kNorm', dtype: normDt, length: hd });
    if (L.mlp.kind === 'moe') {
      const E = spec.moe!.numExperts;
      const I = spec.moe!.moeIntermediateSize;
      t.push(
        { name: 'router', dtype: 'f32', length: E * H },
        { name: 'expertsGateUp', dtype: dt(L.mlp.experts[0].gate, null), length: E * 2 * I * H },
        { name: 'expertsDown', dtype: dt(L.mlp.experts[0].down, null), length: E * H * I },
      );
    } else {
      // A split layer's slot holds the channels the host does not compute.
      const I = spec.intermediateSize - hostInter;
      // A split layer's host part is float (the host kernels read bf16), so its device part is too.
      const q = hostInter > 0 ? null : [];
      t.push({ name: 'gateUp', dtype: dt(L.mlp.gate, q && [L.mlp.up]), length: 2 * I * H }, { name: 'down', dtype: dt(L.mlp.down, q), length: H * I });
    }
    out.push(t);
  }
  return out;
}

const blockBytes = (t: readonly PagedTensor[]): number => t.reduce((s, x) => s + x.length * DTYPE_BYTES[x.dtype], 0);
const layoutKey = (t: readonly PagedTensor[]): string => t.map((x) => `${x.name}:${x.dtype}:${x.length}`).join(',');

/**
 * The model's weights as planner blocks: one block per decoder layer (in execution order), the
 * embedding, lm_head and final norm as always-hot blocks. Only layers of the most common tensor
 * layout may stream (a staging slot holds any of them); the others stay hot.
 */
export function weightBlocks(
  backend: DeviceBackend,
  spec: ModelSpec,
  ckpt: WeightStore,
  importance?: readonly number[],
  hostInter = 0,
): { blocks: PlanBlock[]; layout: PagedTensor[] } {
  const layouts = layerLayouts(backend, spec, ckpt);
  // With compute near data a streamed layer streams only its split layout; hot, it is whole.
  const streamedLayouts = hostInter > 0 ? layerLayouts(backend, spec, ckpt, hostInter) : layouts;
  const count = new Map<string, number>();
  for (const l of layouts) count.set(layoutKey(l), (count.get(layoutKey(l)) ?? 0) + 1);
  const common = [...count.entries()].sort((a, b) => b[1] - a[1])[0]?.[0];
  const dt = storageDtypes(backend, ckpt);
  const H = spec.hiddenSize;
  const slots = weightSlots(spec);
  const embedBytes = spec.vocabSize * H * DTYPE_BYTES[dt(slots.embed, [])];
  const blocks: PlanBlock[] = [
    // Tied embeddings are also lm_head, which reads every row each pass.
    { id: 'embed', bytes: embedBytes, ...(spec.tieWordEmbeddings ? {} : { access: 'gather' as const }) },
    { id: 'final_norm', bytes: H * 4 },
  ];
  if (!spec.tieWordEmbeddings) blocks.push({ id: 'lm_head', bytes: spec.vocabSize * H * DTYPE_BYTES[dt(slots.lmHead, [])] });
  layouts.forEach((l, i) =>
    blocks.push({
      id: layerBlockId(i),
      bytes: layoutKey(l) === common ? blockBytes(streamedLayouts[i]) : blockBytes(l),
      ...(layoutKey(l) === common ? { order: i, residentBytes: blockBytes(l) } : {}),
      ...(importance ? { importance: importance[i] } : {}),
    }),
  );
  const at = layouts.findIndex((l) => layoutKey(l) === common);
  return { blocks, layout: at >= 0 ? streamedLayouts[at] : [] };
}

/**
 * The model's weight slots (names and shapes, by `@nerva/models`' canonical naming), made once
 * per spec: the engine reads every tensor through them rather than spelling checkpoint names.
 */
export function weightSlots(spec: ModelSpec): CanonicalWeights {
  let s = slotCache.get(spec);
  if (!s) slotCache.set(spec, (s = canonicalWeightNames(spec)));
  return s;
}
const slotCache = new WeakMap<ModelSpec, CanonicalWeights>();

/**
 * The storage dtype of each weight: `dt(slot)` for a tensor on its own; `dt(slot, fused)` for a
 * matrix the engine may keep quantized, stored in one buffer with the `fused` slots (q with k and
 * v, gate with up); `fused` null for a matrix that must stay float (routed experts, the split
 * layers' MLPs, whose kernels read float weights).
 */
export function storageDtypes(backend: DeviceBackend, ckpt: WeightStore): (slot: WeightSlot, fused?: readonly WeightSlot[] | null) => DType {
  const wd = backend.capabilities.weightDtype;
  // Exact by default: a weight is never stored narrower than its checkpoint (an f32 checkpoint
  // stays f32 on a bf16-preferring backend); it is only narrowed when the backend cannot hold it.
  const fromCkpt: Record<string, DType> = { F32: 'f32', F16: 'f16', BF16: 'bf16' };
  const supported = backend.capabilities.dtypes;
  const float = (slot: WeightSlot): DType => {
    const d = fromCkpt[ckpt.info(slot.name).dtype];
    if (wd === 'f32' || !d) return wd;
    // bf16 numerics reproduces transformers' bf16 run, which casts every weight to bf16 (nearest even).
    if (backend.capabilities.numerics === 'bf16') return 'bf16';
    return supported.includes(d) ? d : wd;
  };
  return (slot: WeightSlot, fused?: readonly WeightSlot[] | null): DType => {
    // A quantized matrix stays in its blocks where the backend reads them and every tensor sharing
    // its buffer has the same type; otherwise it is stored as its dequantized float32 values
    // (exact; a mixed group such as a Q4_K q beside a Q6_K v cannot share one block format).
    const q = quantDtypeOf(ckpt, slot.name);
    if (q && fused !== undefined && fused !== null && supported.includes(q) && fused.every((f) => quantDtypeOf(ckpt, f.name) === q)) return q;
    return q ? (supported.includes('f32') ? 'f32' : wd) : float(slot);
  };
}

/**
 * The storage of a layer's q/k/v projections: one fused buffer (`qkv`), or, when v is
 * block-quantized in another block type than q and k and the backend reads both, q and k fused in
 * their blocks and v apart in its own (`tail`), so neither falls back to float32.
 */
export function qkvStorage(
  backend: DeviceBackend,
  ckpt: WeightStore,
  dt: ReturnType<typeof storageDtypes>,
  L: LayerSlots<WeightSlot>,
): { qkv: DType; tail?: DType } {
  const whole = dt(L.q, [L.k, L.v]);
  const q = quantDtypeOf(ckpt, L.q.name);
  const v = quantDtypeOf(ckpt, L.v.name);
  const supported = backend.capabilities.dtypes;
  const tails = takesOpField(backend.capabilities, 'fused_matmul', 'weightTail') && takesOpField(backend.capabilities, 'matmul', 'weightTail');
  if (isQuantDType(whole) || !tails || !q || !v || q === v || !supported.includes(v)) return { qkv: whole };
  const qk = dt(L.q, [L.k]);
  return isQuantDType(qk) ? { qkv: qk, tail: v } : { qkv: whole };
}

/** A tensor a GGUF file holds in ggml blocks: what the checkpoint says beyond its float view. */
interface QuantizedTensorInfo {
  readonly ggmlType?: GgmlTypeName;
}

/** The raw ggml blocks of a quantized tensor. */
export function readBlocks(ckpt: WeightStore, name: string): Promise<Uint8Array> {
  const r = (ckpt as { readBlocks?: (name: string) => Promise<Uint8Array> }).readBlocks;
  if (!r) throw new TypeError(`tensor ${name} is quantized but its checkpoint cannot read blocks`);
  return r.call(ckpt, name);
}

/** The quantized dtype a checkpoint tensor is stored in (a GGUF block type), else undefined. */
export function quantDtypeOf(ckpt: WeightStore, name: string): QuantDType | undefined {
  const t = (ckpt.info(name) as QuantizedTensorInfo).ggmlType;
  return t === undefined ? undefined : quantDtypeOfType(t);
}

/**
 * The share of the checkpoint one pipeline stage uploads to its own backend: decoder layers
 * [firstLayer, endLayer) (the others stay undefined in `layers`), the embedding when it holds
 * layer 0, the final norm and LM head when it holds the last layer.
 */
export interface UploadPart {
  firstLayer: number;
  endLayer: number;
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
  ckpt: WeightStore,
  onProgress?: (p: UploadProgress) => void,
  pager?: WeightPager,
  part?: UploadPart,
  split?: HostSplit,
): Promise<ModelWeights> {
  const from = part?.firstLayer ?? 0;
  const end = part?.endLayer ?? spec.numLayers;
  const wantEmbed = from === 0;
  const wantHead = end === spec.numLayers;
  const wd = backend.capabilities.weightDtype;
  const buffers: DeviceBuffer[] = [];
  const H = spec.hiddenSize;
  const hd = spec.headDim;
  const nq = spec.numHeads;
  const nkv = spec.numKvHeads;
  const total = ckpt.totalBytes;
  let done = 0;
  let bytes = 0;
  let streamedBytes = 0;
  const dtypeOf = storageDtypes(backend, ckpt);
  let mappedBytes = 0;
  const storedBytes: Record<string, number> = {};
  const alloc = (length: number, label: string, dtype: DType = wd, tier?: Tier): DeviceBuffer => {
    const b = backend.alloc({ dtype, length, usage: 'weights', label, ...(tier ? { tier } : {}) });
    buffers.push(b);
    storedBytes[dtype] = (storedBytes[dtype] ?? 0) + b.byteLength;
    if (tier) mappedBytes += b.byteLength;
    else bytes += b.byteLength;
    return b;
  };
  /** A destination: a buffer of the backend, or a tensor of a streamed block (stored through the pager). */
  type Dst = DeviceBuffer | { block: string; tensor: string; dtype: DType };
  /** A tensor's data as the destination dtype takes it (raw 16-bit bits when they match). */
  const read = async (dtype: DType, slot: WeightSlot): Promise<HostArray> => {
    const name = slot.name;
    if (isQuantDType(dtype)) return readBlocks(ckpt, name);
    const info = ckpt.info(name);
    if ((dtype === 'bf16' && info.dtype === 'BF16') || (dtype === 'f16' && info.dtype === 'F16')) {
      // Same dtype on both sides: hand the raw bits over, no float32 detour.
      const raw = await ckpt.readRaw(name);
      return raw.byteOffset % 2 === 0 ? new Uint16Array(raw.buffer, raw.byteOffset, raw.byteLength / 2) : new Uint16Array(raw.slice().buffer);
    }
    return ckpt.readF32(name);
  };
  const store = (dst: Dst, data: HostArray, offset: number): void => {
    if ('block' in dst) pager!.store(dst.block, dst.tensor, data, offset);
    else backend.write(dst, data, offset);
  };
  const progress = (slot: WeightSlot): void => {
    done += ckpt.info(slot.name).byteLength;
    onProgress?.({ done, total, tensor: slot.name });
  };
  const put = async (dst: Dst, slot: WeightSlot, offset = 0): Promise<void> => {
    store(dst, await read(dst.dtype, slot), offset);
    progress(slot);
  };
  /** Rows [from, to) of a [rows, rowLen] tensor, stored at an element offset. */
  const putRows = async (dst: Dst, slot: WeightSlot, from: number, to: number, rowLen: number, offset: number): Promise<void> => {
    store(dst, (await read(dst.dtype, slot)).subarray(from * rowLen, to * rowLen), offset);
  };
  /** Columns [from, to) of a [rows, cols] tensor, as a [rows, to - from] matrix. */
  const columns = (data: HostArray, rows: number, cols: number, from: number, to: number): HostArray => {
    const w = to - from;
    const outArr = data instanceof Uint16Array ? new Uint16Array(rows * w) : data instanceof Int32Array ? new Int32Array(rows * w) : new Float32Array(rows * w);
    for (let r = 0; r < rows; r++) outArr.set(data.subarray(r * cols + from, r * cols + to), r * w);
    return outArr;
  };
  const tensor = async (slot: WeightSlot, length: number, dtype: DType = dtypeOf(slot), tier?: Tier): Promise<DeviceBuffer> => {
    const b = alloc(length, slot.name, dtype, tier);
    await put(b, slot);
    return b;
  };
  // Norm weights stay f32: they are tiny and read once per row (bf16 under bf16 numerics, as
  // transformers casts them).
  const norm = (slot: WeightSlot, length: number) => tensor(slot, length, backend.capabilities.numerics === 'bf16' ? 'bf16' : 'f32');
  const slots = weightSlots(spec);

  try {
    // Paged weights: an untied embedding table is read in place from host memory (a few rows a pass).
    const mapped = pager?.plan.placements.get('embed')?.placement === 'mapped';
    // A tied LM head is the embedding table: a last stage of its own needs the table too.
    const embed =
      wantEmbed || (wantHead && spec.tieWordEmbeddings)
        ? await tensor(slots.embed, spec.vocabSize * H, dtypeOf(slots.embed, []), mapped ? pager!.hostTier : undefined)
        : undefined;
    const lmHead = !wantHead ? undefined : spec.tieWordEmbeddings ? embed : await tensor(slots.lmHead, spec.vocabSize * H, dtypeOf(slots.lmHead, []));
    const finalNorm = wantHead ? await norm(slots.finalNorm, H) : undefined;
    const invFreq = alloc(hd / 2, 'rope.inv_freq', 'f32');
    backend.write(invFreq, Float32Array.from(ropeInvFreq(spec)));

    const layers: (LayerWeights | undefined)[] = [];
    const layouts = layerLayouts(backend, spec, ckpt);
    const splitLayouts = split ? layerLayouts(backend, spec, ckpt, split.inter) : layouts;
    const hostParts: (HostPart | undefined)[] = [];
    let hostPartBytes = 0;
    for (let i = 0; i < spec.numLayers; i++) {
      if (i < from || i >= end) {
        layers.push(undefined);
        continue;
      }
      const L: LayerSlots<WeightSlot> = slots.layers[i];
      const p = `layers.${i}.`;
      const id = layerBlockId(i);
      const streamed = pager?.isStreamed(id) ?? false;
      const dense = L.mlp.kind === 'dense';
      // Compute near data: a streamed dense layer's first split.inter MLP channels stay in host memory.
      const c = streamed && dense && split ? split.inter : 0;
      // Every tensor of the layer: a hot buffer, or a place in the streamed block's master copy.
      const dst = {} as Record<keyof LayerWeights, Dst>;
      for (const t of c > 0 ? splitLayouts[i] : layouts[i]) {
        if (streamed) {
          dst[t.name] = { block: id, tensor: t.name, dtype: t.dtype };
          streamedBytes += t.length * DTYPE_BYTES[t.dtype];
          storedBytes[t.dtype] = (storedBytes[t.dtype] ?? 0) + t.length * DTYPE_BYTES[t.dtype];
        } else dst[t.name] = alloc(t.length, `${p}${t.name}`, t.dtype);
      }
      await put(dst.attnNorm, L.inputNorm);
      await put(dst.qkv, L.q, 0);
      await put(dst.qkv, L.k, nq * hd * H);
      if (dst.qkvTail) await put(dst.qkvTail, L.v, 0);
      else await put(dst.qkv, L.v, (nq + nkv) * hd * H);
      await put(dst.o, L.o);
      await put(dst.mlpNorm, L.postAttentionNorm);
      if (L.qBias && L.kBias && L.vBias) {
        await put(dst.qkvBias, L.qBias, 0);
        await put(dst.qkvBias, L.kBias, nq * hd);
        await put(dst.qkvBias, L.vBias, (nq + nkv) * hd);
      }
      if (L.oBias) await put(dst.oBias, L.oBias);
      if (L.qNorm && L.kNorm) {
        await put(dst.qNorm, L.qNorm);
        await put(dst.kNorm, L.kNorm);
      }
      if (L.mlp.kind === 'moe') {
        const I = spec.moe!.moeIntermediateSize;
        await put(dst.router, L.mlp.router);
        for (const [e, x] of L.mlp.experts.entries()) {
          await put(dst.expertsGateUp, x.gate, e * 2 * I * H);
          await put(dst.expertsGateUp, x.up, e * 2 * I * H + I * H);
          await put(dst.expertsDown, x.down, e * H * I);
        }
      } else if (c === 0) {
        const I = spec.intermediateSize;
        await put(dst.gateUp, L.mlp.gate, 0);
        await put(dst.gateUp, L.mlp.up, I * H);
        await put(dst.down, L.mlp.down);
      } else {
        const mlp = L.mlp;
        // Split: channels [c, I) go to the streamed block, [0, c) to host-tier buffers.
        const I = spec.intermediateSize;
        const g = (dst.gateUp as { dtype: DType }).dtype;
        const hostGU = alloc(2 * c * H, `${p}mlp.host.gate_up`, g, split!.tier);
        const hostDown = alloc(H * c, `${p}mlp.host.down`, (dst.down as { dtype: DType }).dtype, split!.tier);
        const hostNorm = alloc(H, `${p}mlp.host.norm`, (dst.mlpNorm as { dtype: DType }).dtype, split!.tier);
        hostPartBytes += hostGU.byteLength + hostDown.byteLength + hostNorm.byteLength;
        await put(hostNorm, L.postAttentionNorm);
        await putRows(dst.gateUp, mlp.gate, c, I, H, 0);
        await putRows(hostGU, mlp.gate, 0, c, H, 0);
        progress(mlp.gate);
        await putRows(dst.gateUp, mlp.up, c, I, H, (I - c) * H);
        await putRows(hostGU, mlp.up, 0, c, H, c * H);
        progress(mlp.up);
        const down = await read(hostDown.dtype, mlp.down);
        store(dst.down, columns(down, H, I, c, I), 0);
        store(hostDown, columns(down, H, I, 0, c), 0);
        progress(mlp.down);
        hostParts[i] = { normWeight: hostNorm, gateUp: hostGU, down: hostDown, inter: c };
      }
      layers.push(streamed ? undefined : (dst as unknown as LayerWeights));
    }
    // Host-part buffers were counted as mapped (host-tier) bytes by alloc.
    const hotBytes = bytes;
    bytes += streamedBytes + mappedBytes;
    return {
      embed,
      lmHead,
      finalNorm,
      invFreq,
      layers,
      bytes,
      hotBytes,
      buffers,
      ...(pager ? { pager } : {}),
      ...(hostPartBytes > 0 ? { hostParts } : {}),
      format: { ...checkpointFormat(ckpt), storedBytes },
    };
  } catch (e) {
    // Leave the backend as we found it.
    for (const b of buffers) backend.free(b);
    throw e;
  }
}

/**
 * Bytes of `w` that a decode step does not read: an embedding table that is not also the LM head
 * (untied, or a stage without the head) gives one row a token, not its whole table.
 */
export function gatheredOnlyBytes(w: ModelWeights, vocabSize: number): number {
  return w.embed && w.embed !== w.lmHead ? w.embed.byteLength - w.embed.byteLength / vocabSize : 0;
}

/** The checkpoint's format and tensor types; not exact when any tensor is block-quantized. */
export function checkpointFormat(ckpt: WeightStore): Omit<WeightFormat, 'storedBytes'> {
  const types: Record<string, number> = {};
  let gguf = false;
  let exact = true;
  for (const name of ckpt.names()) {
    const info = ckpt.info(name);
    gguf ||= info.ggmlType !== undefined;
    const type = info.ggmlType ?? info.dtype;
    types[type] = (types[type] ?? 0) + 1;
    if (quantDtypeOf(ckpt, name)) exact = false;
  }
  return { file: gguf ? 'gguf' : 'safetensors', types, exact };
}

/**
 * The note a run over block-quantized weights carries (ledger, stderr): what it is exact with
 * respect to, and how many bytes the backend holds as f32 in place of blocks. Undefined when exact.
 */
export function weightFormatNote(f: WeightFormat): string | undefined {
  if (f.exact) return undefined;
  const quant = Object.entries(f.types)
    .filter(([t]) => quantDtypeOfType(t) !== undefined)
    .map(([t, n]) => `${t} x${n}`)
    .join(', ');
  const held = Object.entries(f.storedBytes)
    .map(([d, b]) => `${d} ${b}`)
    .join(', ');
  return `quantized weights (${quant}): not exact with respect to the original model, only to its dequantized weights; bytes held by dtype: ${held}`;
}

function quantDtypeOfType(t: string): QuantDType | undefined {
  const d = dtypeOfGgml(t as GgmlTypeName);
  return d !== undefined && isQuantDType(d) ? d : undefined;
}

export function freeWeights(backend: DeviceBackend, w: ModelWeights): void {
  for (const b of w.buffers) backend.free(b);
  w.buffers.length = 0;
  w.pager?.dispose();
}

/** KV cache element types: float32 keys and values, or bf16 (half the bytes a token). */
export type KvCacheDtype = 'f32' | 'bf16';
export const KV_CACHE_DTYPES: readonly ('auto' | KvCacheDtype)[] = ['auto', 'f32', 'bf16'];

/**
 * The KV cache dtype. 'auto' (default): float32 under exact numerics (keys and values as the
 * projections computed them), bf16 under bf16 numerics (transformers' cache holds bf16). 'bf16'
 * under exact numerics rounds each key and value once when it is stored (what a bf16 PyTorch
 * model's cache holds; halves the cache's bytes); 'f32' under bf16 numerics is refused (that mode
 * reproduces transformers' bf16 cache).
 */
export function kvDtypeOf(backend: DeviceBackend, requested: 'auto' | KvCacheDtype = 'auto'): KvCacheDtype {
  const numerics = backend.capabilities.numerics ?? 'exact';
  if (!KV_CACHE_DTYPES.includes(requested)) throw new RangeError(`kvCacheDtype must be ${KV_CACHE_DTYPES.join(', ')}, got ${String(requested)}`);
  if (requested === 'f32' && numerics === 'bf16') throw new RangeError("kvCacheDtype 'f32' contradicts bf16 numerics (whose cache holds bf16, as transformers' does)");
  if (requested !== 'auto') return requested;
  return numerics === 'bf16' ? 'bf16' : 'f32';
}

