/**
 * The engine's stage links: how a pipeline stage hands rows (hidden states, sampled tokens,
 * logits) to another stage. The interface is `StageLink` of `@nerva/core`; which link a pair of
 * stages gets follows from where they run:
 *
 * - one backend object for both (`SameBackendStageLink`): a copy between the two stages' buffers on
 *   the stream, `'in-process'` on the CPU backend and `'device-copy'` on a GPU;
 * - two backends whose memory is host memory (`HostStageLink`, CPU backends): the rows are read
 *   without a sync and written into the receiver through a host buffer made up front;
 * - two CUDA backends on different GPUs (`NcclStageLink`): NCCL send/recv, either on dedicated
 *   streams through staging buffers (hidden states: the sender's next micro-batch overlaps the
 *   transfer) or directly between the callers' buffers on their streams (tokens, logits).
 *
 * Every link allocates what it needs when it is made, so a handoff never allocates.
 */
import type { DeviceBackend, DeviceBuffer, DType, EventHandle, StreamHandle } from '@nerva/core';
import { DTYPE_BYTES, NervaError } from '@nerva/core';
import type { StageLink, StageLinkKind } from './plan.js';

/** A stage link was used out of order (recv before send, two sends without a recv) or with a wrong buffer. */
export class StageLinkUsageError extends NervaError {
  constructor(message: string) {
    super('STAGE_LINK', message);
  }
}

/** Stream 0 is the default stream of both backends; waits need a handle for it. */
const DEFAULT_STREAM: StreamHandle = Object.freeze({ id: 0 });

export interface StageLinkShape {
  fromStage: number;
  toStage: number;
  /** Elements per row. */
  rowWidth: number;
  /** Most rows one handoff carries. */
  maxRows: number;
  dtype: DType;
}

/** Argument checks and the send/recv alternation every link keeps. */
abstract class BaseLink implements StageLink {
  abstract readonly kind: StageLinkKind;
  readonly fromStage: number;
  readonly toStage: number;
  readonly rowWidth: number;
  readonly maxRows: number;
  readonly dtype: DType;
  protected closed = false;
  protected pending: { buffer: DeviceBuffer; rows: number; stream: StreamHandle | undefined } | null = null;

  constructor(shape: StageLinkShape) {
    const { fromStage, toStage, rowWidth, maxRows, dtype } = shape;
    for (const [k, v] of Object.entries({ fromStage, toStage })) if (!Number.isInteger(v) || v < 0) throw new RangeError(`stage link: ${k} must be a non-negative integer, got ${v}`);
    for (const [k, v] of Object.entries({ rowWidth, maxRows })) if (!Number.isInteger(v) || v < 1) throw new RangeError(`stage link: ${k} must be a positive integer, got ${v}`);
    if (!(dtype in DTYPE_BYTES)) throw new RangeError(`stage link: unknown dtype ${String(dtype)}`);
    this.fromStage = fromStage;
    this.toStage = toStage;
    this.rowWidth = rowWidth;
    this.maxRows = maxRows;
    this.dtype = dtype;
  }

  protected fail(msg: string): never {
    throw new StageLinkUsageError(`stage link ${this.fromStage}->${this.toStage}: ${msg}`);
  }

  protected check(op: 'send' | 'recv', buffer: DeviceBuffer, rows: number): void {
    if (this.closed) this.fail(`${op} after close`);
    if (!Number.isInteger(rows) || rows < 0 || rows > this.maxRows) this.fail(`${op} of ${rows} rows (0..${this.maxRows} allowed)`);
    if (buffer.dtype !== this.dtype) this.fail(`${op} buffer is ${buffer.dtype}, the link carries ${this.dtype}`);
    if (buffer.length < rows * this.rowWidth) this.fail(`${op} buffer holds ${buffer.length} elements, ${rows} rows need ${rows * this.rowWidth}`);
    if (op === 'send' && this.pending !== null) this.fail(`send before the previous ${this.pending.rows} rows were received`);
    if (op === 'recv') {
      if (this.pending === null) this.fail('recv with nothing sent');
      if (this.pending.rows !== rows) this.fail(`recv of ${rows} rows, ${this.pending.rows} were sent`);
    }
  }

  send(buffer: DeviceBuffer, rows: number, stream?: StreamHandle): void {
    this.check('send', buffer, rows);
    this.onSend(buffer, rows, stream);
    this.pending = { buffer, rows, stream };
  }

  recv(buffer: DeviceBuffer, rows: number, stream?: StreamHandle): void {
    this.check('recv', buffer, rows);
    const p = this.pending!;
    this.pending = null;
    if (rows > 0) this.onRecv(p, buffer, rows, stream);
  }

  protected onSend(_buffer: DeviceBuffer, _rows: number, _stream: StreamHandle | undefined): void {}
  protected abstract onRecv(p: { buffer: DeviceBuffer; rows: number; stream: StreamHandle | undefined }, buffer: DeviceBuffer, rows: number, stream: StreamHandle | undefined): void;

