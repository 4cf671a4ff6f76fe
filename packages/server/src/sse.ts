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

/** Writers holding events not yet written, flushed together once per turn of the event loop. */
const dirty = new Set<SseWriter>();
let flushQueued = false;

function flushDirty(): void {
  flushQueued = false;
  for (const w of dirty) w.flush();
  dirty.clear();
}

/**
 * Server-sent events in OpenAI's streaming format: `data: <json>\n\n` per chunk, then
 * `data: [DONE]\n\n`. Events that become ready in the same turn of the event loop (the tokens of
 * one engine step, or of several that arrived together) go to the socket as one write, at the end
 * of that turn (setImmediate: after the turn's I/O callbacks, before any timer), so no token
 * waits on a timer and a busy server writes fewer, larger chunks. A closed connection turns writes
 * into no-ops.
 *
 * A client that stops reading cannot hold the server's memory nor its engine: once more than
 * `maxBuffered` bytes wait for it, the request is stopped at once (`onOverflow`: the generation is
 * aborted and its KV freed) and nothing more is written. A client that takes what was buffered
 * within the grace period gets an error event and [DONE]; one that does not is disconnected.
 */
export class SseWriter {
  private stopped = false;
  /** Events not written yet, and their bytes (counted only under a buffer cap). */
  private pending = '';
  private pendingBytes = 0;

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
    this.sendJson(JSON.stringify(payload));
  }

  /** One `data:` event whose payload is JSON text already (a chunk serialized around a prefix built once). */
  sendJson(json: string): void {
    if (this.closed) return;
    const ev = `data: ${json}\n\n`;
    this.pending += ev;
    if (this.overflow) {
      this.pendingBytes += Buffer.byteLength(ev);
      // Past the cap: written now, so the overflow is seen (and the request stopped) at once.
      if (this.res.writableLength + this.pendingBytes > this.overflow.maxBuffered) {
        this.flush();
        return;
      }
    }
    dirty.add(this);
    if (!flushQueued) {
      flushQueued = true;
      setImmediate(flushDirty);
    }
  }

  /** Write the events that wait (one write), and stop the stream if its client holds more than the cap. */
  flush(): void {
    if (this.pending.length === 0) return;
    const s = this.pending;
    this.pending = '';
    this.pendingBytes = 0;
    if (this.closed) return;
    this.res.write(s);
    if (this.overflow && this.res.writableLength > this.overflow.maxBuffered) this.stop(this.overflow);
  }

  /** The terminating `data: [DONE]` and the end of the response (after whatever still waits). */
  done(): void {
    this.flush();
    if (this.closed) return;
    this.res.end('data: [DONE]\n\n');
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
