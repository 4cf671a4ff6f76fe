/**
 * The server's configuration as a type: `ServerConfig` and the `[[models]]` entries it lists,
 * which name its fields (config.ts reads and checks them, model-set.ts the entries).
 */
import type { ENGINE_OPTIONS } from '@nerva/engine';
import type { SecurityOptions } from './security-options.js';

/** Everything `nerva serve` can be told, from a TOML file, flags, or code. */
export interface ServerConfig extends SecurityOptions {
  /** Model folder; the embedded default model when absent. */
  model?: string;
  /**
   * Several models in one server (TOML `[[models]]`, or `--model` given more than once), each
   * with its own engine and options (memory budgets included; the top-level keys are their
   * defaults), routed by the request's `model`. Replaces `model`.
   */
  models?: ModelEntry[];
  /** Name clients use in `model`; default: the folder's name. */
  servedModelName?: string;
  host: string;
  port: number;
  /**
   * When set (here or in $NERVA_API_KEY), every route but /health requires
   * `Authorization: Bearer <apiKey>`.
   */
  apiKey?: string;
  backend: 'cpu' | 'cuda' | 'auto';
  /** Activation rounding: 'exact' (default) or 'bf16' (transformers' bf16 rounding points). */
  numerics?: 'exact' | 'bf16';
  /**
   * Precision of matmuls over more than 8 rows (prefill): 'exact' (default; f32-grade) or 'bf16'
   * (activations rounded to bf16 once, fp32 accumulation; faster prefill). Default from NERVA_MATMUL.
   */
  matmulPrecision?: 'exact' | 'bf16';
  /**
   * Batch-invariant decode on CUDA (default: NERVA_BATCH_INVARIANT, else off): each request's
   * tokens are those it gets alone, whatever else shares the batch; decode batches run on CUDA
   * cores (slower past a few rows). The CPU backend ignores it.
   */
  batchInvariant?: boolean;
  maxNumSeqs?: number;
  maxNumBatchedTokens?: number;
  /** Prompt tokens a step may take while other requests decode (EngineOptions.decodePromptBudget; default SERVE_DECODE_PROMPT_BUDGET). */
  decodePromptBudget?: number;
  kvCacheBytes?: number;
  /** KV cache element type: 'auto' (default: f32 under exact numerics), 'f32' or 'bf16'. */
  kvCacheDtype?: 'auto' | 'f32' | 'bf16';
  maxModelLen?: number;
  enablePrefixCaching: boolean;
  /** Requests admitted beyond `maxNumSeqs` before new ones get 429. */
  maxQueue: number;
  /** A request still unfinished after this long is aborted (408, or an error event in a stream). */
  requestTimeoutS: number;
  /** Largest accepted request body; larger ones get 413. */
  bodyLimitBytes: number;
  /** Path of a Jinja chat template that replaces the model's own. */
  chatTemplate?: string;
  /** On shutdown, in-flight requests get this long to finish before they are aborted. */
  drainTimeoutS: number;
  /**
   * Bytes of compute-tier memory (VRAM on CUDA) the engine may use; weights that do not fit stream
   * through VRAM staging slots from host memory (the memory OS). Absent: no budget, all resident.
   */
  vramBudget?: number;
  /** Bytes of host memory for streamed weight blocks; beyond it they spill to `offloadDir`. */
  hostBudget?: number;
  /** Directory of the disk tier (weight blocks the host budget cannot hold). */
  offloadDir?: string;
  /**
   * Tiered KV: bytes of the hot KV pool in the compute tier (VRAM on CUDA). KV pages beyond it are
   * demoted to pinned host memory (`kvHostBudget`) and past that to `kvOffloadDir`; the attention
   * sinks and the recent window stay hot, and the tokens are those of the all-hot run. Sets the KV
   * cache size (overrides `kvCacheBytes`). Absent: every KV page is hot.
   */
  kvVramBudget?: number;
  /** Bytes of the warm KV pool in pinned host memory (default with `kvVramBudget`: 8x the hot pool). */
  kvHostBudget?: number;
  /** Directory of the cold KV tier (pages of swapped-out sequences). Needs `kvVramBudget`. */
  kvOffloadDir?: string;
  /**
   * Share (0..1) of the warm KV pool that the device attends over itself, copied into VRAM over
   * the link a layer ahead, while the host CPU computes the rest (EngineOptions kvWarmLinkShare;
   * default on a GPU: as much of the warm pool as a staging of a quarter of kv_vram_budget holds,
   * all of it when it fits; 0 on the CPU backend). Needs `kvVramBudget`.
   */
  kvWarmLinkShare?: number;
  /**
   * Pipeline stages (default 1): contiguous layer ranges, one stage each. On CUDA, N > 1 needs N
   * visible GPUs unless `allowSingleDeviceStages`; the CPU backend takes any N up to the layer count.
   */
  pipelineParallel?: number;
  /** Micro-batches per pipelined pass (EngineOptions pipelineMicroBatches). */
  pipelineMicroBatches?: number;
  /** Each pipeline stage's VRAM budget in bytes, one per stage (EngineOptions stageVramBudgets). */
  stageVramBudgets?: number[];
  /**
   * Tensor-parallel shards (default 1): every layer split across N devices, exact. N must divide
   * the model's KV heads; on CUDA N > 1 needs N visible GPUs unless `allowSingleDeviceStages`.
   */
  tensorParallel?: number;
  /** Put every pipeline stage on one GPU (a test of the pipeline on a one-GPU machine). */
  allowSingleDeviceStages?: boolean;
  /** Structured access log, JSON lines on stdout (`nerva serve`: default true). */
  accessLog?: boolean;
}

/** The fields a `[[models]]` table may set: the engine's options, the served name and the chat template. */
export type ModelFields = Partial<Pick<ServerConfig, Exclude<(typeof ENGINE_OPTIONS)[number]['name'] & keyof ServerConfig, 'model'> | 'servedModelName' | 'chatTemplate'>>;

/** One model of a `[[models]]` list: `model` as written (a folder or a name, resolved when the server starts) and its own options. */
export interface ModelEntry extends ModelFields {
  model: string;
}
