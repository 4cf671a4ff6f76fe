import type { FastifyInstance } from 'fastify';
import { choiceOptions, type ChoiceJob, toApiError } from './generation.js';
import { parseCompletionRequest } from './openai-schema.js';
import { admitEarly, checkBudget, clientOf } from './request-budget.js';
import { OFF_THREAD_CHARS, offThread } from './tokenize-pool.js';
import type { TokenEvent, WorkerEngine } from '@nerva/engine';
import { type EchoedPrompt, respond } from './respond.js';
import { checkRequestGrammar } from './structured-output.js';
import type { ModelRouter } from './model-router.js';

/** POST /v1/completions: a text or token-id prompt (or a list of them), n samples each. */
export function registerCompletions(app: FastifyInstance, models: ModelRouter): void {
  app.post('/v1/completions', async (request, reply) => {
    const req = parseCompletionRequest(request.body);
    const state = models.route(req.model);
    const { engine } = state.ready();
    // A bad grammar is a 400 before anything runs.
    if (req.grammar) await checkRequestGrammar(req.grammar);
    // Budgets and admission before the tokenizer runs (the costly part).
    const sequences = req.prompts.length * req.n;
    const chars = req.prompts.reduce((n, p) => n + (typeof p === 'string' ? p.length : 0), 0);
    checkBudget(state, sequences, req.sampling, chars);
    // Decided on the request's text as a whole: many short prompts cost the event loop as much as one long one.
    const offThreadText = chars >= OFF_THREAD_CHARS && engine.tokenizer !== undefined;
    const ticket = admitEarly(state, sequences, clientOf(request));
    const jobs: ChoiceJob[] = [];
    const echoed: EchoedPrompt[] = [];
    for (let pi = 0; pi < req.prompts.length; pi++) {
      const p = req.prompts[pi];
      let ids: number[];
      try {
        // Text prompts are tokenized in the tokenizer worker unless they are short; then here (no round trip).
        const off = typeof p === 'string' && offThreadText ? await offThread(state.offThread?.run({ kind: 'text', text: p })) : undefined;
        ids = off ?? (typeof p === 'string' ? engine.encode(p) : p);
      } catch (e) {
        ticket.release();
        throw toApiError(e);
      }
      if (req.echo) {
        try {
          echoed.push(await echoOf(engine, p, ids, req.logprobs));
        } catch (e) {
          ticket.release();
          throw toApiError(e);
        }
      }
      // Choice index = prompt index * n + sample, as vLLM numbers batched prompts.
      for (let i = 0; i < req.n; i++) {
        jobs.push({
          index: pi * req.n + i,
          promptIndex: pi,
          promptIds: ids,
          opts: choiceOptions(engine, req.sampling, i, { on: req.logprobs !== undefined, top: req.logprobs ?? 0 }),
        });
      }
    }
    await respond(state, reply, jobs, { kind: 'completion', logprobs: req.logprobs, ...(req.echo ? { echo: echoed } : {}) }, req, ticket);
  });
}

/**
 * A prompt as `echo` returns it: its text (token ids decoded) and, with logprobs, each token's
 * logprob given the tokens before it: the prompt teacher-forced from its first token, one
 * position a step, each forced token's logprob and `top` alternatives read from its logits.
 */
async function echoOf(engine: WorkerEngine, prompt: string | number[], ids: number[], top: number | undefined): Promise<EchoedPrompt> {
  const text = typeof prompt === 'string' ? prompt : (engine.tokenizer?.decode(ids) ?? '');
  if (top === undefined) return { text };
  const scored: TokenEvent[] = [];
  if (ids.length > 1) {
    const h = engine.submit([ids[0]], { forceTokens: ids.slice(1), maxTokens: ids.length - 1, temperature: 0, ignoreEos: true, logprobs: true, topLogprobs: top });
    for await (const ev of h.events) scored.push(ev);
    await h.done;
  }
  return { text, tokens: { ids, scored } };
}