  close(): void {
    this.closed = true;
    this.pending = null;
  }
}

/**
 * Two stages on one backend object, one stream: `recv` copies the rows straight from the sender's
 * buffer (no staging; the sender writes it again only after the recv was issued, and stream order
 * does the rest). Captured into a decode graph like any copy.
 */
export class SameBackendStageLink extends BaseLink {
  readonly kind: StageLinkKind;

  constructor(
    private readonly backend: DeviceBackend,
    shape: StageLinkShape,
  ) {
    super(shape);
    this.kind = backend.capabilities.deviceKind === 'cpu' ? 'in-process' : 'device-copy';
  }

  protected onRecv(p: { buffer: DeviceBuffer; stream: StreamHandle | undefined }, buffer: DeviceBuffer, rows: number, stream: StreamHandle | undefined): void {
    if ((p.stream?.id ?? 0) !== (stream?.id ?? 0)) this.fail(`send on stream #${p.stream?.id ?? 0} and recv on stream #${stream?.id ?? 0}: this link orders both on one stream`);
    this.backend.copy(buffer, p.buffer, rows * this.rowWidth, 0, 0, stream);
  }
}

/**
 * Two backends whose buffers live in host memory (CPU backends): `send` reads the rows (peek: the
 * producer has finished, CPU ops complete when issued) into a host buffer made up front, `recv`
 * writes them into the receiver. The backends count the bytes (d2h on one side, h2d on the other).
 */
export class HostStageLink extends BaseLink {
  readonly kind = 'in-process' as const;
  private readonly staging: Float32Array | Int32Array;

  constructor(
    private readonly from: DeviceBackend,
    private readonly to: DeviceBackend,
    shape: StageLinkShape,
  ) {
    super(shape);
    for (const b of [from, to]) if (b.capabilities.deviceKind !== 'cpu') throw new RangeError(`HostStageLink joins CPU backends; got ${b.capabilities.deviceKind}`);
    if (shape.dtype !== 'f32' && shape.dtype !== 'i32') throw new RangeError(`HostStageLink carries f32 or i32 rows, not ${shape.dtype}`);
    const n = shape.rowWidth * shape.maxRows;
    this.staging = shape.dtype === 'i32' ? new Int32Array(n) : new Float32Array(n);
  }

  protected override onSend(buffer: DeviceBuffer, rows: number): void {
    if (rows > 0) this.staging.set(this.from.peek(buffer, 0, rows * this.rowWidth));
  }

  protected onRecv(_p: unknown, buffer: DeviceBuffer, rows: number): void {
    this.to.write(buffer, this.staging.subarray(0, rows * this.rowWidth));
  }
}

/**
 * What a NCCL link needs of a communicator: point-to-point transfers of buffer ranges on a stream
 * of the buffer's backend, grouped (one thread drives every rank in this process). `NcclCommunicator`
 * of `@nerva/cuda-backend` is one; tests use a fake.
 */
export interface NcclPointToPoint {
  send(buf: DeviceBuffer, peer: number, opts: { offset?: number; length?: number; stream?: StreamHandle }): void;
  recv(buf: DeviceBuffer, peer: number, opts: { offset?: number; length?: number; stream?: StreamHandle }): void;
  group<T>(fn: () => T): T;
}

export interface NcclEnd {
  backend: DeviceBackend;
  /** The NCCL rank this backend holds. */
  rank: number;
}

/**
 * Two CUDA backends on different GPUs, through NCCL. `staged` (hidden states): `send` copies the
 * rows into a send buffer on the sender's stream; `recv` runs the NCCL pair on a dedicated stream
 * of each backend (ordered after the copy by an event), and the receiver's stream waits for the
 * arrival and copies the rows out. The sender's stream goes on at once (its next micro-batch
 * overlaps the transfer); it waits for the previous transfer only before it refills the send
 * buffer. Not staged (tokens, logits): the NCCL pair runs directly between the two buffers, on the
 * streams of `send` and `recv`.
 */
export class NcclStageLink extends BaseLink {
  readonly kind = 'nccl' as const;
  private readonly sendBuf: DeviceBuffer | undefined;
  private readonly recvBuf: DeviceBuffer | undefined;
  private readonly sendStream: StreamHandle | undefined;
  private readonly recvStream: StreamHandle | undefined;
  private readonly ev: { ready: EventHandle; sent: EventHandle; arrived: EventHandle; consumed: EventHandle } | undefined;
  private sentRecorded = false;
  private consumedRecorded = false;
  /** What close() frees (staged links), in reverse order of making. */
  private release: (() => void)[] = [];

