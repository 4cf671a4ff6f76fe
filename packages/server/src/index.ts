export { defaultModelDir, DEFAULT_MODEL_NAME } from "./default-model.js";
export * from './admission.js';
export * from './app.js';
export * from './config.js';
export * from './errors.js';
export * from './metrics.js';
export * from './openai-schema.js';
export * from './server.js';
export * from './state.js';
