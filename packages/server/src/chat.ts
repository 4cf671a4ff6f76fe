import type { FastifyInstance } from 'fastify';
import { choiceOptions, type ChoiceJob, toApiError } from './generation.js';
import { badRequest } from './errors.js';
import { parseChatRequest } from './openai-schema.js';
import { admitEarly, checkBudget, messageChars } from './request-budget.js';
import { OFF_THREAD_CHARS, offThread } from './tokenize-pool.js';
import { respond } from './respond.js';
import type { ModelRouter } from './model-router.js';

/** POST /v1/chat/completions: messages through the model's chat template, then generation. */
export function registerChat(app: FastifyInstance, models: ModelRouter): void {
  app.post('/v1/chat/completions', async (request, reply) => {
    const req = parseChatRequest(request.body);
    const state = models.route(req.model);
    const { engine } = state.ready();
    // Budgets and admission before the template renders and the tokenizer runs (the costly part).
    const chars = messageChars(req.messages) + (req.tools ? JSON.stringify(req.tools).length : 0);
    checkBudget(state, req.n, req.sampling, chars);
    const ticket = admitEarly(state, req.n);
    let promptIds: number[];
    try {
      const tok = engine.tokenizer;
      if (!tok) throw badRequest(`model ${state.modelDir} has no tokenizer; use /v1/completions with token ids`, 'messages', 'no_tokenizer');
      const opts = { addGenerationPrompt: req.addGenerationPrompt, enableThinking: req.enableThinking, tools: req.tools, extra: req.templateExtra };
      // A large chat renders and tokenizes in the tokenizer worker; a small one here (no round trip).
      const off = chars >= OFF_THREAD_CHARS ? await offThread(state.offThread?.run({ kind: 'chat', messages: req.messages, opts })) : undefined;
      promptIds = off ?? tok.encode(tok.applyChatTemplate(req.messages, opts), { addSpecialTokens: false });
    } catch (e) {
      ticket.release();
      throw toApiError(e);
    }
    const jobs: ChoiceJob[] = [];
    for (let i = 0; i < req.n; i++) {
      jobs.push({ index: i, promptIndex: 0, promptIds, opts: choiceOptions(engine, req.sampling, i, { on: req.logprobs, top: req.topLogprobs }) });
    }
    await respond(state, reply, jobs, { kind: 'chat', logprobs: req.logprobs, topLogprobs: req.topLogprobs }, req, ticket);
  });
}
