import type { ServerResponse } from 'node:http';

/**
 * Server-sent events in OpenAI's streaming format: `data: <json>\n\n` per chunk, then
 * `data: [DONE]\n\n`. Writes go straight to the socket; a closed connection turns writes into no-ops.
 * A client that stops reading cannot hold the server's memory: once more than `maxBuffered`
 * bytes wait for it, the connection is closed (the generation sees a disconnect and stops).
 */
export class SseWriter {
  constructor(
    private readonly res: ServerResponse,
    private readonly maxBuffered = Number.POSITIVE_INFINITY,
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

  get closed(): boolean {
    return this.res.destroyed || this.res.writableEnded;
  }

  /** One `data:` event holding `payload` as JSON. */
  send(payload: unknown): void {
    if (this.closed) return;
    this.res.write(`data: ${JSON.stringify(payload)}\n\n`);
    if (this.res.writableLength > this.maxBuffered) this.res.destroy();
  }

  /** The terminating `data: [DONE]` and the end of the response. */
  done(): void {
    if (this.closed) return;
    this.res.write('data: [DONE]\n\n');
    this.res.end();
  }
}
