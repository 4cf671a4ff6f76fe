import type { FastifyInstance } from 'fastify';
import { NervaError } from '@nerva/core';
import type { EmbedResult, WorkerEngine } from '@nerva/engine';
import { ApiError, badRequest } from './errors.js';
import { toApiError } from './generation.js';
import type { ModelRouter } from './model-router.js';
import { admitEarly, clientOf } from './request-budget.js';
import type { ServerState } from './state.js';
import { OFF_THREAD_CHARS, offThread } from './tokenize-pool.js';

/**
 * POST /v1/embeddings in OpenAI's shape: `input` (a text, texts, token ids, or lists of token ids),
 * `model`, `encoding_format` (`float`, or `base64`: the little-endian float32 bytes), `dimensions`
 * (Matryoshka truncation, for models that declare it) and `user` (accepted, changes nothing).
 * Vectors are the engine's embed: the model's final hidden states, pooled and normalized as its
 * folder says. Any other field is a 400 naming it.
 */

const EMBEDDING_FIELDS = new Set(['model', 'input', 'encoding_format', 'dimensions', 'user']);

/** Engine error codes that mean the engine itself is gone (not this request's fault): 503. */
const ENGINE_GONE = new Set(['WORKER_EXIT', 'WORKER_HUNG', 'WORKER_ERROR', 'DISPOSED']);

/** A validated POST /v1/embeddings body. */
export interface EmbeddingRequest {
  model: string;
  /** Texts or token id lists, in input order (the response's `index`). */
  inputs: (string | number[])[];
  encodingFormat: 'float' | 'base64';
  dimensions?: number;
}

function typeName(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v;
}

const isTokenId = (t: unknown): t is number => typeof t === 'number' && Number.isInteger(t);
const INPUT_SHAPE = `'input' must be a string, an array of strings, an array of token ids, or an array of token id arrays`;

/** `input` as a list of inputs; each must hold something (an empty text or list is a 400). */
function readInput(v: unknown): (string | number[])[] {
  if (v === undefined || v === null) throw badRequest(`'input' is required`, 'input');
  if (typeof v === 'string') {
    if (v.length === 0) throw badRequest(`'input' must not be an empty string`, 'input');
    return [v];
  }
  if (!Array.isArray(v)) throw badRequest(`${INPUT_SHAPE}, got ${typeName(v)}`, 'input');
  if (v.length === 0) throw badRequest(`'input' must not be an empty array`, 'input');
  if (v.every(isTokenId)) return [v];
  if (v.every((x) => typeof x === 'string')) {
    const at = v.findIndex((x) => x.length === 0);
    if (at >= 0) throw badRequest(`'input[${at}]' must not be an empty string`, 'input');
    return v as string[];
  }
  if (v.every((x) => Array.isArray(x) && x.every(isTokenId))) {
    const at = v.findIndex((x) => x.length === 0);
    if (at >= 0) throw badRequest(`'input[${at}]' must not be an empty array`, 'input');
    return v as number[][];
  }
  throw badRequest(`${INPUT_SHAPE} (one kind throughout)`, 'input');
}

/** Validate a POST /v1/embeddings body (types here; token ids, lengths and dimensions are the engine's checks). */
export function parseEmbeddingRequest(raw: unknown): EmbeddingRequest {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw badRequest(`the request body must be a JSON object, got ${typeName(raw)}`);
  const body = raw as Record<string, unknown>;
  for (const k of Object.keys(body)) if (!EMBEDDING_FIELDS.has(k)) throw badRequest(`'${k}' is not supported by this server`, k, 'unsupported_parameter');
  const model = body.model;
  if (model === undefined || model === null) throw badRequest(`'model' is required`, 'model');
  if (typeof model !== 'string') throw badRequest(`'model' must be a string, got ${typeName(model)}`, 'model');
  const inputs = readInput(body.input);
  const format = body.encoding_format ?? 'float';
  if (format !== 'float' && format !== 'base64') throw badRequest(`'encoding_format' must be 'float' or 'base64', got ${JSON.stringify(format)}`, 'encoding_format');
  const dims = body.dimensions ?? undefined;
  if (dims !== undefined && (typeof dims !== 'number' || !Number.isInteger(dims) || dims < 1)) {
    throw badRequest(`'dimensions' must be a positive integer, got ${JSON.stringify(dims)}`, 'dimensions');
  }
  const user = body.user ?? undefined;
  if (user !== undefined && typeof user !== 'string') throw badRequest(`'user' must be a string, got ${typeName(user)}`, 'user');
  return { model, inputs, encodingFormat: format, ...(dims !== undefined ? { dimensions: dims as number } : {}) };
}

/** A vector as `encoding_format` asks: numbers, or base64 of its float32 values little-endian. */
export function encodeEmbedding(v: Float32Array, format: 'float' | 'base64'): number[] | string {
  if (format === 'float') return Array.from(v);
  const bytes = Buffer.alloc(v.length * 4);
  for (let i = 0; i < v.length; i++) bytes.writeFloatLE(v[i], i * 4);
  return bytes.toString('base64');
}

