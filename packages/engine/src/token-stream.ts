/** A push queue consumed as an async iterator: the engine pushes, a caller awaits. */
export class TokenStream<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private waiter: { resolve: (r: IteratorResult<T>) => void; reject: (e: Error) => void } | undefined;
  private failure: Error | undefined;
  private done = false;
  /** Called when the consumer stops iterating early (break or throw in a for-await). */
  onReturn: (() => void) | undefined;

  push(item: T): void {
    if (this.done) return;
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
    const w = this.waiter;
    if (w) {
      this.waiter = undefined;
      if (error) w.reject(error);
      else w.resolve({ value: undefined as never, done: true });
    }
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
