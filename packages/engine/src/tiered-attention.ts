import type { StreamHandle } from '@nerva/core';
import { type KvPageCopy, RunnerBase } from './runner-base.js';

/** The default stream (id 0 on every backend), for waits that need a stream handle. */
const DEFAULT_STREAM: StreamHandle = Object.freeze({ id: 0 });

/**
 * Paged attention of a runner's layers, and tiered KV: a tiered pass merges the device's partial
 * over hot pages with a host partial over warm pages (on a side stream) and, with a link share,
 * a partial over warm pages staged into VRAM one layer ahead by the copy engine.
 */
export abstract class AttentionRunner extends RunnerBase {
  /**
   * Tiered KV with linkPages: the leading warm slots each layer's staging copies this pass (set by
   * the engine before forward; a captured graph keeps the value it was captured with).
   */
  linkSpan = 0;
  /**
   * Tiered KV: whether this pass's tables give the host any warm page (set by the engine before
   * forward, like linkSpan). Without one the pass runs no host partial.
   */
  hostPages = true;
  /** Forward passes run with host partials over warm pages. */
  tieredPasses = 0;
  /**
   * Set (by the engine, around one eager pass) when every row of the pass belongs to one
   * sequence: op attention gets `oneSequence`, so a backend may skip what sequence seams need.
   */
  oneSequence = false;

  /** The pass being enqueued merges host partials over warm pages. */
  protected tiered = false;

  /**
   * Paged attention of layer l over the q heads of act.qkv -> act.attn (both forward paths). In a
   * tiered pass: the warm partial runs on the side stream (on the host, where the pages lie) while
   * the hot partial runs here, and attention_merge joins them (the online-softmax rule: exact).
   */
  protected attend(l: number, rows: number): void {
    if (this.tiered) return this.attendTiered(l, rows);
    this.op('attention', 'attention', {
      ...this.queryArgs(l, rows),
      kCache: this.kCache[l],
      vCache: this.vCache[l],
      out: this.act.attn,
      blockTables: this.meta.blockTables,
      ...(this.oneSequence ? { oneSequence: true } : {}),
    });
  }

  /** Op attention's arguments that say which queries attend where: the same for every partial. */
  protected queryArgs(l: number, rows: number) {
    const s = this.spec;
    const m = this.meta;
    return {
      q: this.act.qkv,
      rowSeq: m.rowSeq,
      positions: m.positions,
      rows,
      numHeads: s.numHeads,
      numKvHeads: s.numKvHeads,
      headDim: s.headDim,
      blockSize: this.limits.blockSize,
      maxBlocksPerSeq: this.limits.maxBlocksPerSeq,
      qRowStride: this.qkvOut,
      qOffset: 0,
      scale: 1 / Math.sqrt(s.headDim),
      // A sliding layer masks to its window (every partial does: positions outside it are in none).
      ...this.windowArg(l),
    };
  }

  /** `window` for op attention on a sliding layer; nothing on a full-attention one. */
  protected windowArg(l: number): { window?: number } {
    const w = this.windows[l];
    return w > 0 ? { window: w } : {};
  }

  protected attendTiered(l: number, rows: number): void {
    const s = this.spec;
    const m = this.meta;
    const a = this.act;
    const be = this.backend;
    const common = this.queryArgs(l, rows);
    const hostPartial = this.hostPages;
    const main = this.stream;
    if (hostPartial) {
      const side = this.sideStream!;
      be.record(this.forkEv!, this.stream);
      be.waitEvent(side, this.forkEv!);
      this.stream = side;
      this.op('attention', 'attention', {
        ...common,
        kCache: this.kWarm[l],
        vCache: this.vWarm[l],
        out: a.warmOut,
        lse: a.warmLse,
        blockTables: m.warmTables!,
        qHost: a.qHost,
        outHost: a.outHost,
        lseHost: a.lseHost,
      });
      be.record(this.joinEv!, side);
      this.stream = main;
    }
    this.op('attention', 'attention', { ...common, kCache: this.kCache[l], vCache: this.vCache[l], out: a.attn, lse: a.hotLse, blockTables: m.blockTables });
    if (this.linkStream) {
      // The device's own partial over the warm pages staged for this layer (copied a layer
      // ahead), merged before the host's result is awaited; then the buffer takes layer l + 2's.
      const b = (l - this.firstLayer) % 2;
      be.waitEvent(main ?? DEFAULT_STREAM, this.staged[b]);
      this.op('attention', 'attention', { ...common, kCache: this.kStage[b], vCache: this.vStage[b], out: a.linkOut, lse: a.linkLse, blockTables: m.linkTables! });
      this.op('attention', 'attention_merge', { out: a.attn, lse: a.hotLse, other: a.linkOut, otherLse: a.linkLse, rows, numHeads: s.numHeads, headDim: s.headDim });
      if (l + 2 < this.endLayer) {
        be.record(this.stageFree[b], main);
        be.waitEvent(this.linkStream, this.stageFree[b]);
        this.stage(l + 2, b);
      }
    }
    if (hostPartial) {
      be.waitEvent(main ?? DEFAULT_STREAM, this.joinEv!);
      this.op('attention', 'attention_merge', { out: a.attn, lse: a.hotLse, other: a.warmOut, otherLse: a.warmLse, rows, numHeads: s.numHeads, headDim: s.headDim });
    }
  }

