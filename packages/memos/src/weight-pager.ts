import type { DeviceBackend, DeviceBuffer, EventHandle, HostArray, StreamHandle, Tier } from '@nerva/core';
import { DTYPE_BYTES, isQuantDType } from '@nerva/core';
import { PagerStateError } from './errors.js';
import type { ResidencyPlan } from './planner.js';
import { DiskSpill, type SpillTensor } from './spill.js';
import { RingState, StagingSchedule } from './staging-ring.js';

/** One tensor of a paged block (a layer's qkv, o, ...), by name. */
export type PagedTensor = SpillTensor;

/** A block's tensors as buffers, by name. */
export type TensorSet = Readonly<Record<string, DeviceBuffer>>;

export interface WeightPagerInit {
  backend: DeviceBackend;
  plan: ResidencyPlan;
  /** The tensors of every streamed block; all streamed blocks share one layout (a slot holds any of them). */
  layout: readonly PagedTensor[];
  /** Host tier for the replicas of streamed blocks ('pinned' on a GPU; any host tier on the CPU backend). */
  hostTier: Tier;
  /** Stream the loads run on; omitted: a stream of the pager's own on a VRAM backend, else the compute stream. */
  copyStream?: StreamHandle;
  /** Required when the plan puts blocks on disk. */
  offloadDir?: string;
}

export interface PagerStats {
  /** Forward passes the ring served (eager or replayed). */
  passes: number;
  /** Loads into staging slots (one per streamed block per pass). */
  loads: number;
  h2dBytes: number;
  diskReadBytes: number;
  diskReadMs: number;
  /** Loads that were already under way when the block was acquired. */
  hits: number;
  /** Loads issued at the point of use (the ring was not primed). */
  stalls: number;
  /** Host waits for the copy stream (disk-tier bounce buffers only). */
  hostWaits: number;
}

/**
 * The weight pager: streamed blocks live in a host tier (or on disk) and pass through a ring of
 * staging slots in the compute tier, each loaded on the copy stream as soon as the block before
 * it in the slot is done, so the copy of block j+k overlaps the compute of blocks j+1..j+k-1.
 * Every move is an ordered op on a stream (copy, record, wait): no host sync on the hot path and
 * nothing allocated after construction, so a pass can be captured as a graph and replayed.
 *
 * Protocol per forward pass: acquire(id) -> compute with the returned tensors -> release(id), for
 * every streamed block in execution order, then endPass(stream).
 */
export class WeightPager {
  readonly backend: DeviceBackend;
  readonly plan: ResidencyPlan;
  readonly schedule: StagingSchedule;
  readonly ring: RingState;
  private readonly layout: readonly PagedTensor[];
  private readonly index = new Map<string, number>();
  private readonly host = new Map<string, TensorSet>();
  private readonly slotSets: TensorSet[] = [];
  /** Host bounce buffers per slot for disk-tier blocks, and the byte buffers reads land in. */
  private readonly bounce: TensorSet[] = [];
  private readonly readBufs: Uint8Array[] = [];
  private readonly loaded: EventHandle[] = [];
  private readonly consumed: EventHandle[] = [];
  private readonly issuedThisPass: boolean[];
  private readonly owned: DeviceBuffer[] = [];
  private readonly copyStream: StreamHandle | undefined;
  private readonly ownsCopyStream: boolean;
  /** The host tier of master copies (and of blocks read in place). */
  readonly hostTier: Tier;
  readonly spill: DiskSpill | undefined;
  private readonly blockBytes: number;
  private st: PagerStats = { passes: 0, loads: 0, h2dBytes: 0, diskReadBytes: 0, diskReadMs: 0, hits: 0, stalls: 0, hostWaits: 0 };
  private capturing = false;
  private capturedLoads = 0;

