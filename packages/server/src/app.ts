import { timingSafeEqual } from 'node:crypto';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest, type FastifyServerOptions } from 'fastify';
import { AggregatorRegistry } from 'prom-client';
import { registerChat } from './chat.js';
import { registerCompletions } from './completions.js';
import { registerEmbeddings } from './embeddings.js';
import { ApiError, badRequest } from './errors.js';
import { unknownFabricTopology } from './fabric-topology.js';
import { toApiError } from './generation.js';
import { memoryReportJson, tiersJson } from './memory-report.js';
import { ModelRouter } from './model-router.js';
import { hostOf } from './security-options.js';
import type { ServerState } from './state.js';

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** Send `e` as OpenAI's error JSON. */
function sendError(reply: FastifyReply, e: ApiError): FastifyReply {
  for (const [k, v] of Object.entries(e.headers)) reply.header(k, v);
  return reply.code(e.status).type('application/json').send(e.toBody());
}

/** Fastify's own errors (body too large, bad media type...) and everything else → an ApiError. */
function classify(err: unknown): ApiError {
  const mapped = toApiError(err);
  if (mapped instanceof ApiError) return mapped;
  const e = err as { statusCode?: number; code?: string; message?: string };
  if (e.code === 'FST_ERR_CTP_BODY_TOO_LARGE') return new ApiError(413, 'invalid_request_error', `request body too large: ${e.message ?? ''}`, null, 'request_too_large');
  if (typeof e.statusCode === 'number' && e.statusCode >= 400 && e.statusCode < 500) {
    return new ApiError(e.statusCode, 'invalid_request_error', e.message ?? 'bad request', null, e.code ?? null);
  }
  return new ApiError(500, 'server_error', 'internal server error', null, 'internal_error');
}

