import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import type { ChatMessage, ChatTemplateOptions } from '@nerva/models';
import { TokenizerError } from '@nerva/models';

/**
 * Prompts of at least this many characters (a request's prompt texts together; a chat's message
 * strings) are rendered and tokenized off the event loop; shorter ones on it, so that no request
 * holds the event loop for much more than 1 ms. Measured (median of 41, Node 20, a loaded 2-core
 * x86 machine) with the Qwen3 tokenizer (151,646 ids) and its chat template, the costliest per
 * character: 128 characters of random CJK or Hangul cost about 1.0 ms to render and encode, 256
 * about 1.4 ms, 4096 about 24 ms (English text: 0.2 ms, 0.3 ms, 2.2 ms); many short messages
 * cost alike (32 messages of "hi", 192 characters counted: 1.4 ms of template rendering).
 */
export const OFF_THREAD_CHARS = 128;

export interface TokenizeWorkerData {
  dir: string;
  chatTemplate?: string;
}

/** A chat to render and tokenize, or a text to tokenize (with the tokenizer's special tokens). */
export type TokenizeJob = { kind: 'chat'; messages: ChatMessage[]; opts: ChatTemplateOptions } | { kind: 'text'; text: string };

export type TokenizeRequest = TokenizeJob & { id: number };

export interface TokenizeReply {
  id: number;
  ready?: boolean;
  ids?: number[];
  error?: { code: string; message: string };
}

function workerUrl(): URL | undefined {
  const url = new URL('./tokenize-worker.js', import.meta.url);
  if (existsSync(fileURLToPath(url))) return url;
  // Running from sources (tests that import src/): the built entry of this package.
  const built = new URL('../dist/tokenize-worker.js', import.meta.url);
  return existsSync(fileURLToPath(built)) ? built : undefined;
}

/**
 * Chat-template rendering and tokenization of large prompts in a worker thread (started on first
 * use), so that a 256 KiB prompt does not stall every other request for the time it takes. Same
 * tokenizer and template as the main thread, so the same ids. Where no worker can run (no
 * built entry, or it failed), `undefined` tells the caller to tokenize on its own thread.
 */
export class OffThreadTokenizer {
  private worker: Worker | undefined;
  private broken = false;
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (ids: number[]) => void; reject: (e: Error) => void }>();

  constructor(private readonly data: TokenizeWorkerData) {}

  /** Ids of `req`, or undefined when no worker is available. Throws the tokenizer's error. */
  run(req: TokenizeJob): Promise<number[]> | undefined {
    const w = this.start();
    if (!w) return undefined;
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      w.postMessage({ ...req, id });
    });
  }

  async close(): Promise<void> {
    const w = this.worker;
    this.worker = undefined;
    this.broken = true;
    if (w) await w.terminate();
  }

  private start(): Worker | undefined {
    if (this.worker || this.broken) return this.worker;
    const url = workerUrl();
    if (!url) {
      this.broken = true;
      return undefined;
    }
    const w = new Worker(url, { workerData: this.data });
    w.unref();
    w.on('message', (m: TokenizeReply) => {
      const p = this.pending.get(m.id);
      if (!p) return;
      this.pending.delete(m.id);
      if (m.error) p.reject(new TokenizerError(m.error.code as ConstructorParameters<typeof TokenizerError>[0], m.error.message));
      else p.resolve(m.ids!);
    });
    const fail = (e: Error) => {
      this.broken = true;
      this.worker = undefined;
      for (const [id, p] of this.pending) {
        this.pending.delete(id);
        p.reject(e);
      }
    };
    w.on('error', fail);
    w.on('exit', (code) => fail(new Error(`tokenizer worker exited with code ${code}`)));
    this.worker = w;
    return w;
  }
}

/**
 * The worker's ids, or undefined to tokenize on this thread: no worker, or a worker that failed
 * (its own failure, not the tokenizer's error about the input, which is rethrown).
 */
export async function offThread(p: Promise<number[]> | undefined): Promise<number[] | undefined> {
  if (!p) return undefined;
  try {
    return await p;
  } catch (e) {
    if (e instanceof TokenizerError) throw e;
    return undefined;
  }
}