  /** Starts a tiered pass's staging: the first two layers' pages, after the step's tables are written. */
  protected beginStaging(): void {
    const be = this.backend;
    be.record(this.linkFork!, this.stream);
    be.waitEvent(this.linkStream!, this.linkFork!);
    for (let l = this.firstLayer; l < Math.min(this.endLayer, this.firstLayer + 2); l++) this.stage(l, (l - this.firstLayer) % 2);
  }

  /**
   * Copies layer l's leading linkSpan warm slots from the pinned pool into buffer b, on the link
   * stream. Copies, not a gather kernel: a kernel reading mapped host memory holds SMs while it
   * waits on the link and its time added to the step's (measured: 455 MB of warm KV a token cost
   * 8.3 ms on top of an 8 ms step); the copy engine overlaps the layers before it.
   */
  protected stage(l: number, b: number): void {
    const n = this.linkSpan * this.limits.blockSize * this.spec.numKvHeads * this.spec.headDim;
    if (n > 0) {
      this.backend.copy(this.kStage[b], this.kWarm[l], n, 0, 0, this.linkStream);
      this.backend.copy(this.vStage[b], this.vWarm[l], n, 0, 0, this.linkStream);
    }
    this.backend.record(this.staged[b], this.linkStream);
  }

  /**
   * Tiered KV page moves between the hot and warm pools, every layer, in order on the compute
   * stream (a page's slot is vacated before it is reused). `rows` of each pool are blockSize.
   */
  copyKvPage(c: KvPageCopy): void {
    const w = this.spec.numKvHeads * this.spec.headDim * this.limits.blockSize;
    for (let l = this.firstLayer; l < this.endLayer; l++) {
      const [kd, vd] = c.to === 'hot' ? [this.kCache[l], this.vCache[l]] : [this.kWarm[l], this.vWarm[l]];
      const [ks, vs] = c.from === 'hot' ? [this.kCache[l], this.vCache[l]] : [this.kWarm[l], this.vWarm[l]];
      this.backend.copy(kd, ks, w, c.toSlot * w, c.fromSlot * w, this.stream);
      this.backend.copy(vd, vs, w, c.toSlot * w, c.fromSlot * w, this.stream);
    }
  }

  /** A warm page's K and V of every layer, read to the host (cold-tier spill): [layers][K | V]. */
  readWarmPage(slot: number): Float32Array {
    const w = this.spec.numKvHeads * this.spec.headDim * this.limits.blockSize;
    const n = this.endLayer - this.firstLayer;
    const out = new Float32Array(2 * n * w);
    for (let l = this.firstLayer; l < this.endLayer; l++) {
      const i = l - this.firstLayer;
      out.set(this.backend.read(this.kWarm[l], slot * w, w) as Float32Array, 2 * i * w);
      out.set(this.backend.read(this.vWarm[l], slot * w, w) as Float32Array, (2 * i + 1) * w);
    }
    return out;
  }

  /** The inverse of readWarmPage: a page read back from the cold tier into warm slot `slot`. */
  writeWarmPage(slot: number, data: Float32Array): void {
    const w = this.spec.numKvHeads * this.spec.headDim * this.limits.blockSize;
    for (let l = this.firstLayer; l < this.endLayer; l++) {
      const i = l - this.firstLayer;
      this.backend.write(this.kWarm[l], data.subarray(2 * i * w, (2 * i + 1) * w), slot * w);
      this.backend.write(this.vWarm[l], data.subarray((2 * i + 1) * w, (2 * i + 2) * w), slot * w);
    }
  }
}
