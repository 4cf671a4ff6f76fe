import type { WorkerGenerateOptions } from '@nerva/engine';
import type { ChatMessage } from '@nerva/models';
import { badRequest } from './errors.js';
import { GRAMMAR_FIELDS, readGrammar, type RequestGrammar } from './structured-output.js';
import { checkToolMessages, readTools, type ToolRequest } from './tool-calls.js';

/**
 * Validation of OpenAI request bodies. Types are checked here (a wrong type is a 400 naming the
 * field); value ranges are checked by the engine, whose errors name the field the same way.
 * No field is ignored: one this server does not take (an OpenAI or vLLM field it lacks, or an
 * unknown one) is a 400 `unsupported_parameter` naming it, as OpenAI answers an unknown argument.
 */

/** Fields both endpoints take. `user` (an end-user id for abuse monitoring) changes no output. */
const COMMON_FIELDS = [
  'model', 'stream', 'stream_options', 'n', 'max_tokens', 'temperature', 'top_p', 'top_k', 'min_p', 'repetition_penalty', 'presence_penalty',
  'frequency_penalty', 'seed', 'min_tokens', 'stop', 'stop_token_ids', 'ignore_eos', 'include_stop_str_in_output', 'priority', 'cache_salt',
  'logit_bias', 'logprobs', 'nerva', 'return_token_ids', 'user', ...GRAMMAR_FIELDS,
];
const CHAT_FIELDS = new Set([...COMMON_FIELDS, 'messages', 'max_completion_tokens', 'top_logprobs', 'chat_template_kwargs', 'add_generation_prompt', 'tools', 'tool_choice', 'parallel_tool_calls']);
const COMPLETION_FIELDS = new Set([...COMMON_FIELDS, 'prompt', 'echo', 'best_of', 'suffix']);

/** A 400 naming the first field of `body` not in `known`. */
function refuseUnknown(body: Record<string, unknown>, known: ReadonlySet<string>): void {
  for (const k of Object.keys(body)) {
    if (!known.has(k)) throw badRequest(`'${k}' is not supported by this server`, k, 'unsupported_parameter');
  }
}

/** Sampling and stopping options common to both endpoints, in the engine's spelling. */
export type SamplingFields = Omit<WorkerGenerateOptions, 'logprobs' | 'topLogprobs'>;

/** NERVA extensions a request may ask for. */
export interface NervaExtras {
  /** Return each choice's generated token ids (`token_ids`), as vLLM's `return_token_ids`. */
  returnTokenIds: boolean;
  /** Return each choice's ledger summary (`nerva_ledger`). */
  ledger: boolean;
}

interface CommonRequest {
  model: string;
  stream: boolean;
  includeUsage: boolean;
  n: number;
  sampling: SamplingFields;
  extras: NervaExtras;
  /** The output constraint (response_format, guided_*, structured_outputs), when one was given. */
  grammar?: RequestGrammar;
}

export interface ChatRequest extends CommonRequest {
  messages: ChatMessage[];
  /** Sampled-token logprobs, plus `topLogprobs` alternatives. */
  logprobs: boolean;
  topLogprobs: number;
  addGenerationPrompt: boolean;
  enableThinking?: boolean;
  templateExtra: Record<string, unknown>;
  /** tools, tool_choice and parallel_tool_calls, when tools were given. */
  tools?: ToolRequest;
}

export interface CompletionRequest extends CommonRequest {
  /** One or more prompts: text or token ids. */
  prompts: (string | number[])[];
  /** Completions' `logprobs`: alternatives per token (0 = the sampled token's only). */
  logprobs?: number;
  /** Return the prompt before the completion (with logprobs: the prompt tokens' logprobs too). */
  echo: boolean;
}

const MAX_N = 128;

type Body = Record<string, unknown>;

function typeName(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v;
}

/** Typed field reads with a 400 naming the field on a wrong type; null counts as absent. */
class Fields {
  constructor(readonly body: Body) {}

  has(k: string): boolean {
    return this.body[k] !== undefined && this.body[k] !== null;
  }

  raw(k: string): unknown {
    return this.body[k] ?? undefined;
  }

  num(k: string): number | undefined {
    const v = this.raw(k);
    if (v === undefined) return undefined;
    if (typeof v !== 'number' || !Number.isFinite(v)) throw badRequest(`'${k}' must be a number, got ${typeName(v)}`, k);
    return v;
  }

  int(k: string): number | undefined {
    const v = this.num(k);
    if (v !== undefined && !Number.isInteger(v)) throw badRequest(`'${k}' must be an integer, got ${v}`, k);
    return v;
  }

  bool(k: string): boolean | undefined {
    const v = this.raw(k);
    if (v === undefined) return undefined;
    if (typeof v !== 'boolean') throw badRequest(`'${k}' must be a boolean, got ${typeName(v)}`, k);
    return v;
  }