  constructor(init: WeightPagerInit) {
    const { backend, plan, layout } = init;
    if (plan.mode !== 'paged') throw new PagerStateError('a weight pager needs a paged plan');
    this.backend = backend;
    this.plan = plan;
    this.layout = layout;
    this.hostTier = init.hostTier;
    this.blockBytes = layout.reduce((s, t) => s + t.length * DTYPE_BYTES[t.dtype], 0);
    if (this.blockBytes > plan.slotBytes) throw new PagerStateError(`a block of ${this.blockBytes} bytes does not fit a slot of ${plan.slotBytes}`);
    this.schedule = new StagingSchedule(plan.streamed, plan.slots);
    this.ring = new RingState(this.schedule, () => this.blockBytes, backend.capabilities.computeTier === 'vram' ? 'vram' : 'dram');
    plan.streamed.forEach((id, i) => this.index.set(id, i));
    this.issuedThisPass = new Array(plan.slots).fill(false);
    // A backend computing in VRAM has copy engines: loads get a stream of their own (created after
    // the checks above, so a refused plan leaves nothing behind; the catch below destroys it).
    this.ownsCopyStream = init.copyStream === undefined && backend.capabilities.computeTier === 'vram';
    this.copyStream = init.copyStream ?? (this.ownsCopyStream ? backend.createStream() : undefined);
    const disk = plan.streamed.filter((id) => plan.placements.get(id)?.home === 'disk');
    try {
      if (disk.length > 0) {
        if (!init.offloadDir) throw new PagerStateError('the plan puts blocks on disk but no offload dir was given');
        this.spill = DiskSpill.open(init.offloadDir, new Map(disk.map((id) => [id, layout])));
      }
      const set = (tier: Tier | undefined, label: string, usage: 'weights' | 'io'): TensorSet => {
        const out: Record<string, DeviceBuffer> = {};
        for (const t of layout) {
          const b = backend.alloc({ dtype: t.dtype, length: t.length, usage, label: `${label}.${t.name}`, ...(tier ? { tier } : {}) });
          this.owned.push(b);
          out[t.name] = b;
        }
        return Object.freeze(out);
      };
      for (const id of plan.streamed) {
        if (plan.placements.get(id)?.home === 'pinned') this.host.set(id, set(init.hostTier, `host.${id}`, 'weights'));
      }
      for (let s = 0; s < plan.slots; s++) {
        this.slotSets.push(set(undefined, `slot.${s}`, 'weights'));
        this.loaded.push(backend.createEvent());
        this.consumed.push(backend.createEvent());
        if (this.spill) {
          this.bounce.push(set(init.hostTier, `bounce.${s}`, 'io'));
          this.readBufs.push(new Uint8Array(Math.max(...layout.map((t) => t.length * DTYPE_BYTES[t.dtype]))));
        }
      }
    } catch (e) {
      this.dispose();
      throw e;
    }
  }

  /** Whether a pass can be captured and replayed (disk reads are host work a graph cannot replay). */
  get capturable(): boolean {
    return this.spill === undefined;
  }

  isStreamed(id: string): boolean {
    return this.index.has(id);
  }

  /**
   * The slot tensors block `id` always passes through (block j uses slot j mod k every pass), for
   * building op arguments once; read them only between acquire and release.
   */
  slotFor(id: string): TensorSet {
    return this.slotSets[this.schedule.slotOf(this.indexOf(id))];
  }

  /** Bytes of host-tier memory the pager holds (master copies and bounce buffers). */
  get hostBytes(): number {
    return this.owned.filter((b) => b.tier === this.hostTier).reduce((s, b) => s + b.byteLength, 0);
  }

  /** Bytes of compute-tier memory the ring holds. */
  get slotBytes(): number {
    return this.plan.slots * this.blockBytes;
  }

  /** Store loaded weights into a streamed block's master copy (host replica or spill file). */
  store(id: string, tensor: string, src: HostArray, elementOffset = 0): void {
    const h = this.host.get(id);
    if (h) {
      const b = h[tensor];
      if (!b) throw new PagerStateError(`block ${id} has no tensor ${tensor}`);
      this.backend.write(b, src, elementOffset);
      return;
    }
    if (this.spill && this.index.has(id)) {
      this.spill.write(id, tensor, src, elementOffset);
      return;
    }
    throw new PagerStateError(`block ${id} is not streamed`);
  }

  /** Issue the loads that start a pass (once, after every block was stored). */
  prime(stream?: StreamHandle): void {
    for (const i of this.schedule.initial()) if (this.ring.occupantOf(this.schedule.slotOf(i)) !== i) this.load(i);
    this.join(stream);
  }

  /** Wait (in stream order) for the streamed block `id` and return the slot tensors holding it. */
  acquire(id: string, stream?: StreamHandle): TensorSet {
    const i = this.indexOf(id);
    // The protocol is checked before anything moves: a refused acquire leaves the ring as it was.
    const expected = this.ring.expected;
    if (i !== expected) throw new PagerStateError(`streamed blocks are used in order: expected ${this.schedule.order[expected]}, got ${id}`);
    if (this.inUse(id)) throw new PagerStateError(`block ${id} is already acquired`);
    const slot = this.schedule.slotOf(i);
    if (this.ring.occupantOf(slot) !== i) {
      this.st.stalls++;
      this.load(i);
    } else if (!this.capturing) this.st.hits++; // a captured pass's hits are counted when it is replayed
    if (this.issuedThisPass[slot] && this.copyStream !== undefined) this.backend.waitEvent(stream ?? { id: 0 }, this.loaded[slot]);
    this.issuedThisPass[slot] = false;
    this.ring.loadAwaited(i);
    this.ring.acquire(i);
    return this.slotSets[slot];
  }

