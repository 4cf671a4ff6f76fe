import { ApiError } from './errors.js';

/** A slot held by one admitted HTTP request (n choices count as n). */
export interface Ticket {
  readonly size: number;
  release(): void;
}

/**
 * Bounded admission: at most `capacity` sequences (running + queued) are in the server at once,
 * and at most `perClient` of them from one client. Past either a request gets 429 with a
 * Retry-After estimated from the recent completion rate; once draining, new requests get 503.
 */
export class Admission {
  private active = 0;
  private draining = false;
  private readonly finishes: number[] = [];
  private idleWaiters: (() => void)[] = [];
  /** Sequences in flight by client; a client with none has no entry (the map stays as small as the live clients). */
  private readonly byClient = new Map<string, number>();
  /** Sequences one client may hold at once. */
  readonly perClient: number;

  constructor(
    /** Sequences that run at once (the engine's max_num_seqs). */
    readonly running: number,
    /** Sequences that may wait beyond those. */
    readonly maxQueue: number,
    /** Sequences one client may hold (default: half the capacity, so one client leaves room for others). */
    perClient?: number,
  ) {
    this.perClient = perClient ?? Math.max(1, Math.floor(this.capacity / 2));
  }

  get capacity(): number {
    return this.running + this.maxQueue;
  }

  /** Sequences `client` holds now. */
  heldBy(client: string): number {
    return this.byClient.get(client) ?? 0;
  }

  /** Sequences admitted and not yet released. */
  get inFlight(): number {
    return this.active;
  }

  get isDraining(): boolean {
    return this.draining;
  }

  /**
   * Admit `size` sequences for `client` (its address; undefined: counted only against the
   * capacity) or throw the 400/429/503 {@link ApiError} to answer with.
   */
  admit(size: number, client?: string): Ticket {
    if (this.draining) throw new ApiError(503, 'service_unavailable', 'the server is shutting down', null, 'shutting_down');
    if (size > this.capacity) {
      throw new ApiError(400, 'invalid_request_error', `'n' x prompts = ${size} sequences exceeds the server's capacity of ${this.capacity}`, 'n');
    }
    if (client !== undefined && size > this.perClient) {
      throw new ApiError(400, 'invalid_request_error', `'n' x prompts = ${size} sequences exceeds this server's limit of ${this.perClient} per client`, 'n', 'too_many_sequences');
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
    const held = client === undefined ? 0 : this.heldBy(client);
    if (client !== undefined && held + size > this.perClient) {
      const retry = this.retryAfterSeconds();
      throw new ApiError(
        429,
        'rate_limit_error',
        `this client already has ${held} sequences in flight and may hold at most ${this.perClient} (max_sequences_per_client); retry in ${retry} s`,
        null,
        'client_limit',
        { 'retry-after': String(retry) },
      );
    }
    this.active += size;
    if (client !== undefined) this.byClient.set(client, held + size);
    let released = false;
    return {
      size,
      release: () => {
        if (released) return;
        released = true;
        this.active -= size;
        if (client !== undefined) {
          const left = this.heldBy(client) - size;
          if (left > 0) this.byClient.set(client, left);
          else this.byClient.delete(client);
        }
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
