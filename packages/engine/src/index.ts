// The default entry registers the CUDA and CPU backends (each package loaded lazily, when used).
import './default-backends.js';

export * from './backend-registry.js';
export * from './backend-select.js';
export * from './engine.js';
export { NervaModel, type GenerationDefaults } from './model.js';
export { ModelContext } from './context.js';
export * from './embedding.js';
export { PROFILES_KEPT, type PassProfile } from './profiling.js';
export * from './host-sampler.js';
export * from './model-runner.js';
export * from './model-weights.js';
export * from './request.js';
export * from './request-validation.js';
export * from './sampling-params.js';
export * from './scheduler.js';
export * from './token-stream.js';
export * from './worker/index.js';
export * from './stages/index.js';
export { KvBudgetError } from './kv-tiering.js';
export type { MeasuredRates } from './rates.js';
export * from './options-schema.js';
export { checkGrammar, grammarOf, normalizeGrammar, GrammarEngineError, GRAMMAR_LIMITS, XGRAMMAR_VERSION, type GrammarOptions, type GrammarSpec } from './grammar/index.js';
