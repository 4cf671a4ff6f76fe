export * from './protocol.js';
export * from './worker-engine.js';