  str(k: string): string | undefined {
    const v = this.raw(k);
    if (v === undefined) return undefined;
    if (typeof v !== 'string') throw badRequest(`'${k}' must be a string, got ${typeName(v)}`, k);
    return v;
  }

  obj(k: string): Body | undefined {
    const v = this.raw(k);
    if (v === undefined) return undefined;
    if (typeof v !== 'object' || Array.isArray(v)) throw badRequest(`'${k}' must be an object, got ${typeName(v)}`, k);
    return v as Body;
  }

  intList(k: string): number[] | undefined {
    const v = this.raw(k);
    if (v === undefined) return undefined;
    if (!Array.isArray(v) || v.some((x) => typeof x !== 'number' || !Number.isInteger(x))) throw badRequest(`'${k}' must be an array of integers`, k);
    return v as number[];
  }
}

function asBody(body: unknown): Body {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw badRequest(`the request body must be a JSON object, got ${typeName(body)}`);
  return body as Body;
}

function readStop(f: Fields): string[] | undefined {
  const v = f.raw('stop');
  if (v === undefined) return undefined;
  if (typeof v === 'string') return [v];
  if (Array.isArray(v) && v.every((s) => typeof s === 'string')) return v as string[];
  throw badRequest(`'stop' must be a string or an array of strings`, 'stop');
}

function readCommon(f: Fields, maxTokensKeys: string[]): CommonRequest {
  const model = f.str('model');
  if (model === undefined) throw badRequest(`'model' is required`, 'model');
  const stream = f.bool('stream') ?? false;
  const so = f.obj('stream_options');
  if (so && !stream) throw badRequest(`'stream_options' is only allowed when 'stream' is true`, 'stream_options');
  const includeUsage = so ? new Fields(so).bool('include_usage') ?? false : false;
  const n = f.int('n') ?? 1;
  if (n < 1 || n > MAX_N) throw badRequest(`'n' must be in [1, ${MAX_N}], got ${n}`, 'n');
  let maxTokens: number | undefined;
  for (const k of maxTokensKeys) {
    const v = f.int(k);
    if (v === undefined) continue;
    if (v < 1) throw badRequest(`'${k}' must be at least 1, got ${v}`, k);
    maxTokens = v;
  }
  const cacheSalt = f.str('cache_salt');
  if (cacheSalt !== undefined && cacheSalt.length === 0) throw badRequest(`'cache_salt' must not be empty`, 'cache_salt');
  const logitBias = f.obj('logit_bias');
  if (logitBias) {
    for (const [k, v] of Object.entries(logitBias)) {
      if (!/^(0|[1-9][0-9]*)$/.test(k)) throw badRequest(`'logit_bias' keys must be token ids, got ${JSON.stringify(k)}`, 'logit_bias');
      if (typeof v !== 'number' || !Number.isFinite(v)) throw badRequest(`'logit_bias' values must be numbers in [-100, 100], got ${typeName(v)} for token ${k}`, 'logit_bias');
    }
  }
  const grammar = readGrammar(f.body);
  const sampling: SamplingFields = {
    temperature: f.num('temperature'),
    topP: f.num('top_p'),
    topK: f.int('top_k'),
    minP: f.num('min_p'),
    repetitionPenalty: f.num('repetition_penalty'),
    presencePenalty: f.num('presence_penalty'),
    frequencyPenalty: f.num('frequency_penalty'),
    seed: f.int('seed'),
    maxTokens,
    minTokens: f.int('min_tokens'),
    stop: readStop(f),
    stopTokenIds: f.intList('stop_token_ids'),
    ignoreEos: f.bool('ignore_eos'),
    includeStopStrInOutput: f.bool('include_stop_str_in_output'),
    priority: f.int('priority'),
    cacheSalt,
    ...(logitBias && Object.keys(logitBias).length > 0 ? { logitBias: logitBias as Record<string, number> } : {}),
    ...(grammar ? { grammar: grammar.spec } : {}),
  };
  const nerva = f.obj('nerva');
  const nf = nerva ? new Fields(nerva) : undefined;
  const extras: NervaExtras = {
    returnTokenIds: (f.bool('return_token_ids') ?? false) || (nf?.bool('token_ids') ?? false),
    ledger: nf?.bool('ledger') ?? false,
  };
  return { model, stream, includeUsage, n, sampling, extras, ...(grammar ? { grammar } : {}) };
}

