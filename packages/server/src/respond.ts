import { randomUUID } from 'node:crypto';
import type { TokenEvent, WorkerOutcome } from '@nerva/engine';
import type { FastifyReply } from 'fastify';
import type { Ticket } from './admission.js';
import { type ChoiceJob, Generation } from './generation.js';
import { chatLogprob, type ChatLogprob, CompletionLogprobs, TokenTexts } from './logprobs.js';
import type { NervaExtras } from './openai-schema.js';
import { SseWriter } from './sse.js';
import type { ServerState } from './state.js';
import { parseToolCalls, ToolCallStream, type ToolCall, type ToolFormat } from './tool-calls.js';
import { usageOf } from './usage.js';

/** Which OpenAI endpoint is answering, and its logprobs request. */
export type ResponseKind =
  /** `tools`: the output is parsed for tool calls in this format (tools given, tool_choice not none). */
  | { kind: 'chat'; logprobs: boolean; topLogprobs: number; tools?: ToolFormat }
  /** `echo`: each choice's prompt text (by prompt index) and, with logprobs, its tokens' logprobs, before the completion. */
  | { kind: 'completion'; logprobs: number | undefined; echo?: EchoedPrompt[] };

/** A completions prompt returned with `echo`. */
export interface EchoedPrompt {
  text: string;
  /** Its tokens (the first has no logprob) and the logprobs of the rest, when logprobs were asked for. */
  tokens?: { ids: number[]; scored: TokenEvent[] };
}

export interface RespondOptions {
  stream: boolean;
  includeUsage: boolean;
  extras: NervaExtras;
}

/** Per-choice state while a response is built. */
interface ChoiceAcc {
  text: string;
  chatLogprobs: ChatLogprob[];
  completionLogprobs?: CompletionLogprobs;
  sentLogprobs: number;
  /** Tool calls parsed from a streamed output. */
  toolStream?: ToolCallStream;
}

/** finish_reason: `tool_calls` when the output that stopped made calls. */
function finishOf(reason: string, calls: readonly ToolCall[]): string {
  return calls.length > 0 && reason === 'stop' ? 'tool_calls' : reason;
}

/** Stream deltas of tool calls, numbered from `first` within the choice. */
function callDeltas(calls: readonly ToolCall[], first: number): Record<string, unknown>[] {
  return calls.map((c, i) => ({ index: first + i, id: c.id, type: 'function', function: { name: c.function.name, arguments: c.function.arguments } }));
}

/**
 * Run `jobs` and answer in OpenAI's shape: one JSON body, or an SSE stream of chunks (content as
 * it is generated, a closing chunk per choice with its finish_reason, an optional usage chunk,
 * then [DONE]). Throws ApiError before anything is sent (400/429/503); after the stream started,
 * failures become an error event.
 */
