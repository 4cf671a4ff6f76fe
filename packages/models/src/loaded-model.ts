import type { ModelSpec } from './config.js';
import type { NervaTokenizer } from './tokenizer.js';
import type { WeightStore } from './weight-store.js';
import type { ResolvedWeights } from './weights.js';

/** Everything the engine needs from a model directory (or a GGUF model file). */
export interface LoadedModel {
  /** The model folder, or the `.gguf` file. */
  dir: string;
  spec: ModelSpec;
  /** Open weights (a safetensors checkpoint or a GGUF file); the caller owns them and must `close()` them. */
  checkpoint: WeightStore;
  /** Every tensor the spec needs, located and shape-checked. */
  weights: ResolvedWeights;
  /** Present when the directory has a `tokenizer.json`. */
  tokenizer?: NervaTokenizer;
  /** Parsed `generation_config.json`, when present. */
  generationConfig?: Record<string, unknown>;
  /** Union of the EOS ids of config.json, generation_config.json and the tokenizer. */
  stopTokenIds: number[];
}

export interface LoadModelOptions {
  /** Load the tokenizer when present (default true). */
  tokenizer?: boolean;
}
