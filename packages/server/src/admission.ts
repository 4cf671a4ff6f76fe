import { ApiError } from './errors.js';

/** A slot held by one admitted HTTP request (n choices count as n). */
export interface Ticket {
  readonly size: number;
  release(): void;
}

/**
 * Bounded admission: at most `capacity` sequences (running + queued) are in the server at once.
 * Past that a request gets 429 with a Retry-After estimated from the recent completion rate;
 * once draining, new requests get 503.
 */
export class Admission {
  private active = 0;
  private draining = false;
  private readonly finishes: number[] = [];
  private idleWaiters: (() => void)[] = [];

  constructor(
    /** Sequences that run at once (the engine's max_num_seqs). */
    readonly running: number,
    /** Sequences that may wait beyond those. */
    readonly maxQueue: number,
  ) {}

  get capacity(): number {
    return this.running + this.maxQueue;
  }

  /** Sequences admitted and not yet released. */
  get inFlight(): number {
    return this.active;
  }

  get isDraining(): boolean {
    return this.draining;
  }

  /** Admit `size` sequences or throw the 429/503 {@link ApiError} to answer with. */
  admit(size: number): Ticket {
    if (this.draining) throw new ApiError(503, 'service_unavailable', 'the server is shutting down', null, 'shutting_down');
    if (size > this.capacity) {
      throw new ApiError(400, 'invalid_request_error', `'n' x prompts = ${size} sequences exceeds the server's capacity of ${this.capacity}`, 'n');
    }
    if (this.active + size > this.capacity) {
      const retry = this.retryAfterSeconds();
      throw new ApiError(
        429,
        'rate_limit_error',
        `the server is at capacity (${this.active} sequences in flight, ${this.maxQueue} may queue); retry in ${retry} s`,
        null,
        'queue_full',
        { 'retry-after': String(retry) },
      );
    }
    this.active += size;
    let released = false;
    return {
      size,
      release: () => {
        if (released) return;
        released = true;
        this.active -= size;
        const now = performance.now();
        for (let i = 0; i < size; i++) this.finishes.push(now);
        if (this.finishes.length > 1024) this.finishes.splice(0, this.finishes.length - 1024);
        if (this.active === 0) {
          const w = this.idleWaiters;
          this.idleWaiters = [];
          for (const f of w) f();
        }
      },
    };
  }

  /** Seconds until a slot is likely free: queued work over the completion rate of the last 30 s. */
  retryAfterSeconds(): number {
    const now = performance.now();
    const recent = this.finishes.filter((t) => now - t < 30_000).length;
    const rate = recent / 30;
    const excess = Math.max(1, this.active - this.running);
    const est = rate > 0 ? Math.ceil(excess / rate) : 5;
    return Math.min(60, Math.max(1, est));
  }

  /** Refuse new requests from now on (shutdown). */
  startDraining(): void {
    this.draining = true;
  }

  /** Resolves when no admitted request remains. */
  idle(): Promise<void> {
    if (this.active === 0) return Promise.resolve();
    return new Promise((r) => this.idleWaiters.push(r));
  }
}