function readMessages(f: Fields): ChatMessage[] {
  const v = f.raw('messages');
  if (v === undefined) throw badRequest(`'messages' is required`, 'messages');
  if (!Array.isArray(v)) throw badRequest(`'messages' must be an array, got ${typeName(v)}`, 'messages');
  if (v.length === 0) throw badRequest(`'messages' must contain at least one message`, 'messages');
  return v.map((m, i) => {
    const p = `messages[${i}]`;
    if (typeof m !== 'object' || m === null || Array.isArray(m)) throw badRequest(`'${p}' must be an object`, p);
    const msg = m as Body;
    if (typeof msg.role !== 'string' || msg.role.length === 0) throw badRequest(`'${p}.role' must be a non-empty string`, `${p}.role`);
    let content = msg.content;
    if (content === undefined) content = null;
    if (Array.isArray(content)) {
      // Text parts are joined, as vLLM does for text-only models.
      const texts = content.map((part, j) => {
        const pp = `${p}.content[${j}]`;
        if (typeof part !== 'object' || part === null) throw badRequest(`'${pp}' must be an object`, pp);
        const pt = part as Body;
        if (pt.type !== 'text') throw badRequest(`'${pp}.type' ${JSON.stringify(pt.type)} is not supported (text only)`, `${pp}.type`);
        if (typeof pt.text !== 'string') throw badRequest(`'${pp}.text' must be a string`, `${pp}.text`);
        return pt.text;
      });
      content = texts.join('\n');
    } else if (content !== null && typeof content !== 'string') {
      throw badRequest(`'${p}.content' must be a string, an array of text parts, or null`, `${p}.content`);
    }
    if (content === null && msg.role !== 'assistant') throw badRequest(`'${p}.content' is required for role '${msg.role}'`, `${p}.content`);
    return { ...msg, role: msg.role, content } as ChatMessage;
  });
}

/** Validate a POST /v1/chat/completions body. */
export function parseChatRequest(raw: unknown): ChatRequest {
  const f = new Fields(asBody(raw));
  refuseUnknown(f.body, CHAT_FIELDS);
  const messages = readMessages(f);
  checkToolMessages(messages as unknown as Body[]);
  const common = readCommon(f, ['max_tokens', 'max_completion_tokens']);
  const logprobs = f.bool('logprobs') ?? false;
  const topLogprobs = f.int('top_logprobs') ?? 0;
  if (topLogprobs < 0 || topLogprobs > 20) throw badRequest(`'top_logprobs' must be in [0, 20], got ${topLogprobs}`, 'top_logprobs');
  if (topLogprobs > 0 && !logprobs) throw badRequest(`'top_logprobs' needs 'logprobs': true`, 'top_logprobs');
  const kw = f.obj('chat_template_kwargs') ?? {};
  const kwf = new Fields(kw);
  const enableThinking = kwf.bool('enable_thinking');
  const { enable_thinking: _et, ...templateExtra } = kw;
  const tools = readTools(f.body);
  if (tools && tools.choice.kind !== 'none' && tools.choice.kind !== 'auto' && common.grammar) {
    throw badRequest(`'tool_choice' ${tools.choice.kind === 'required' ? 'required' : 'naming a function'} cannot be combined with '${common.grammar.field}'`, 'tool_choice');
  }
  const out: ChatRequest = {
    ...common,
    messages,
    logprobs,
    topLogprobs,
    addGenerationPrompt: f.bool('add_generation_prompt') ?? true,
    templateExtra,
  };
  if (enableThinking !== undefined) out.enableThinking = enableThinking;
  if (tools !== undefined) out.tools = tools;
  return out;
}

/** Validate a POST /v1/completions body. */
export function parseCompletionRequest(raw: unknown): CompletionRequest {
  const f = new Fields(asBody(raw));
  refuseUnknown(f.body, COMPLETION_FIELDS);
  const p = f.raw('prompt');
  let prompts: (string | number[])[];
  const isIds = (x: unknown): x is number[] => Array.isArray(x) && x.length > 0 && x.every((t) => typeof t === 'number' && Number.isInteger(t));
  if (p === undefined) throw badRequest(`'prompt' is required`, 'prompt');
  if (typeof p === 'string') prompts = [p];
  else if (isIds(p)) prompts = [p];
  else if (Array.isArray(p) && p.length > 0 && p.every((x) => typeof x === 'string' || isIds(x))) prompts = p as (string | number[])[];
  else throw badRequest(`'prompt' must be a string, an array of token ids, or an array of those`, 'prompt');
  if (prompts.some((x) => x.length === 0)) throw badRequest(`'prompt' must not be empty`, 'prompt');
  const echo = f.bool('echo') ?? false;
  const suffix = f.str('suffix');
  if (suffix !== undefined && suffix.length > 0) throw badRequest(`'suffix' (insertion) is not supported by this server`, 'suffix', 'unsupported_parameter');
  const bestOf = f.int('best_of');
  const common = readCommon(f, ['max_tokens']);
  // vLLM's V1 engine takes best_of only as n (it returns every sample); so does this server.
  if (bestOf !== undefined && bestOf !== common.n) throw badRequest(`'best_of' other than 'n' is not supported`, 'best_of', 'unsupported_parameter');
  const logprobs = f.int('logprobs');
  if (logprobs !== undefined && (logprobs < 0 || logprobs > 20)) throw badRequest(`'logprobs' must be in [0, 20], got ${logprobs}`, 'logprobs');
  const out: CompletionRequest = { ...common, prompts, echo };
  if (logprobs !== undefined) out.logprobs = logprobs;
  return out;
}
