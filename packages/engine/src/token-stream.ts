/** Where a piped {@link TokenStream} delivers: each item, then the end (with the error that ended it, if one did). */
export interface TokenSink<T> {
  push(item: T): void;
  end(error?: Error): void;
}

/** A push queue consumed as an async iterator: the engine pushes, a caller awaits. */
export class TokenStream<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private waiter: { resolve: (r: IteratorResult<T>) => void; reject: (e: Error) => void } | undefined;
  private failure: Error | undefined;
  private done = false;
  /** Called when the consumer stops iterating early (break or throw in a for-await). */
  onReturn: (() => void) | undefined;

  private sink: TokenSink<T> | undefined;

  push(item: T): void {
    if (this.done) return;
    if (this.sink) {
      this.sink.push(item);
      return;
    }
    const w = this.waiter;
    if (w) {
      this.waiter = undefined;
      w.resolve({ value: item, done: false });
    } else this.items.push(item);
  }

  end(error?: Error): void {
    if (this.done) return;
    this.done = true;
    this.failure = error;
    if (this.sink) {
      this.sink.end(error);
      return;
    }
    const w = this.waiter;
    if (w) {
      this.waiter = undefined;
      if (error) w.reject(error);
      else w.resolve({ value: undefined as never, done: true });
    }
  }

  /**
   * Hand every item to `sink` synchronously, as it is pushed (those queued already first), and
   * the end: for a consumer that forwards items elsewhere in batches (the engine worker posts a
   * step's tokens as one message), without a promise per item. The stream is not iterated then.
   */
  pipeTo(sink: TokenSink<T>): void {
    if (this.sink) throw new Error('TokenStream: already piped');
    this.sink = sink;
    for (const item of this.items.splice(0)) sink.push(item);
    if (this.done) sink.end(this.failure);
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return {
      next: () => {
        if (this.items.length > 0) return Promise.resolve({ value: this.items.shift() as T, done: false });
        if (this.done) return this.failure ? Promise.reject(this.failure) : Promise.resolve({ value: undefined as never, done: true });
        return new Promise<IteratorResult<T>>((resolve, reject) => {
          this.waiter = { resolve, reject };
        });
      },
      return: () => {
        this.onReturn?.();
        return Promise.resolve({ value: undefined as never, done: true });
      },
    };
  }
}
