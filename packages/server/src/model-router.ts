import { ApiError } from './errors.js';
import type { ServerState } from './state.js';

/**
 * The models a server serves, by the name clients put in `model`: each a {@link ServerState}
 * with its own engine, admission, metrics and options. The server-wide settings (listening,
 * security, API key) are the first model's, which every model shares.
 */
export class ModelRouter {
  private readonly byName: ReadonlyMap<string, ServerState>;

  constructor(readonly states: readonly ServerState[]) {
    if (states.length === 0) throw new RangeError('a server needs at least one model');
    const byName = new Map<string, ServerState>();
    for (const s of states) {
      if (byName.has(s.modelName)) throw new RangeError(`two models are served as "${s.modelName}"; give one a served_model_name`);
      byName.set(s.modelName, s);
    }
    this.byName = byName;
  }

  /** The state whose settings are server-wide (security, body limit, API key). */
  get primary(): ServerState {
    return this.states[0];
  }

  /** The served names, in the order the models were given. */
  get names(): string[] {
    return this.states.map((s) => s.modelName);
  }

  /** The model a request names, or the 404 OpenAI gives for an unknown model (naming those served). */
  route(model: string): ServerState {
    const s = this.byName.get(model);
    if (s) return s;
    const served = this.names.map((n) => `\`${n}\``).join(', ');
    throw new ApiError(404, 'not_found_error', `The model \`${model}\` does not exist. This server serves ${served}.`, 'model', 'model_not_found');
  }

  /** The model of a query parameter (GET /v1/memory?model=): optional when one model is served. */
  pick(model: string | undefined): ServerState {
    if (model !== undefined) return this.route(model);
    if (this.states.length === 1) return this.primary;
    throw new ApiError(400, 'invalid_request_error', `this server serves several models: name one with ?model= (${this.names.join(', ')})`, 'model', 'model_required');
  }
}