export async function respond(state: ServerState, reply: FastifyReply, jobs: ChoiceJob[], k: ResponseKind, o: RespondOptions, ticket?: Ticket): Promise<void> {
  const gen = Generation.start(state, reply, jobs, ticket);
  const texts = new TokenTexts(state.engine?.tokenizer);
  const metrics = state.metrics;
  const chat = k.kind === 'chat';
  const id = `${chat ? 'chatcmpl' : 'cmpl'}-${randomUUID().replaceAll('-', '')}`;
  const created = Math.floor(Date.now() / 1000);
  const base = { id, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model: state.modelName };
  const wantLogprobs = chat ? k.logprobs : k.logprobs !== undefined;
  const echo = k.kind === 'completion' ? k.echo : undefined;
  const accs: ChoiceAcc[] = jobs.map((job) => {
    const a: ChoiceAcc = { text: '', chatLogprobs: [], sentLogprobs: 0 };
    if (!chat && k.logprobs !== undefined) {
      a.completionLogprobs = new CompletionLogprobs(texts, k.logprobs);
      const e = echo?.[job.promptIndex];
      if (e?.tokens) a.completionLogprobs.addPrompt(e.tokens.ids, e.tokens.scored);
    }
    if (k.kind === 'chat' && k.tools && o.stream) a.toolStream = new ToolCallStream(k.tools);
    return a;
  });
  const accOf = new Map(jobs.map((j, i) => [j, accs[i]]));

  const collect = (job: ChoiceJob, ev: TokenEvent): ChoiceAcc => {
    metrics.onToken(ev);
    const a = accOf.get(job)!;
    a.text += ev.text;
    if (wantLogprobs) {
      if (chat) a.chatLogprobs.push(chatLogprob(texts, ev, k.topLogprobs));
      else a.completionLogprobs!.add(ev);
    }
    return a;
  };

  if (!o.stream) {
    const outcomes = await gen.run((job, ev) => void collect(job, ev));
    if (gen.end === 'disconnected') {
      reply.hijack();
      return;
    }
    const fail = gen.failure();
    if (fail) throw fail;
    const choices = jobs.map((job, i) => {
      const out = outcomes[i]!;
      const a = accs[i];
      const c: Record<string, unknown> = { index: job.index };
      let finish: string = out.finishReason;
      if (chat) {
        const parsed = k.tools ? parseToolCalls(a.text, k.tools) : { content: a.text, calls: [] };
        c.message = { role: 'assistant', content: parsed.content, ...(parsed.calls.length > 0 ? { tool_calls: parsed.calls } : {}) };
        c.logprobs = wantLogprobs ? { content: a.chatLogprobs } : null;
        finish = finishOf(finish, parsed.calls);
      } else {
        c.text = (echo?.[job.promptIndex]?.text ?? '') + a.text;
        c.logprobs = a.completionLogprobs ? a.completionLogprobs.toJSON() : null;
      }
      c.finish_reason = finish;
      c.stop_reason = out.stopReason ?? null;
      addExtras(c, out, o.extras);
      return c;
    });
    choices.sort((x, y) => (x.index as number) - (y.index as number));
    await reply.send({ ...base, object: chat ? 'chat.completion' : 'text_completion', choices, usage: usageOf(jobs, outcomes) });
    return;
  }

  reply.hijack();
  // A client that stops reading: past the buffer cap its request stops at once (KV freed, the
  // engine's time back to the others) and the connection closes after the grace period.
  const sse = new SseWriter(reply.raw, {
    maxBuffered: state.security.sseBufferBytes,
    graceMs: state.security.sseGraceS * 1000,
    onOverflow: () => {
      metrics.onSlowClient();
      gen.stop('slow_client');
    },
  });
  sse.start();
  // A chunk is {...base, choices: [choice], usage: null (with include_usage)}: the text around
  // the choice is serialized once, not per token.
  const head = `${JSON.stringify(base).slice(0, -1)},"choices":[`;
  const tail = o.includeUsage ? '],"usage":null}' : ']}';
  const chunk = (choice: Record<string, unknown>) => sse.sendJson(head + JSON.stringify(choice) + tail);
  if (chat) for (const j of jobs) chunk({ index: j.index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null });
  // Echo: each choice starts with its prompt (and the prompt's logprobs).
  if (echo) {
    jobs.forEach((j, i) => {
      const a = accs[i];
      const lp = a.completionLogprobs ? a.completionLogprobs.slice(0) : null;
      a.sentLogprobs = a.completionLogprobs?.tokens.length ?? 0;
      chunk({ index: j.index, text: echo[j.promptIndex].text, logprobs: lp, finish_reason: null });
    });
  }

  const outcomes = await gen.run((job, ev) => {
    const a = collect(job, ev);
    // A token whose text is held back (partial character, possible stop string) is sent only when asked for its id or logprob.
    if (ev.text.length === 0 && !wantLogprobs && !o.extras.returnTokenIds) return;
    const c: Record<string, unknown> = { index: job.index };
    if (chat) {
      if (a.toolStream) {
        // Content that may open a tool call is held back; a call goes out whole once closed.
        const d = a.toolStream.push(ev.text);
        const before = a.toolStream.calls.length - d.calls.length;
        c.delta = { ...(d.content.length > 0 ? { content: d.content } : {}), ...(d.calls.length > 0 ? { tool_calls: callDeltas(d.calls, before) } : {}) };
        if (d.content.length === 0 && d.calls.length === 0 && !wantLogprobs && !o.extras.returnTokenIds) return;
      } else c.delta = { content: ev.text };
      c.logprobs = wantLogprobs ? { content: a.chatLogprobs.slice(a.sentLogprobs) } : null;
      a.sentLogprobs = a.chatLogprobs.length;
    } else {
      c.text = ev.text;
      c.logprobs = a.completionLogprobs ? a.completionLogprobs.slice(a.sentLogprobs) : null;
      a.sentLogprobs = a.completionLogprobs?.tokens.length ?? 0;
    }
    c.finish_reason = null;
    if (o.extras.returnTokenIds) c.token_ids = [ev.token];
    chunk(c);
  });
  // The writer closes a slow client's stream itself.
  if (gen.end === 'disconnected' || gen.end === 'slow_client') return;
  const fail = gen.failure();
  if (fail) {
    sse.send(fail.toBody());
    sse.done();
    return;
  }
  jobs.forEach((job, i) => {
    const out = outcomes[i]!;
    const a = accs[i];
    const c: Record<string, unknown> = { index: job.index };
    if (chat) c.delta = {};
    else c.text = '';
    if (a.toolStream) {
      // Whatever was held back, as content or calls, in the closing chunk.
      const before = a.toolStream.calls.length;
      const d = a.toolStream.finish();
      c.delta = { ...(d.content.length > 0 ? { content: d.content } : {}), ...(d.calls.length > 0 ? { tool_calls: callDeltas(d.calls, before) } : {}) };
    }
    c.logprobs = null;
    c.finish_reason = a.toolStream ? finishOf(out.finishReason, a.toolStream.calls) : out.finishReason;
    c.stop_reason = out.stopReason ?? null;
    if (o.extras.ledger) c.nerva_ledger = out.ledger;
    chunk(c);
  });
  if (o.includeUsage) sse.send({ ...base, choices: [], usage: usageOf(jobs, outcomes) });
  sse.done();
}

function addExtras(c: Record<string, unknown>, out: WorkerOutcome, x: NervaExtras): void {
  if (x.returnTokenIds) {
    c.token_ids = out.tokenIds;
    c.prompt_token_ids = out.promptIds;
  }
  if (x.ledger) c.nerva_ledger = out.ledger;
}