  constructor(
    private readonly comm: NcclPointToPoint,
    private readonly from: NcclEnd,
    private readonly to: NcclEnd,
    shape: StageLinkShape,
    readonly staged: boolean,
  ) {
    super(shape);
    if (from.backend === to.backend) throw new RangeError('NcclStageLink joins two backends (one rank per GPU); stages on one backend use SameBackendStageLink');
    if (!staged) return;
    const made: (() => void)[] = [];
    try {
      const n = shape.rowWidth * shape.maxRows;
      const sendBuf = from.backend.alloc({ dtype: shape.dtype, length: n, usage: 'activations', label: `stage-link ${shape.fromStage}->${shape.toStage} send` });
      made.push(() => from.backend.free(sendBuf));
      const recvBuf = to.backend.alloc({ dtype: shape.dtype, length: n, usage: 'activations', label: `stage-link ${shape.fromStage}->${shape.toStage} recv` });
      made.push(() => to.backend.free(recvBuf));
      const sendStream = from.backend.createStream();
      made.push(() => from.backend.destroyStream(sendStream));
      const recvStream = to.backend.createStream();
      made.push(() => to.backend.destroyStream(recvStream));
      const event = (b: DeviceBackend) => {
        const e = b.createEvent();
        made.push(() => b.destroyEvent(e));
        return e;
      };
      this.ev = { ready: event(from.backend), sent: event(from.backend), arrived: event(to.backend), consumed: event(to.backend) };
      this.sendBuf = sendBuf;
      this.recvBuf = recvBuf;
      this.sendStream = sendStream;
      this.recvStream = recvStream;
      this.release = made;
    } catch (e) {
      for (const f of made.reverse()) f();
      throw e;
    }
  }

  protected override onSend(buffer: DeviceBuffer, rows: number, stream: StreamHandle | undefined): void {
    if (!this.staged || rows === 0) return;
    const b = this.from.backend;
    // The previous transfer must have read the send buffer before it is refilled.
    if (this.sentRecorded) b.waitEvent(stream ?? DEFAULT_STREAM, this.ev!.sent);
    b.copy(this.sendBuf!, buffer, rows * this.rowWidth, 0, 0, stream);
    b.record(this.ev!.ready, stream);
  }

  protected onRecv(p: { buffer: DeviceBuffer; stream: StreamHandle | undefined }, buffer: DeviceBuffer, rows: number, stream: StreamHandle | undefined): void {
    const length = rows * this.rowWidth;
    if (!this.staged) {
      this.comm.group(() => {
        this.comm.send(p.buffer, this.to.rank, { offset: 0, length, stream: p.stream });
        this.comm.recv(buffer, this.from.rank, { offset: 0, length, stream });
      });
      return;
    }
    const f = this.from.backend;
    const t = this.to.backend;
    const ev = this.ev!;
    f.waitEvent(this.sendStream!, ev.ready);
    // The receiver's stream must have copied the previous rows out before they are overwritten.
    if (this.consumedRecorded) t.waitEvent(this.recvStream!, ev.consumed);
    this.comm.group(() => {
      this.comm.send(this.sendBuf!, this.to.rank, { offset: 0, length, stream: this.sendStream });
      this.comm.recv(this.recvBuf!, this.from.rank, { offset: 0, length, stream: this.recvStream });
    });
    f.record(ev.sent, this.sendStream);
    this.sentRecorded = true;
    t.record(ev.arrived, this.recvStream);
    t.waitEvent(stream ?? DEFAULT_STREAM, ev.arrived);
    t.copy(buffer, this.recvBuf!, length, 0, 0, stream);
    t.record(ev.consumed, stream);
    this.consumedRecorded = true;
  }

  override close(): void {
    if (!this.closed) for (const f of this.release.reverse()) f();
    this.release = [];
    super.close();
  }
}

/** The two ends of a link: a stage's backend (and its NCCL rank when stages sit on separate GPUs). */
export interface LinkEnd {
  backend: DeviceBackend;
  rank?: number;
}

/**
 * The link two stages get from where they run: one backend -> SameBackendStageLink; two CPU
 * backends -> HostStageLink; two CUDA backends with a communicator -> NcclStageLink (`staged`
 * for hidden states). Anything else is an error naming the pair.
 */
export function makeStageLink(from: LinkEnd, to: LinkEnd, shape: StageLinkShape, o: { nccl?: NcclPointToPoint; staged?: boolean } = {}): StageLink {
  if (from.backend === to.backend) return new SameBackendStageLink(from.backend, shape);
  const a = from.backend.capabilities.deviceKind;
  const b = to.backend.capabilities.deviceKind;
  if (a === 'cpu' && b === 'cpu') return new HostStageLink(from.backend, to.backend, shape);
  if (a === 'cuda' && b === 'cuda') {
    if (!o.nccl || from.rank === undefined || to.rank === undefined) throw new RangeError(`stages ${shape.fromStage} and ${shape.toStage} sit on different GPUs: their link needs an NCCL communicator`);
    return new NcclStageLink(o.nccl, { backend: from.backend, rank: from.rank }, { backend: to.backend, rank: to.rank }, shape, o.staged ?? false);
  }
  throw new RangeError(`no stage link joins a ${a} backend (stage ${shape.fromStage}) and a ${b} backend (stage ${shape.toStage})`);
}
