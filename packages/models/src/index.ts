/**
 * @nerva/models: checkpoints and specs. Safetensors files and shard manifests, HF config.json →
 * {@link ModelSpec}, canonical weight slots, RoPE frequencies, tokenizers and chat templates,
 * streaming detokenization, synthetic checkpoints and model resolution. Never runs a forward pass.
 */
export * from './errors.js';
export * from './safetensors.js';
export * from './checkpoint.js';
export * from './config.js';
export * from './rope.js';
export * from './weights.js';
export * from './tokenizer.js';
export * from './detokenizer.js';
export * from './synth.js';
export * from './resolve.js';
export * from './model-dir.js';
export * from './model-file.js';
