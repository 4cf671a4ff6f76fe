import type { WorkerEngine } from '@nerva/engine';
import type { Admission } from './admission.js';
import type { ServerConfig } from './config.js';
import { ApiError } from './errors.js';
import type { FabricTopologyJson } from './fabric-topology.js';
import type { ServerMetrics } from './metrics.js';
import type { OffThreadTokenizer } from './tokenize-pool.js';
import { apiKeyFrom, type ResolvedSecurity, resolveSecurity } from './security-options.js';

/** What the routes share: the configuration and, once loaded, the engine. */
export class ServerState {
  engine: WorkerEngine | undefined;
  admission: Admission | undefined;
  loadError: Error | undefined;
  /** Set when the server stops accepting requests (shutdown). */
  draining = false;
  /** Set while the engine is gone (its worker crashed or hung) and not yet restarted. */
  engineDown: Error | undefined;
  /** Renders and tokenizes large prompts off the event loop (set once the server starts). */
  offThread: OffThreadTokenizer | undefined;
  /** The security options with their defaults. */
  readonly security: ResolvedSecurity;
  /** The API key in force: the configured one, else $NERVA_API_KEY. */
  readonly apiKey: string | undefined;
  /** The fabric as discovered once the engine is up (`fabric_topology` of GET /v1/memory). */
  fabricTopology: FabricTopologyJson | undefined;
  /** Notes for the user about decisions made while loading (fallbacks). */
  readonly notes: string[] = [];
  readonly created = Math.floor(Date.now() / 1000);

  constructor(
    readonly config: ServerConfig,
    /** The name clients put in `model`. */
    readonly modelName: string,
    /** The model folder. */
    readonly modelDir: string,
    readonly metrics: ServerMetrics,
  ) {
    this.security = resolveSecurity(config, config.host);
    this.apiKey = apiKeyFrom(config.apiKey);
  }

  /** The engine and admission, or the 503 to answer while loading, after a failed load, or when draining. */
  ready(): { engine: WorkerEngine; admission: Admission } {
    if (this.draining) throw new ApiError(503, 'service_unavailable', 'the server is shutting down', null, 'shutting_down');
    if (this.loadError) throw new ApiError(503, 'service_unavailable', `the model failed to load: ${this.loadError.message}`, null, 'model_load_failed');
    if (this.engineDown) throw new ApiError(503, 'service_unavailable', 'the engine is restarting after a failure; retry shortly', null, 'engine_unavailable', { 'retry-after': '5' });
    if (!this.engine || !this.admission) throw new ApiError(503, 'service_unavailable', 'the model is still loading; retry shortly', null, 'model_loading', { 'retry-after': '1' });
    return { engine: this.engine, admission: this.admission };
  }

  /** 404 unless `model` is the served model's name. */
  checkModel(model: string): void {
    if (model !== this.modelName) {
      throw new ApiError(404, 'not_found_error', `The model \`${model}\` does not exist. This server serves \`${this.modelName}\`.`, 'model', 'model_not_found');
    }
  }
}
