import type { FastifyInstance } from 'fastify';
import { choiceOptions, type ChoiceJob, toApiError } from './generation.js';
import { badRequest } from './errors.js';
import { parseChatRequest } from './openai-schema.js';
import { admitEarly, checkBudget, clientOf, messageChars } from './request-budget.js';
import { OFF_THREAD_CHARS, offThread } from './tokenize-pool.js';
import { respond } from './respond.js';
import { checkRequestGrammar } from './structured-output.js';
import { toolFormatOf, toolGrammar } from './tool-calls.js';
import type { ModelRouter } from './model-router.js';

/** POST /v1/chat/completions: messages through the model's chat template, then generation. */
export function registerChat(app: FastifyInstance, models: ModelRouter): void {
  app.post('/v1/chat/completions', async (request, reply) => {
    const req = parseChatRequest(request.body);
    const state = models.route(req.model);
    const { engine } = state.ready();
    // Budgets and admission before the template renders and the tokenizer runs (the costly part).
    const chars = messageChars(req.messages) + (req.tools ? JSON.stringify(req.tools.raw).length : 0);
    // Tools: rendered by the template (unless tool_choice is none), calls parsed from the output in
    // the model's format, and with required or a named function the output constrained to calls.
    const tools = req.tools && req.tools.choice.kind !== 'none' ? req.tools : undefined;
    const toolFormat = toolFormatOf(engine.tokenizer?.chatTemplate);
    const toolSpec = tools ? toolGrammar(tools, toolFormat) : undefined;
    const grammar = toolSpec ? { spec: toolSpec, field: 'tool_choice' } : req.grammar;
    // A bad grammar is a 400 before anything runs.
    if (grammar) await checkRequestGrammar(grammar);
    const sampling = grammar ? { ...req.sampling, grammar: grammar.spec } : req.sampling;
    checkBudget(state, req.n, req.sampling, chars);
    const ticket = admitEarly(state, req.n, clientOf(request));
    let promptIds: number[];
    try {
      const tok = engine.tokenizer;
      if (!tok) throw badRequest(`model ${state.modelDir} has no tokenizer; use /v1/completions with token ids`, 'messages', 'no_tokenizer');
      const opts = { addGenerationPrompt: req.addGenerationPrompt, enableThinking: req.enableThinking, tools: tools?.raw, extra: req.templateExtra };
      // A large chat renders and tokenizes in the tokenizer worker; a small one here (no round trip).
      const off = chars >= OFF_THREAD_CHARS ? await offThread(state.offThread?.run({ kind: 'chat', messages: req.messages, opts })) : undefined;
      promptIds = off ?? tok.encode(tok.applyChatTemplate(req.messages, opts), { addSpecialTokens: false });
    } catch (e) {
      ticket.release();
      throw toApiError(e);
    }
    const jobs: ChoiceJob[] = [];
    for (let i = 0; i < req.n; i++) {
      jobs.push({ index: i, promptIndex: 0, promptIds, opts: choiceOptions(engine, sampling, i, { on: req.logprobs, top: req.topLogprobs }) });
    }
    await respond(state, reply, jobs, { kind: 'chat', logprobs: req.logprobs, topLogprobs: req.topLogprobs, ...(tools ? { tools: toolFormat } : {}) }, req, ticket);
  });
}
