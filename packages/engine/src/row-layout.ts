import type { KvCacheManager } from '@nerva/kv';
import type { Request } from './request.js';
import type { ScheduledRequest } from './scheduler.js';

/** A decode step's rows in the places the device holds them; undefined: a hole, computed as a pad row. */
export type RowOrder = readonly (ScheduledRequest | undefined)[];

/**
 * The rows of the device's decode state, each in its place. A row whose request finished stays
 * as a hole (a pad row: position 0, no KV slot, only the null block in its table) while the live
 * rows still need the same graph bucket, so the others keep their places and the steps after its
 * last token can be enqueued ahead of the host (RunAhead). Compacting the batch would move every
 * row after it, and with them the ids, positions and slots the device keeps for itself. A step
 * whose rows need a smaller bucket, or that writes its state afresh without holes, compacts.
 */
export class RowLayout {
  /** The request of each row (a finished one keeps its place until the layout compacts). */
  private rows: Request[] = [];
  private readonly index = new Map<Request, number>();
  /** Graph bucket of the layout (0: none). */
  bucket = 0;
  /** Rows the device computes as pad rows now. */
  private readonly pads: boolean[] = [];

  /**
   * The scheduled decode rows in the layout's places, holes where a request finished; undefined
   * where the layout cannot hold them: a row not in it, or a bucket other than its own.
   */
  arrange(scheduled: readonly ScheduledRequest[], bucket: number): RowOrder | undefined {
    if (this.bucket === 0 || bucket !== this.bucket) return undefined;
    const out: (ScheduledRequest | undefined)[] = new Array(this.rows.length).fill(undefined);
    for (const s of scheduled) {
      const k = this.index.get(s.req);
      if (k === undefined) return undefined;
      out[k] = s;
    }
    return out;
  }

  /**
   * A graph step ran with these rows: its holes are pad rows on the device (it wrote them, or its
   * key, equal to the device's, says they are). A hole keeps the request its row had.
   */
  place(order: RowOrder, bucket: number): void {
    const rows = order.map((s, k) => s?.req ?? this.rows[k]);
    this.rows = rows;
    this.index.clear();
    rows.forEach((r, k) => this.index.set(r, k));
    this.pads.length = rows.length;
    for (let k = 0; k < rows.length; k++) this.pads[k] = order[k] === undefined;
    this.bucket = bucket;
  }

  /** A step outside the graphs rewrote the device's rows: the next graph step starts a layout. */
  clear(): void {
    this.rows = [];
    this.index.clear();
    this.pads.length = 0;
    this.bucket = 0;
  }

  isPad(k: number): boolean {
    return this.pads[k] === true;
  }

  /** Row k is a pad row on the device from now on (RunAhead wrote its state). */
  setPad(k: number): void {
    this.pads[k] = true;
  }
}

/**
 * The identity of a graph pass: its bucket, whether tiered, and each row's request and table
 * length ('-' for a pad row). Equal keys: the device's step state is this pass's.
 */
export function passKey(kv: KvCacheManager, bucket: number, tiered: boolean, order: RowOrder, pad: (k: number) => boolean = (k) => order[k] === undefined): string {
  let key = `${bucket}|${tiered}|`;
  for (let k = 0; k < order.length; k++) {
    const s = order[k];
    key += k > 0 ? ',' : '';
    key += s === undefined || pad(k) ? '-' : `${s.req.id}:${kv.blockTable(s.req.id).length}`;
  }
  return key;
}
