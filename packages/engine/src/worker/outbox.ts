import type { StepSignals } from '../engine-options.js';
import type { TokenEvent } from '../request.js';
import type { WireError, WorkerBatch, WorkerEnd, WorkerLoad, WorkerOutcome } from './protocol.js';

/**
 * The worker's side of the token crossing: what the engine produces during one synchronous step
 * (token events, finished and failed requests, the step's signals) gathers here and is posted as
 * one {@link WorkerBatch} from a microtask, so right after the step returns and before the
 * engine's next step (which runs from setImmediate): no token waits a step, and a step costs one
 * message whatever its batch size. The engine never waits on the receiving thread.
 */
export class Outbox {
  private steps: StepSignals[] = [];
  private rids: number[] = [];
  private events: TokenEvent[] = [];
  private ends: WorkerEnd[] = [];
  private queued = false;

  constructor(
    private readonly post: (m: WorkerBatch) => void,
    private readonly load: () => WorkerLoad,
  ) {}

  step(s: StepSignals): void {
    this.steps.push(s);
    this.schedule();
  }

  event(rid: number, ev: TokenEvent): void {
    this.rids.push(rid);
    this.events.push(ev);
    this.schedule();
  }

  done(rid: number, outcome: WorkerOutcome): void {
    this.ends.push({ rid, outcome });
    this.schedule();
  }

  failed(rid: number, error: WireError): void {
    this.ends.push({ rid, error });
    this.schedule();
  }

  /** Whether anything waits to be posted. */
  get pending(): boolean {
    return this.steps.length + this.events.length + this.ends.length > 0;
  }

  /** Post what gathered now (before any other message, so the receiver sees everything in order). */
  flush(): void {
    if (!this.pending) return;
    const m: WorkerBatch = { type: 'batch', steps: this.steps, rids: this.rids, events: this.events, ends: this.ends, load: this.load() };
    this.steps = [];
    this.rids = [];
    this.events = [];
    this.ends = [];
    this.post(m);
  }

  private schedule(): void {
    if (this.queued) return;
    this.queued = true;
    queueMicrotask(() => {
      this.queued = false;
      this.flush();
    });
  }
}
