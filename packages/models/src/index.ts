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
export * from './ollama.js';
export * from './hub-gguf.js';
export * from './model-dir.js';
export * from './model-file.js';
export * from './weight-store.js';
export * from './gguf/gguf-error.js';
export * from './gguf/gguf-value.js';
export * from './gguf/gguf-header.js';
export * from './gguf/gguf-file.js';
export * from './gguf/gguf-writer.js';
export * from './gguf/gguf-names.js';
export * from './gguf/gguf-spec.js';
export * from './gguf/gguf-tokenizer.js';
export * from './gguf/gguf-checkpoint.js';
export * from './gguf/gguf-model.js';
export * from './gguf/gguf-type-plan.js';
export * from './gguf/gguf-convert-options.js';
export * from './gguf/gguf-convert.js';
export * from './gguf/gguf-requantize.js';
export * from './gguf/gguf-split.js';
export * from './model-tokenizer.js';
export * from './gguf/gguf-synth.js';
