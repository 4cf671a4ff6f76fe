import type { FastifyReply } from 'fastify';
import { InvalidParamsError, type TokenEvent, type WorkerEngine, type WorkerGenerateOptions, type WorkerOutcome, type WorkerRequestHandle } from '@nerva/engine';
import { NervaError } from '@nerva/core';
import type { Ticket } from './admission.js';
import { ApiError, badRequest } from './errors.js';
import type { SamplingFields } from './openai-schema.js';
import type { ServerState } from './state.js';

/** Engine error codes that mean the engine itself is gone (not this request's fault): 503. */
const ENGINE_GONE = new Set(['WORKER_EXIT', 'WORKER_HUNG', 'WORKER_ERROR', 'DISPOSED']);

/** One sequence to generate: choice `index` of the response. */
export interface ChoiceJob {
  index: number;
  promptIndex: number;
  promptIds: number[];
  opts: WorkerGenerateOptions;
}

/** How a generation ended, when not by every choice finishing ('slow_client': a stream whose client stopped reading). */
export type GenerationEnd = 'ok' | 'timeout' | 'disconnected' | 'slow_client' | 'failed';

/**
 * Engine options of one choice: the request's fields, the model's generation_config defaults for
 * sampling fields the request leaves out (as vLLM does), and seed + i for the i-th of n samples.
 */
export function choiceOptions(engine: WorkerEngine, s: SamplingFields, sample: number, logprobs: { on: boolean; top: number }): WorkerGenerateOptions {
  const d = engine.generationDefaults;
  return {
    ...s,
    temperature: s.temperature ?? d.temperature,
    topK: s.topK ?? d.topK,
    topP: s.topP ?? d.topP,
    minP: s.minP ?? d.minP,
    repetitionPenalty: s.repetitionPenalty ?? d.repetitionPenalty,
    seed: s.seed === undefined ? undefined : s.seed + sample,
    logprobs: logprobs.on,
    topLogprobs: logprobs.top,
  };
}

/** An engine error about the request → 400 naming the field; anything else passes through. */
export function toApiError(e: unknown): unknown {
  if (e instanceof InvalidParamsError) return badRequest(e.message, e.param);
  if (e instanceof NervaError && (e.code === 'TEMPLATE_ERROR' || e.code === 'NO_CHAT_TEMPLATE' || e.code === 'NO_TOKENIZER')) return badRequest(e.message, 'messages', e.code.toLowerCase());
  return e;
}

/**
 * Submit `jobs` in order, one handle each into `out`. The n choices of one prompt (consecutive
 * jobs with the same prompt index and sample seeds seed, seed + 1, ...) run as shared-prefix forks
 * (`submitFork`: the prompt prefilled once, its KV blocks shared), in groups of at most the
 * engine's `maxForks`; a lone choice is a plain submit.
 */
export function submitJobs(engine: WorkerEngine, jobs: readonly ChoiceJob[], out: WorkerRequestHandle[]): void {
  for (let k = 0; k < jobs.length; ) {
    let end = k + 1;
    while (end < jobs.length && end - k < engine.maxForks && jobs[end].promptIndex === jobs[k].promptIndex) end++;
    // choiceOptions gave job k + i the seed of job k + i; fork i of job k's options samples with it.
    if (end - k === 1) out.push(engine.submit(jobs[k].promptIds, jobs[k].opts));
    else out.push(...engine.submitFork(jobs[k].promptIds, end - k, jobs[k].opts));
    k = end;
  }
}

/**
 * The sequences of one HTTP request, running in the engine: admission, submission, timeout and
 * disconnect handling. Every path that ends it aborts what still runs and releases the ticket
 * only after the engine reported each sequence finished (its KV blocks are free by then).
 */
export class Generation {
  readonly handles: WorkerRequestHandle[] = [];
  end: GenerationEnd = 'ok';
  error: Error | undefined;
  private readonly timer: NodeJS.Timeout;
  private readonly onClose: () => void;

  private constructor(
    private readonly reply: FastifyReply,
    readonly jobs: ChoiceJob[],
    private readonly ticket: Ticket,
    engine: WorkerEngine,
    timeoutMs: number,
  ) {
    try {
      submitJobs(engine, jobs, this.handles);
    } catch (e) {
      for (const h of this.handles) h.abort();
      // Nothing ran past validation, but submitted siblings must finish before the slots return.
      void Promise.allSettled(this.handles.map((h) => h.done)).then(() => ticket.release());
      throw toApiError(e);
    }
    this.timer = setTimeout(() => this.stop('timeout'), timeoutMs);
    this.timer.unref();
    // 'close' on the response before it ended: the client went away.
    this.onClose = () => {
      if (!reply.raw.writableEnded) this.stop('disconnected');
    };
    reply.raw.on('close', this.onClose);
  }

  /**
   * Admit (unless `admitted`, a ticket taken before the request's expensive work) and submit
   * `jobs`; throws the ApiError (400/429/503) to answer with.
   */
  static start(state: ServerState, reply: FastifyReply, jobs: ChoiceJob[], admitted?: Ticket): Generation {
    let ticket = admitted;
    try {
      const { engine, admission } = state.ready();
      ticket ??= admission.admit(jobs.length);
      return new Generation(reply, jobs, ticket, engine, state.config.requestTimeoutS * 1000);
    } catch (e) {
      if (admitted) admitted.release();
      throw e;
    }
  }

  /** Abort every sequence still running, recording why. */
  stop(why: Exclude<GenerationEnd, 'ok'>, error?: Error): void {
    if (this.end === 'ok') {
      this.end = why;
      this.error = error;
    }
    for (const h of this.handles) h.abort();
  }

  /**
   * Deliver every event of every sequence to `onEvent` (sequences run concurrently; each one's
   * events arrive in order) and resolve with the outcomes by job. Outcomes of failed sequences are
   * undefined and `end` is 'failed'.
   */
  async run(onEvent: (job: ChoiceJob, ev: TokenEvent) => void): Promise<(WorkerOutcome | undefined)[]> {
    try {
      return await Promise.all(
        this.handles.map(async (h, k) => {
          const job = this.jobs[k];
          try {
            for await (const ev of h.events) onEvent(job, ev);
            return await h.done;
          } catch (e) {
            this.stop('failed', e as Error);
            await h.done.catch(() => undefined);
            return undefined;
          }
        }),
      );
    } finally {
      clearTimeout(this.timer);
      this.reply.raw.off('close', this.onClose);
      this.ticket.release();
    }
  }

  /** The error to report when the generation did not end normally. */
  failure(): ApiError | undefined {
    if (this.end === 'timeout') {
      return new ApiError(408, 'timeout_error', `the request did not finish within the server's request timeout`, null, 'request_timeout');
    }
    const code = (this.error as { code?: unknown } | undefined)?.code;
    if (this.end === 'failed' && typeof code === 'string' && ENGINE_GONE.has(code)) {
      return new ApiError(503, 'service_unavailable', `the engine failed: ${this.error!.message}; retry shortly`, null, 'engine_unavailable', { 'retry-after': '5' });
    }
    // A request the engine refused after it was queued (a grammar that does not compile there).
    if (this.end === 'failed' && this.error instanceof InvalidParamsError) return badRequest(this.error.message, this.error.param);
    if (this.end === 'failed') return new ApiError(500, 'server_error', `generation failed: ${this.error?.message ?? 'unknown error'}`, null, 'engine_error');
    return undefined;
  }
}