  /** Compute enqueued on `stream` is done with `id`: its slot takes the next block on the copy stream. */
  release(id: string, stream?: StreamHandle): void {
    const i = this.indexOf(id);
    const slot = this.schedule.slotOf(i);
    this.ring.release(i);
    if (this.copyStream !== undefined) this.backend.record(this.consumed[slot], stream);
    this.load(this.schedule.nextAfter(i).index);
  }

  /** End of a forward pass: the compute stream waits for the loads that start the next one. */
  endPass(stream?: StreamHandle): void {
    if (this.ring.expected !== 0) throw new PagerStateError(`pass ended after ${this.ring.expected} of ${this.schedule.length} streamed blocks`);
    const first = this.schedule.order[0];
    if (first !== undefined && this.inUse(first)) throw new PagerStateError(`pass ended while block ${first} is acquired and not released`);
    this.join(stream);
    // Recording a pass serves none: `replayed` counts each replay of it.
    if (!this.capturing) this.st.passes++;
  }

  /** A captured pass is about to be recorded: loads issued until `endCapture` are replayed with it. */
  beginCapture(): void {
    this.capturing = true;
    this.capturedLoads = 0;
  }

  endCapture(): void {
    this.capturing = false;
  }

  /** A captured pass was replayed: account for the loads it made. */
  replayed(): void {
    this.st.passes++;
    this.st.loads += this.capturedLoads;
    this.st.h2dBytes += this.capturedLoads * this.blockBytes;
    this.st.hits += this.capturedLoads;
  }

  stats(): PagerStats {
    return { ...this.st, diskReadBytes: this.spill?.readBytes ?? 0, diskReadMs: this.spill?.readMs ?? 0 };
  }

  private join(stream: StreamHandle | undefined): void {
    for (let s = 0; s < this.plan.slots; s++) {
      if (this.issuedThisPass[s] && this.copyStream !== undefined) this.backend.waitEvent(stream ?? { id: 0 }, this.loaded[s]);
      this.issuedThisPass[s] = false;
    }
  }

  private inUse(id: string): boolean {
    return this.ring.blocks.get(id)?.state(this.ring.slotTier) === 'InUse';
  }

  private indexOf(id: string): number {
    const i = this.index.get(id);
    if (i === undefined) throw new PagerStateError(`block ${id} is not streamed`);
    return i;
  }

  /** Enqueue the copy of block `i` into its slot after the slot's last reader. */
  private load(i: number): void {
    const slot = this.schedule.slotOf(i);
    const id = this.schedule.order[i];
    const cs = this.copyStream;
    if (cs !== undefined && this.ring.occupantOf(slot) !== undefined) this.backend.waitEvent(cs, this.consumed[slot]);
    let src = this.host.get(id);
    if (!src) {
      // Disk tier: read into the slot's bounce buffers once the copy out of them has finished.
      if (cs !== undefined) {
        this.backend.synchronize('hard', cs);
        this.st.hostWaits++;
      }
      const bounce = this.bounce[slot];
      const buf = this.readBufs[slot];
      for (const t of this.layout) {
        this.spill!.readInto(id, t.name, buf);
        const n = t.length;
        const view = isQuantDType(t.dtype) ? new Uint8Array(buf.buffer, 0, n * DTYPE_BYTES[t.dtype]) : DTYPE_BYTES[t.dtype] === 2 ? new Uint16Array(buf.buffer, 0, n) : t.dtype === 'i32' ? new Int32Array(buf.buffer, 0, n) : new Float32Array(buf.buffer, 0, n);
        this.backend.write(bounce[t.name], view);
      }
      src = bounce;
    }
    const dst = this.slotSets[slot];
    for (const t of this.layout) this.backend.copy(dst[t.name], src[t.name], t.length, 0, 0, cs);
    if (cs !== undefined) this.backend.record(this.loaded[slot], cs);
    this.issuedThisPass[slot] = true;
    this.ring.loadIssued(i);
    if (this.capturing) this.capturedLoads++;
    else {
      this.st.loads++;
      this.st.h2dBytes += this.blockBytes;
    }
  }

  dispose(): void {
    for (const b of this.owned) this.backend.free(b);
    this.owned.length = 0;
    for (const e of [...this.loaded, ...this.consumed]) this.backend.destroyEvent(e);
    this.loaded.length = 0;
    this.consumed.length = 0;
    this.spill?.dispose();
    if (this.ownsCopyStream && this.copyStream) this.backend.destroyStream(this.copyStream);
  }
}
