import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import { WorkerEngine, type WorkerEngineCreateOptions } from '@nerva/engine';
import { isGgufPath, modelTokenizerFacts } from '@nerva/models';
import type { SysfsReader } from '@nerva/transport';
import type { FastifyInstance } from 'fastify';
import { Admission } from './admission.js';
import { buildApp } from './app.js';
import { API_KEY_ENV, checkKvTiers, type ServerConfig } from './config.js';
import { defaultModelDir } from './default-model.js';
import { ConfigError } from './errors.js';
import { discoverFabricTopology, reportedCapabilities } from './fabric-topology.js';
import { EngineRestarts } from './engine-restarts.js';
import { ServerMetrics } from './metrics.js';
import { ModelRouter } from './model-router.js';
import { modelConfigs } from './model-set.js';
import { isLoopback } from './security-options.js';
import { ServerState } from './state.js';
import { OffThreadTokenizer } from './tokenize-pool.js';

/**
 * The template used when a model ships none (base models): role-labelled turns, as a plain
 * transcript. Its use is announced at startup; a config `chat_template` replaces it.
 */
export const FALLBACK_CHAT_TEMPLATE =
  "{% for m in messages %}{{ m['role'] | upper }}:\n{{ m['content'] }}\n\n{% endfor %}{% if add_generation_prompt %}ASSISTANT:\n{% endif %}";

/** A listening server. */
export interface RunningServer {
  app: FastifyInstance;
  /** The first (or only) model's state. */
  state: ServerState;
  /** Every model's state, in the order the models were given. */
  states: readonly ServerState[];
  /** `http://host:port` actually bound (port 0 resolves to the real port). */
  url: string;
  /** Resolves when every model is loaded; rejects with the first load error. */
  ready: Promise<void>;
  /**
   * Graceful shutdown: refuse new requests (503), let in-flight ones finish (up to the drain
   * timeout, then abort them), close the listener and the engines.
   */
  shutdown(): Promise<void>;
}

/** A model of the server before its engine loads: its state and the options its engine starts with. */
interface PreparedModel {
  state: ServerState;
  engineOptions: WorkerEngineCreateOptions;
}

/** Check one model's configuration and build its state (no engine yet): errors here stop the server before it listens. */
async function prepareModel(config: ServerConfig): Promise<PreparedModel> {
  const modelDir = resolve(config.model ?? defaultModelDir());
  // A model folder, or a GGUF file carrying everything in its metadata.
  if (isGgufPath(modelDir)) {
    if (!existsSync(modelDir)) throw new ConfigError('model', `model file ${modelDir} does not exist`);
  } else if (!existsSync(join(modelDir, 'config.json'))) throw new ConfigError('model', `model folder ${modelDir} has no config.json`);
  checkKvTiers(config);
  const modelName = config.servedModelName ?? basename(modelDir).replace(/\.gguf$/i, '');
  let chatTemplate: string | undefined;
  if (config.chatTemplate !== undefined) {
    try {
      chatTemplate = await readFile(config.chatTemplate, 'utf8');
    } catch (e) {
      throw new ConfigError('chat_template', `cannot read chat template ${config.chatTemplate}: ${(e as Error).message}`);
    }
  }
  const metrics = new ServerMetrics(modelName);
  const state = new ServerState(config, modelName, modelDir, metrics);
  const facts = await modelTokenizerFacts(modelDir);
  if (chatTemplate === undefined && facts.hasTokenizer && !facts.hasChatTemplate) {
    chatTemplate = FALLBACK_CHAT_TEMPLATE;
    state.notes.push(`model ${modelName} has no chat template; /v1/chat/completions uses the plain "ROLE:" transcript template (set chat_template to replace it)`);
  }
  const engineOptions: WorkerEngineCreateOptions = {
    model: modelDir,
    backend: config.backend,
    numerics: config.numerics,
    matmulPrecision: config.matmulPrecision,
    ...(config.batchInvariant !== undefined ? { batchInvariant: config.batchInvariant } : {}),
    maxNumSeqs: config.maxNumSeqs,
    maxNumBatchedTokens: config.maxNumBatchedTokens,
    ...(config.decodePromptBudget !== undefined ? { decodePromptBudget: config.decodePromptBudget } : {}),
    kvCacheBytes: config.kvCacheBytes,
    kvCacheDtype: config.kvCacheDtype,
    maxModelLen: config.maxModelLen,
    enablePrefixCaching: config.enablePrefixCaching,
    vramBudget: config.vramBudget,
    hostBudget: config.hostBudget,
    offloadDir: config.offloadDir,
    kvVramBudget: config.kvVramBudget,
    kvHostBudget: config.kvHostBudget,
    kvOffloadDir: config.kvOffloadDir,
    kvWarmLinkShare: config.kvWarmLinkShare,
    pipelineParallel: config.pipelineParallel,
    stageVramBudgets: config.stageVramBudgets,
    pipelineMicroBatches: config.pipelineMicroBatches,
    tensorParallel: config.tensorParallel,
    allowSingleDeviceStages: config.allowSingleDeviceStages,
    chatTemplate,
    watchdogMs: state.security.engineWatchdogS * 1000,
  };
  return { state, engineOptions };
}

