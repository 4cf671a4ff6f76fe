import { timingSafeEqual } from 'node:crypto';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { registerChat } from './chat.js';
import { registerCompletions } from './completions.js';
import { ApiError, badRequest } from './errors.js';
import { unknownFabricTopology } from './fabric-topology.js';
import { toApiError } from './generation.js';
import { memoryReportJson, tiersJson } from './memory-report.js';
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

function bearerMatches(header: string | undefined, key: string): boolean {
  if (!header?.startsWith('Bearer ')) return false;
  const a = Buffer.from(header.slice(7).trim());
  const b = Buffer.from(key);
  return a.length === b.length && timingSafeEqual(a, b);
}

/**
 * The HTTP application (not listening): OpenAI routes, /health, /metrics, /v1/models and
 * /v1/memory over a {@link ServerState}. Bodies are parsed here as strict UTF-8 JSON under the
 * configured size limit; every error leaves in OpenAI's shape.
 */
export function buildApp(state: ServerState, opts: { logger?: boolean } = {}): FastifyInstance {
  const app = Fastify({ logger: opts.logger ?? false, bodyLimit: state.config.bodyLimitBytes, forceCloseConnections: 'idle' });

  // Any content type is read as JSON (curl -d sends form encoding by default); invalid UTF-8 is a 400, not U+FFFD.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body: Buffer, done) => {
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

  app.setErrorHandler((err, _req, reply) => {
    const e = classify(err);
    if (e.status >= 500) app.log.error(err);
    return sendError(reply, e);
  });
  app.setNotFoundHandler((req, reply) => sendError(reply, new ApiError(404, 'not_found_error', `no route for ${req.method} ${req.url}`, null, 'not_found')));

  app.addHook('onRequest', async (req: FastifyRequest) => {
    const key = state.config.apiKey;
    if (key === undefined || !req.url.startsWith('/v1')) return;
    if (!bearerMatches(req.headers.authorization, key)) {
      throw new ApiError(401, 'authentication_error', 'missing or invalid API key (send Authorization: Bearer <key>)', null, 'invalid_api_key');
    }
  });

  app.get('/health', async (_req, reply) => {
    if (state.draining) return reply.code(503).send({ status: 'draining' });
    if (state.loadError) return reply.code(503).send({ status: 'failed', error: state.loadError.message });
    if (!state.engine) return reply.code(503).send({ status: 'loading' });
    return { status: 'ok' };
  });

  app.get('/metrics', async (_req, reply) => {
    const e = state.engine;
    if (e) {
      state.metrics.setLoad(e.numRunning, e.numWaiting, e.kvUsage);
      // The memory OS series (tiers, weight traffic, KV pages by tier): the engine's report now.
      // An engine that cannot answer leaves them as last scraped; the rest is still served.
      const mem = await e.stats().then(
        (s) => s.memory,
        () => undefined,
      );
      if (mem) state.metrics.setMemory(mem);
    }
    reply.type(state.metrics.contentType);
    return state.metrics.text();
  });

  app.get('/v1/models', async () => ({
    object: 'list',
    data: [
      {
        id: state.modelName,
        object: 'model',
        created: state.created,
        owned_by: 'nerva',
        root: state.modelDir,
        parent: null,
        max_model_len: state.engine?.maxModelLen ?? null,
      },
    ],
  }));

  app.get('/v1/memory', async (req) => {
    const { engine, admission } = state.ready();
    const s = await engine.stats();
    const q = req.query as Record<string, string | undefined>;
    let invariants: string | undefined;
    if (q.check === '1' || q.check === 'true') {
      try {
        await engine.checkInvariants();
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

  registerChat(app, state);
  registerCompletions(app, state);
  return app;
}
