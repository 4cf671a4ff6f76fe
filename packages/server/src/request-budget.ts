import type { ChatMessage } from '@nerva/models';
import type { FastifyRequest } from 'fastify';
import type { Ticket } from './admission.js';
import { badRequest } from './errors.js';
import type { SamplingFields } from './openai-schema.js';
import type { ServerState } from './state.js';

/**
 * Per-request budgets, checked before any expensive work (template rendering, tokenization,
 * submission): how many sequences and tokens one request may ask for, how much prompt text, how
 * many stop strings (every generated token rescans them), and whether it may set a priority.
 */
export function checkBudget(state: ServerState, sequences: number, s: SamplingFields, promptChars: number): void {
  const b = state.security;
  const perRequest = b.maxSequencesPerRequest ?? Math.max(1, Math.floor((state.admission?.capacity ?? 4) / 4));
  if (sequences > perRequest) {
    throw badRequest(`'n' x prompts = ${sequences} sequences exceeds this server's limit of ${perRequest} per request`, 'n', 'too_many_sequences');
  }
  const maxTokens = s.maxTokens ?? state.engine?.maxModelLen ?? 0;
  if (sequences * maxTokens > b.maxRequestTokens) {
    throw badRequest(
      `'n' x prompts x max_tokens = ${sequences * maxTokens} tokens exceeds this server's limit of ${b.maxRequestTokens} per request (set max_tokens)`,
      'max_tokens',
      'request_too_large',
    );
  }
  if (promptChars > b.maxPromptChars) {
    throw badRequest(`the prompt has ${promptChars} characters; this server takes at most ${b.maxPromptChars}`, 'prompt', 'prompt_too_long');
  }
  const stop = s.stop ?? [];
  if (stop.length > b.maxStopStrings) throw badRequest(`'stop' has ${stop.length} strings; at most ${b.maxStopStrings} are allowed`, 'stop');
  const long = stop.find((x) => x.length > b.maxStopLength);
  if (long !== undefined) throw badRequest(`a 'stop' string has ${long.length} characters; at most ${b.maxStopLength} are allowed`, 'stop');
  const ids = s.stopTokenIds ?? [];
  if (ids.length > b.maxStopTokenIds) throw badRequest(`'stop_token_ids' has ${ids.length} ids; at most ${b.maxStopTokenIds} are allowed`, 'stop_token_ids');
  if (s.priority !== undefined && s.priority !== 0) {
    if (!b.allowClientPriority) throw badRequest(`'priority' is not enabled on this server (allow_client_priority)`, 'priority', 'unsupported_parameter');
    const [lo, hi] = b.clientPriorityRange;
    if (s.priority < lo || s.priority > hi) {
      throw badRequest(`'priority' must lie in this server's client_priority_range [${lo}, ${hi}], got ${s.priority}`, 'priority', 'priority_out_of_range');
    }
  }
}

/** Characters of text in the messages (content and every other string field a template may print). */
export function messageChars(messages: readonly ChatMessage[]): number {
  let n = 0;
  const walk = (v: unknown, depth: number): void => {
    if (typeof v === 'string') n += v.length;
    else if (depth < 8 && v !== null && typeof v === 'object') for (const x of Object.values(v)) walk(x, depth + 1);
  };
  walk(messages, 0);
  return n;
}

/**
 * Who a request counts against in the per-client budget: its peer address. The server has one
 * API key, which every client shares, so the key cannot tell clients apart. Behind a reverse
 * proxy every request has the proxy's address and the per-client cap bounds them all together.
 */
export function clientOf(request: FastifyRequest): string {
  return request.ip;
}

/** Admit `sequences` for `client` before the request does expensive work; the ticket goes to the generation. */
export function admitEarly(state: ServerState, sequences: number, client: string): Ticket {
  const { admission } = state.ready();
  return admission.admit(sequences, client);
}

