import type { ServerResponse } from 'node:http';

/** What a stream does once a client that stopped reading has more than the cap waiting for it. */
export interface SseOverflow {
  /** Bytes that may wait in the response's buffers for the client (unbounded when absent). */
  maxBuffered: number;
  /** Milliseconds the client gets to take what is buffered before the connection is closed. */
  graceMs: number;
  /** Called once, at the overflow: stop the request's generation (its KV is freed) and count it. */
  onOverflow(): void;
}

/** The event a stream stopped at the buffer cap ends with, if the client catches up within the grace period. */
export const SLOW_CLIENT_ERROR = {
  error: {
    message: 'the client did not read the stream fast enough: more output waited for it than this server buffers (sse_buffer_bytes); the request was stopped',
    type: 'server_error',
    param: null,
    code: 'slow_client',
  },
} as const;

/**
 * Server-sent events in OpenAI's streaming format: `data: <json>\n\n` per chunk, then
 * `data: [DONE]\n\n`. Writes go straight to the socket; a closed connection turns writes into no-ops.
 *
 * A client that stops reading cannot hold the server's memory nor its engine: once more than
 * `maxBuffered` bytes wait for it, the request is stopped at once (`onOverflow`: the generation is
 * aborted and its KV freed) and nothing more is written. A client that takes what was buffered
 * within the grace period gets an error event and [DONE]; one that does not is disconnected.
 */
export class SseWriter {
  private stopped = false;

  constructor(
    private readonly res: ServerResponse,
    private readonly overflow?: SseOverflow,
  ) {}

  /** Send the 200 and the event-stream headers. */
  start(extraHeaders: Record<string, string> = {}): void {
    this.res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
      // Reverse proxies must not buffer a token stream.
      'x-accel-buffering': 'no',
      ...extraHeaders,
    });
    this.res.flushHeaders();
  }

  /** True once nothing more will be written: the connection is gone, the response ended, or the client fell too far behind. */
  get closed(): boolean {
    return this.stopped || this.res.destroyed || this.res.writableEnded;
  }

  /** True when the stream was stopped because the client did not read. */
  get overflowed(): boolean {
    return this.stopped;
  }

  /** One `data:` event holding `payload` as JSON. */
  send(payload: unknown): void {
    if (this.closed) return;
    this.res.write(`data: ${JSON.stringify(payload)}\n\n`);
    if (this.overflow && this.res.writableLength > this.overflow.maxBuffered) this.stop(this.overflow);
  }

  /** The terminating `data: [DONE]` and the end of the response. */
  done(): void {
    if (this.closed) return;
    this.res.write('data: [DONE]\n\n');
    this.res.end();
  }

  private stop(o: SseOverflow): void {
    this.stopped = true;
    const res = this.res;
    // Whatever is not flushed to the client by the end of the grace period is dropped with the connection.
    const timer = setTimeout(() => {
      res.off('drain', caughtUp);
      if (!res.writableFinished) res.destroy();
    }, o.graceMs);
    timer.unref();
    const caughtUp = () => {
      if (res.destroyed || res.writableEnded) return;
      res.write(`data: ${JSON.stringify(SLOW_CLIENT_ERROR)}\n\n`);
      res.end('data: [DONE]\n\n');
    };
    res.once('drain', caughtUp);
    res.once('close', () => clearTimeout(timer));
    o.onOverflow();
  }
}
