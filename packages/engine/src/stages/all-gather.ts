/**
 * The all-gather of a tensor-parallel group: each shard computed a column slice of a
 * [rows, total] activation (its output rows of a projection, as a contiguous [rows, width]
 * buffer); afterwards every destination shard holds the whole [rows, total] activation, each
 * element the very float its shard computed (copies only, no arithmetic, so gathering cannot
 * change a bit).
 *
 * The slices travel over stage links (links.ts), the same mechanism pipeline stages hand hidden
 * states through: a copy on one backend, host copies between CPU backends, NCCL between GPUs.
 * Each destination receives every other shard's slice into a staging buffer made up front and
 * places its rows at the slice's column offset, so a gather never allocates.
 */
import type { DeviceBackend, DeviceBuffer, StreamHandle } from '@nerva/core';
import { NervaError } from '@nerva/core';
import { makeStageLink, type NcclPointToPoint } from './links.js';
import type { StageLink } from './plan.js';

/** Copy columns [offset, offset + width) of `rows` rows of a [rows, total] buffer into a [rows, width] one (or back, `toSlice` false). */
export function copyColumns(backend: DeviceBackend, slice: DeviceBuffer, full: DeviceBuffer, rows: number, total: number, offset: number, width: number, toSlice: boolean, stream?: StreamHandle): void {
  if (width === total) {
    if (toSlice) backend.copy(slice, full, rows * total, 0, 0, stream);
    else backend.copy(full, slice, rows * total, 0, 0, stream);
    return;
  }
  for (let r = 0; r < rows; r++) {
    if (toSlice) backend.copy(slice, full, width, r * width, r * total + offset, stream);
    else backend.copy(full, slice, width, r * total + offset, r * width, stream);
  }
}

export interface ShardEnd {
  backend: DeviceBackend;
  /** NCCL rank, when shards sit on separate GPUs. */
  rank?: number;
}

export class ShardGather {
  /** links[k][d]: shard k's slice to shard d (undefined for k === d, or a destination not gathered to). */
  private readonly links: (StageLink | undefined)[][] = [];
  /** staging[k][d]: shard k's slice as received on shard d. */
  private readonly staging: (DeviceBuffer | undefined)[][] = [];
  private closed = false;

  /**
   * @param ends the shards' backends, in shard order
   * @param slices each shard's columns of the gathered activation
   * @param total the gathered row width
   * @param destinations the shards that receive the whole activation (default: every shard)
   */
  constructor(
    private readonly ends: readonly ShardEnd[],
    private readonly slices: readonly { offset: number; width: number }[],
    private readonly total: number,
    readonly maxRows: number,
    readonly label: string,
    private readonly destinations: readonly number[] = ends.map((_, i) => i),
    nccl?: NcclPointToPoint,
  ) {
    const N = ends.length;
    if (slices.length !== N) throw new RangeError(`${label}: ${slices.length} slices for ${N} shards`);
    let at = 0;
    for (const s of slices) {
      if (s.offset !== at || s.width < 1) throw new RangeError(`${label}: slices must tile [0, ${total}) in shard order`);
      at += s.width;
    }
    if (at !== total) throw new RangeError(`${label}: slices cover ${at} of ${total} columns`);
    try {
      for (let k = 0; k < N; k++) {
        this.links.push([]);
        this.staging.push([]);
        for (let d = 0; d < N; d++) {
          if (d === k || !destinations.includes(d)) {
            this.links[k].push(undefined);
            this.staging[k].push(undefined);
            continue;
          }
          const shape = { fromStage: k, toStage: d, rowWidth: slices[k].width, maxRows, dtype: 'f32' as const };
          this.links[k].push(makeStageLink(ends[k], ends[d], shape, nccl ? { nccl } : {}));
          this.staging[k].push(ends[d].backend.alloc({ dtype: 'f32', length: maxRows * slices[k].width, usage: 'activations', label: `${label}.from${k}.to${d}` }));
        }
      }
    } catch (e) {
      this.close();
      throw e;
    }
  }

  /**
   * Gather `rows` rows: parts[k] ([rows, width_k] on shard k) into fulls[d] ([rows, total] on
   * each destination d). A destination's own slice is copied from its part as well, so fulls[d]
   * may be the buffer the parts were computed from (an accumulate into a copied slice).
   */
  gather(parts: readonly DeviceBuffer[], fulls: readonly (DeviceBuffer | undefined)[], rows: number): void {
    if (this.closed) throw new NervaError('SHARD_GATHER', `${this.label}: gather after close`);
    if (rows > this.maxRows) throw new NervaError('SHARD_GATHER', `${this.label}: ${rows} rows, at most ${this.maxRows}`);
    if (rows === 0) return;
    const N = this.ends.length;
    for (let k = 0; k < N; k++)
      for (let d = 0; d < N; d++) {
        const link = this.links[k][d];
        if (!link) continue;
        link.send(parts[k], rows);
        link.recv(this.staging[k][d]!, rows);
      }
    for (const d of this.destinations) {
      const full = fulls[d];
      if (!full) throw new NervaError('SHARD_GATHER', `${this.label}: no destination buffer for shard ${d}`);
      for (let k = 0; k < N; k++) {
        const src = k === d ? parts[d] : this.staging[k][d]!;
        copyColumns(this.ends[d].backend, src, full, rows, this.total, this.slices[k].offset, this.slices[k].width, false);
      }
    }
  }

  /** How the slices travel (the kinds of the links between shards); empty for one shard. */
  get linkKinds(): string[] {
    return [...new Set(this.links.flat().filter((l): l is StageLink => l !== undefined).map((l) => l.kind))];
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const row of this.links) for (const l of row) l?.close();
    this.staging.forEach((row) => row.forEach((b, d) => b && this.ends[d].backend.free(b)));
  }
}