/**
 * Listen first, then load each model in a worker of its own: /health answers 503 until every
 * engine is ready, so orchestrators can probe while weights load. Once the first engine is up,
 * the fabric topology is discovered (from `o.sysfs`, default the machine's /sys) and its one line
 * is logged. Several models (`config.models`) each get their own engine, options and memory
 * budget, and requests go to the one their `model` names.
 */
export async function startServer(
  config: ServerConfig,
  o: {
    log?: (line: string) => void;
    logger?: boolean;
    sysfs?: SysfsReader;
    /** An engine died and could not be restarted (`nerva serve` exits non-zero); default: stay up, /health 503. */
    onFatal?: (e: Error) => void;
  } = {},
): Promise<RunningServer> {
  const log = o.log ?? (() => {});
  const models: PreparedModel[] = [];
  for (const c of modelConfigs(config)) models.push(await prepareModel(c));
  let router: ModelRouter;
  try {
    router = new ModelRouter(models.map((m) => m.state));
  } catch (e) {
    throw new ConfigError('served_model_name', (e as Error).message);
  }
  // Tokenizer workers once every model's configuration has passed (a refused one leaves none running).
  for (const { state, engineOptions } of models) {
    if ((await modelTokenizerFacts(state.modelDir)).hasTokenizer) state.offThread = new OffThreadTokenizer({ dir: state.modelDir, chatTemplate: engineOptions.chatTemplate });
  }
  const app = buildApp(router, { logger: o.logger });
  const address = await app.listen({ host: config.host, port: config.port });
  const port = (app.server.address() as { port: number }).port;
  const url = address.startsWith('http') ? `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${port}` : address;

  if (!isLoopback(config.host) && router.primary.apiKey === undefined) {
    log(`nerva: warning: listening on ${config.host} without an API key: anyone who can reach this address can use the model (set --api-key or ${API_KEY_ENV})`);
  }

  const started = models.map(({ state, engineOptions }, i) => {
    const { metrics } = state;
    const restarts = new EngineRestarts(state, engineOptions, {
      log,
      onFatal: o.onFatal,
      attach: (e) => {
        metrics.detach();
        metrics.attach(e);
      },
    });
    const ready = (async () => {
      try {
        const engine = await WorkerEngine.create(engineOptions);
        if (state.draining) {
          await engine.dispose();
          return;
        }
        // Once per start; never throws (an unreadable sysfs gives an object that says unknown).
        const fabric = discoverFabricTopology({ reader: o.sysfs, deviceKind: engine.info.deviceKind, capabilities: reportedCapabilities(engine.info) });
        state.fabricTopology = fabric.json;
        if (i === 0) log(`nerva: ${fabric.line}`);
        const running = state.config.maxNumSeqs ?? (engine.info.deviceKind === 'cpu' ? 64 : 128);
        state.admission = new Admission(running, state.config.maxQueue, state.security.maxSequencesPerClient);
        metrics.attach(engine);
        state.engine = engine;
        restarts.watch(engine);
        for (const n of [...engine.info.notes, ...state.notes]) log(`nerva: ${models.length > 1 ? `${state.modelName}: ` : ''}${n}`);
      } catch (e) {
        state.loadError = e as Error;
        throw e;
      }
    })();
    ready.catch(() => {});
    return { state, restarts, ready };
  });
  const ready = Promise.all(started.map((m) => m.ready)).then(() => undefined);
  ready.catch(() => {});

  let closing: Promise<void> | undefined;
  const shutdown = () => {
    closing ??= (async () => {
      for (const { state, restarts } of started) {
        state.draining = true;
        restarts.stop();
        state.admission?.startDraining();
      }
      const closed = app.close();
      let timer: NodeJS.Timeout | undefined;
      const timedOut = await Promise.race([
        Promise.all(started.map((m) => m.state.admission?.idle())).then(() => false),
        new Promise<boolean>((r) => (timer = setTimeout(() => r(true), config.drainTimeoutS * 1000))),
      ]);
      clearTimeout(timer);
      // Past the drain timeout, disposing the engines ends the remaining streams with an error.
      if (timedOut) await Promise.all(started.map((m) => m.state.engine?.dispose()));
      await Promise.all(started.map((m) => m.ready.catch(() => {})));
      // Connections that finished a response stay open as keep-alive; close them as they go idle.
      const sweep = setInterval(() => app.server.closeIdleConnections(), 50);
      try {
        await closed;
      } finally {
        clearInterval(sweep);
      }
      for (const { state } of started) {
        state.metrics.detach();
        await state.offThread?.close();
        await state.engine?.dispose();
      }
    })();
    return closing;
  };
  return { app, state: router.primary, states: router.states, url, ready, shutdown };
}