/** A stats query the engine has not answered by then gets 503 (a hung engine never answers). */
const STATS_TIMEOUT_MS = 5000;

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms / 1000} s`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/** Routes served without the API key (method and route pattern). */
const OPEN_ROUTES = new Set(['GET /health', 'HEAD /health']);

/** Pino through Fastify: one line per request and per response; headers that carry secrets are redacted if ever logged. */
function accessLogger(): FastifyServerOptions['logger'] {
  return { level: 'info', redact: ['req.headers.authorization', 'req.headers.cookie'] };
}

function bearerMatches(header: string | undefined, key: string): boolean {
  const m = header === undefined ? null : /^bearer\s+(.*)$/i.exec(header);
  if (!m) return false;
  const a = Buffer.from(m[1].trim());
  const b = Buffer.from(key);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** The one status of a model /health reports (ok, or why not), and the error behind it. */
function healthOf(state: ServerState): { status: string; error?: string } {
  if (state.draining) return { status: 'draining' };
  if (state.loadError) return { status: 'failed', error: state.loadError.message };
  if (state.engineDown) return { status: 'unavailable', error: state.engineDown.message };
  if (!state.engine) return { status: 'loading' };
  return { status: 'ok' };
}

/**
 * The HTTP application (not listening): OpenAI routes, /health, /metrics, /v1/models and
 * /v1/memory over a {@link ServerState}, or over several models' states (a {@link ModelRouter}:
 * requests go to the model they name). Bodies are parsed here as strict UTF-8 JSON under the
 * configured size limit; every error leaves in OpenAI's shape.
 */
export function buildApp(served: ServerState | ModelRouter, opts: { logger?: boolean } = {}): FastifyInstance {
  const models = served instanceof ModelRouter ? served : new ModelRouter([served]);
  // The server-wide settings: every model shares the first one's.
  const state = models.primary;
  const sec = state.security;
  const app = Fastify({
    // Pino's access lines (method, url, status, time; never bodies, so never prompts or keys).
    logger: opts.logger ? accessLogger() : false,
    bodyLimit: state.config.bodyLimitBytes,
    forceCloseConnections: 'idle',
    connectionTimeout: 0,
    keepAliveTimeout: sec.keepAliveTimeoutS * 1000,
    // Node's requestTimeout: the whole request (headers and body) must arrive within it.
    requestTimeout: sec.bodyTimeoutS * 1000,
    return503OnClosing: true,
    // Errors Fastify raises before routing (a malformed URL, a bad header) leave in OpenAI's shape too.
    frameworkErrors: (err, _req, reply) => void sendError(reply, classify(err)),
    // Slow senders (slowloris) are cut at the header and request timeouts; Node checks them on
    // this interval (its default, 30 s, would let a timeout overrun by that much).
    http: { headersTimeout: Math.min(sec.headersTimeoutS, sec.bodyTimeoutS) * 1000, connectionsCheckingInterval: 1000 },
  });
  app.server.maxConnections = sec.maxConnections;

  // Only application/json bodies: a form or text/plain post (what a web page can send without a
  // CORS preflight) gets 415. Invalid UTF-8 is a 400, not U+FFFD.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_req, body: Buffer, done) => {
    let text: string;
    try {
      text = utf8.decode(body);
    } catch {
      done(badRequest('the request body is not valid UTF-8', null, 'invalid_utf8'), undefined);
      return;
    }
    if (text.trim().length === 0) {
      done(badRequest('the request body is empty; expected a JSON object', null, 'invalid_json'), undefined);
      return;
    }
    try {
      done(null, JSON.parse(text));
    } catch (e) {
      done(badRequest(`the request body is not valid JSON: ${(e as Error).message}`, null, 'invalid_json'), undefined);
    }
  });

  app.setErrorHandler((err, req, reply) => {
    const e = classify(err);
    if (e.status >= 500 && e.status !== 503) req.log.error({ err }, 'request failed');
    return sendError(reply, e);
  });
  app.setNotFoundHandler((req, reply) => sendError(reply, new ApiError(404, 'not_found_error', `no route for ${req.method} ${req.url}`, null, 'not_found')));

  app.addHook('onRequest', async (req: FastifyRequest) => {
    // Origin-form targets only: an absolute-form target ("POST http://h/v1/...") names its own
    // authority, which the Host check below would not see.
    if (!req.raw.url?.startsWith('/')) throw badRequest('the request target must be a path (origin form)', null, 'invalid_target');
    if (sec.allowedHosts) {
      const host = hostOf(req.headers.host);
      if (host === undefined || !sec.allowedHosts.has(host)) {
        throw new ApiError(403, 'invalid_request_error', `the Host header ${JSON.stringify(req.headers.host ?? '')} is not allowed (see allowed_hosts)`, null, 'host_not_allowed');
      }
    }
    // Decided on the route the router matched (decoded, normalized), never on the raw target;
    // everything but the open routes needs the key, unknown paths included.
    const key = state.apiKey;
    if (key === undefined || OPEN_ROUTES.has(`${req.method} ${req.routeOptions.url ?? ''}`)) return;
    if (!bearerMatches(req.headers.authorization, key)) {
      throw new ApiError(401, 'authentication_error', 'missing or invalid API key (send Authorization: Bearer <key>)', null, 'invalid_api_key');
    }
  });

  app.get('/health', async (req, reply) => {
    // Without the key, /health says only whether the server can serve; the reason needs the key.
    const details = state.apiKey === undefined || bearerMatches(req.headers.authorization, state.apiKey);
    // Ok when every model is; else the first model's reason that is not ok (named when there are several).
    for (const s of models.states) {
      const h = healthOf(s);
      if (h.status === 'ok') continue;
      const error = h.error !== undefined && models.states.length > 1 ? `${s.modelName}: ${h.error}` : h.error;
      return reply.code(503).send({ status: h.status, ...(details && error !== undefined ? { error } : {}) });
    }
    return { status: 'ok' };
  });

  app.get('/metrics', async (_req, reply) => {
    for (const s of models.states) {
      const e = s.engine;
      if (!e) continue;
      s.metrics.setLoad(e.numRunning, e.numWaiting, e.kvUsage);
      // The memory OS series (tiers, weight traffic, KV pages by tier): the engine's report now.
      // An engine that cannot answer leaves them as last scraped; the rest is still served.
      const mem = await withTimeout(e.stats(), STATS_TIMEOUT_MS).then(
        (st) => st.memory,
        () => undefined,
      );
      if (mem) s.metrics.setMemory(mem);
    }
    reply.type(state.metrics.contentType);
    if (models.states.length === 1) return state.metrics.text();
    // One exposition for every model: each series keeps its model_name label.
    return AggregatorRegistry.aggregate(await Promise.all(models.states.map((s) => s.metrics.registry.getMetricsAsJSON()))).metrics();
  });

  app.get('/v1/models', async () => ({
    object: 'list',
    data: models.states.map((s) => ({
      id: s.modelName,
      object: 'model',
      created: s.created,
      owned_by: 'nerva',
      root: s.modelDir,
      parent: null,
      max_model_len: s.engine?.maxModelLen ?? null,
    })),
  }));

  app.get('/v1/memory', async (req) => {
    // ?model= names the model; optional when there is one.
    const state = models.pick((req.query as Record<string, string | undefined>).model);
    const { engine, admission } = state.ready();
    const s = await withTimeout(engine.stats(), STATS_TIMEOUT_MS).catch((e: Error) => {
      throw new ApiError(503, 'service_unavailable', `the engine did not answer: ${e.message}`, null, 'engine_unavailable');
    });
    const q = req.query as Record<string, string | undefined>;
    let invariants: string | undefined;
    if (q.check === '1' || q.check === 'true') {
      try {
        await withTimeout(engine.checkInvariants(), STATS_TIMEOUT_MS);
        invariants = 'ok';
      } catch (e) {
        invariants = (e as Error).message;
      }
    }
    // Block 0 is the cache's reserved null block: neither free nor ever held by a request.
    const kvUsed = s.kv.totalBlocks - 1 - s.kv.freeBlocks;
    const mem = memoryReportJson(s.memory);
    return {
      object: 'memory',
      backend: engine.info.backendName,
      // Every tier the engine uses (compute tier, pinned/host replicas of streamed weights, disk),
      // with its budget and the bytes of weights, staging slots, KV pages and the rest.
      // With tiered KV the compute tier's KV pool holds the hot pages only (the rest are warm or cold).
      tiers: tiersJson(s.memory, s.memory.kv ? s.memory.kv.tiers.hot.used / s.numBlocks : kvUsed / s.numBlocks),
      mode: mem.mode,
      fabric: mem.fabric,
      vram_budget_bytes: state.config.vramBudget ?? null,
      host_budget_bytes: state.config.hostBudget ?? null,
      offload_dir: state.config.offloadDir ?? null,
      // Tiered KV: the hot pool's budget, the warm pool's (pinned host) and the cold tier's directory.
      kv_vram_budget_bytes: state.config.kvVramBudget ?? null,
      kv_host_budget_bytes: state.config.kvHostBudget ?? null,
      kv_offload_dir: state.config.kvOffloadDir ?? null,
      // The share in effect: the configured one, else the engine's default (1 on a GPU, 0 on the CPU); null without tiered KV.
      kv_warm_link_share: s.memory.kv ? (s.memory.kv.staging?.share ?? 0) : null,
      weights_bytes: s.weightBytes,
      kv_cache_bytes: s.kvCacheBytes,
      // Per device of a tensor-parallel model (each shard's weight and KV bytes); null on one device.
      devices: mem.devices ?? null,
      kv_block_size: s.blockSize,
      kv_blocks_total: s.kv.totalBlocks - 1,
      kv_blocks_free: s.kv.freeBlocks,
      kv_blocks_used: kvUsed,
      kv_blocks_cached: s.kv.cachedBlocks,
      kv_sequences: s.kv.sequences,
      kv_usage: s.kvUsage,
      num_requests_running: s.running,
      num_requests_waiting: s.waiting,
      server_sequences_in_flight: admission.inFlight,
      // Where the weights are (hot in the compute tier, streamed through staging slots, on disk),
      // what moved by which path since start and what it cost, and how prefetch kept up.
      weights: mem.weights,
      moved: mem.moved,
      streamed_bytes_per_pass: mem.streamed_bytes_per_pass,
      prefetch: mem.prefetch,
      // KV pages by tier (hot, warm, cold), their moves and the passes that merged host partials;
      // null when every KV page is hot (no kv_vram_budget).
      kv: mem.kv ?? null,
      notes: mem.notes,
      // The machine's fabric, discovered once at start: GPUs and their links, NVLink, IOMMU, NUMA,
      // the fabric classification and every transfer path that falls back (and why).
      fabric_topology: state.fabricTopology ?? unknownFabricTopology('fabric not discovered', engine.info.deviceKind),
      ...(invariants !== undefined ? { kv_invariants: invariants } : {}),
    };
  });

  registerChat(app, models);
  registerCompletions(app, models);
  registerEmbeddings(app, models);
  return app;
}