/** Budgets before any tokenizing: inputs per request (as sequences), characters of text. */
function checkEmbeddingBudget(state: ServerState, req: EmbeddingRequest): void {
  const b = state.security;
  const perRequest = b.maxSequencesPerRequest ?? Math.max(1, Math.floor((state.admission?.capacity ?? 4) / 4));
  if (req.inputs.length > perRequest) {
    throw badRequest(`'input' holds ${req.inputs.length} inputs; this server takes at most ${perRequest} per request`, 'input', 'too_many_sequences');
  }
  const chars = req.inputs.reduce((n, x) => n + (typeof x === 'string' ? x.length : 0), 0);
  if (chars > b.maxPromptChars) throw badRequest(`the inputs have ${chars} characters; this server takes at most ${b.maxPromptChars}`, 'input', 'prompt_too_long');
}

/** The token ids of every input: texts with the model's tokenizer (a large one off the event loop). */
async function tokenize(state: ServerState, engine: WorkerEngine, inputs: readonly (string | number[])[]): Promise<number[][]> {
  const out: number[][] = [];
  for (const x of inputs) {
    if (typeof x !== 'string') {
      out.push(x);
      continue;
    }
    if (!engine.tokenizer) throw badRequest(`this model has no tokenizer (tokenizer.json); send token ids as 'input'`, 'input', 'no_tokenizer');
    const off = x.length >= OFF_THREAD_CHARS ? await offThread(state.offThread?.run({ kind: 'text', text: x })) : undefined;
    out.push(off ?? engine.encode(x));
  }
  return out;
}

/** Tokens per input and per request, against the model's length and the request budget: 400 naming `input`. */
function checkLengths(state: ServerState, engine: WorkerEngine, ids: readonly number[][]): void {
  const max = engine.maxModelLen;
  for (const [i, x] of ids.entries()) {
    if (x.length > max) {
      throw badRequest(`'input[${i}]' has ${x.length} tokens; this model's maximum length is ${max} tokens. Shorten the input.`, 'input', 'context_length_exceeded');
    }
  }
  const total = ids.reduce((n, x) => n + x.length, 0);
  const limit = state.security.maxRequestTokens;
  if (total > limit) throw badRequest(`the inputs have ${total} tokens; this server takes at most ${limit} per request`, 'input', 'request_too_large');
}

/** An error of the engine's embed as the response to give. */
function embedError(e: unknown, timedOut: boolean): unknown {
  if (timedOut) return new ApiError(408, 'timeout_error', `the request did not finish within the server's request timeout`, null, 'request_timeout');
  const code = e instanceof NervaError ? e.code : (e as { code?: unknown } | null)?.code;
  if (code === 'UNSUPPORTED') return badRequest(`this model cannot serve embeddings: ${(e as Error).message}`, 'model', 'embeddings_unsupported');
  if (code === 'EMBEDDING_CONFIG') return new ApiError(500, 'server_error', `the model's embedding configuration is not usable: ${(e as Error).message}`, null, 'embedding_config');
  if (typeof code === 'string' && ENGINE_GONE.has(code)) {
    return new ApiError(503, 'service_unavailable', `the engine failed: ${(e as Error).message}; retry shortly`, null, 'engine_unavailable', { 'retry-after': '5' });
  }
  return toApiError(e);
}

/** The OpenAI response body of an embed result. */
function responseBody(model: string, r: EmbedResult, format: 'float' | 'base64'): Record<string, unknown> {
  const tokens = r.promptTokens.reduce((a, b) => a + b, 0);
  return {
    object: 'list',
    data: r.embeddings.map((v, index) => ({ object: 'embedding', index, embedding: encodeEmbedding(v, format) })),
    model,
    usage: { prompt_tokens: tokens, total_tokens: tokens },
  };
}

/** POST /v1/embeddings: routed by `model`, admitted like the generation endpoints (one sequence per input). */
export function registerEmbeddings(app: FastifyInstance, models: ModelRouter): void {
  app.post('/v1/embeddings', async (request, reply) => {
    const req = parseEmbeddingRequest(request.body);
    const state = models.route(req.model);
    const { engine } = state.ready();
    checkEmbeddingBudget(state, req);
    const ticket = admitEarly(state, req.inputs.length, clientOf(request));
    // A timeout or a client that went away aborts the inputs still running (their KV is freed).
    const ac = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      ac.abort(new Error('request timeout'));
    }, state.config.requestTimeoutS * 1000);
    timer.unref();
    const onClose = () => {
      if (!reply.raw.writableEnded) ac.abort(new Error('client disconnected'));
    };
    reply.raw.on('close', onClose);
    try {
      const ids = await tokenize(state, engine, req.inputs);
      checkLengths(state, engine, ids);
      const r = await engine.embed(ids, { ...(req.dimensions !== undefined ? { dimensions: req.dimensions } : {}), signal: ac.signal });
      return responseBody(state.modelName, r, req.encodingFormat);
    } catch (e) {
      throw embedError(e, timedOut);
    } finally {
      clearTimeout(timer);
      reply.raw.off('close', onClose);
      // The engine answered (a result or an error) after its inputs left the scheduler.
      ticket.release();
    }
  });
}
