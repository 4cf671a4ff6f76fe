import type { DeviceBackend, DeviceBuffer } from '@nerva/core';

/**
 * The host's side of the device token ring: sampled tokens are pushed by the device (op sample's
 * tail) and read here asynchronously through `peek`, never with a hard sync.
 */
export class TokenRingReader {
  private at = 0;

  /** `source` is read at each call: the runner owns the ring buffer and its capacity. */
  constructor(
    private readonly backend: DeviceBackend,
    private readonly source: { readonly meta: { readonly ring: DeviceBuffer }; readonly limits: { readonly ringCapacity: number } },
  ) {}

  private get capacity(): number {
    return this.source.limits.ringCapacity;
  }

  /** Tokens of steps dropped unread (run-ahead): skipped. */
  skip(n: number): void {
    this.at = (this.at + n) % this.capacity;
  }

  /** The next `n` tokens, wrapping at the ring's end. */
  read(n: number): number[] {
    const out: number[] = [];
    const start = this.at % this.capacity;
    const first = Math.min(n, this.capacity - start);
    for (const v of this.backend.peek(this.source.meta.ring, start, first)) out.push(v);
    if (first < n) for (const v of this.backend.peek(this.source.meta.ring, 0, n - first)) out.push(v);
    this.at = (this.at + n) % this.capacity;
    return out;
  }
}
