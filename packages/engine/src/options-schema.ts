/**
 * The engine options a user sets from outside code, declared once: each with its
 * {@link EngineOptions} field, its command-line flag, its key in the `nerva serve` TOML config,
 * its kind (which fixes how a value is parsed and checked), the values it allows, its default and
 * a one-line help. `nerva run`, `nerva serve`, the TOML config and `nerva-bench` derive their
 * flags, `--help` lines, config keys and validation from this table (see @nerva/server's
 * option-flags.ts), so an option is added or documented in one place.
 *
 * Only data lives here: the engine takes no dependency on a CLI library.
 */
import type { EngineOptions } from './engine-options.js';

/**
 * How an option's value is written and checked.
 * - 'string': a non-empty string; 'path': one naming a file or folder (a relative path in a
 *   config file resolves against the file's folder, on the command line against the working one).
 * - 'bool': a flag without a value (`--batch-invariant`, or `--no-prefix-caching` for one that is
 *   on by default); true or false in TOML.
 * - 'int': a non-negative integer; 'posint': a positive one; 'port': an integer from 0 to 65535.
 * - 'size': a byte size (`4GiB`, `512MB`, `4G` = 4 GiB, or a byte count).
 * - 'sizes': a list of byte sizes (comma-separated on the command line: `10GiB,20GiB`; an array in TOML).
 * - 'fraction': a number from 0 to 1.
 * - 'choice': one of {@link OptionSpec.choices}.
 * - 'split': 'auto', 'off' or a fraction strictly between 0 and 1.
 * - 'strings': a list of non-empty strings (comma-separated on the command line; an array in TOML).
 * - 'intrange': two integers, min and max with min <= max, negatives allowed (`-5,5` on the
 *   command line; `[-5, 5]` in TOML).
 */
export type OptionKind = 'string' | 'path' | 'bool' | 'int' | 'posint' | 'port' | 'size' | 'sizes' | 'fraction' | 'choice' | 'split' | 'strings' | 'intrange';

/** One user-settable option. `N` is the field it sets (of EngineOptions, or of a server's config). */
export interface OptionSpec<N extends string = string> {
  /** The field the value goes to. */
  readonly name: N;
  /**
   * The command-line flag with its value placeholder (`--vram-budget <size>`); a 'bool' option's
   * flag has none (`--batch-invariant`; `--no-prefix-caching` sets false). Absent: no flag.
   */
  readonly flag?: string;
  /** Its key in a TOML config file (`vram_budget`). Absent: not a config key. */
  readonly toml?: string;
  readonly kind: OptionKind;
  /** The allowed values of a 'choice' option. */
  readonly choices?: readonly string[];
  /**
   * The value that applies when the option is absent, where it is a constant (absent: the
   * engine derives it, e.g. from the environment or the device; the help says how).
   */
  readonly default?: string | number | boolean | readonly number[];
  /** One line for `--help`; the default, when there is one, is appended by whoever prints it. */
  readonly help: string;
}

/** An engine option: its name is a field of {@link EngineOptions}. */
export type EngineOptionSpec = OptionSpec<keyof EngineOptions & string>;

/** Every engine option with a flag or a config key, in the order `--help` lists them. */
export const ENGINE_OPTIONS = [
  { name: 'model', flag: '--model <dir>', toml: 'model', kind: 'path', help: 'model folder (config.json + safetensors + tokenizer.json), or a .gguf file' },
  { name: 'backend', flag: '--backend <name>', toml: 'backend', kind: 'choice', choices: ['cpu', 'cuda', 'auto'], default: 'auto', help: 'compute backend' },
  {
    name: 'numerics',
    flag: '--numerics <mode>',
    toml: 'numerics',
    kind: 'choice',
    choices: ['exact', 'bf16'],
    default: 'exact',
    help: "activation rounding: exact or bf16 (transformers' bf16 rounding points)",
  },
  {
    name: 'matmulPrecision',
    flag: '--matmul-precision <p>',
    toml: 'matmul_precision',
    kind: 'choice',
    choices: ['exact', 'bf16'],
    help: 'matmuls over more than 8 rows (prefill): exact (f32-grade) or bf16 (activations rounded to bf16 once; faster); default NERVA_MATMUL, else exact',
  },
  {
    name: 'batchInvariant',
    flag: '--batch-invariant',
    toml: 'batch_invariant',
    kind: 'bool',
    help: 'batch-invariant decode on CUDA: each request gets the tokens it gets alone, whatever shares the batch (slower decode batches); default NERVA_BATCH_INVARIANT, else off',
  },
  { name: 'maxNumSeqs', flag: '--max-num-seqs <n>', toml: 'max_num_seqs', kind: 'posint', help: 'sequences batched together' },
  { name: 'maxNumBatchedTokens', flag: '--max-num-batched-tokens <n>', toml: 'max_num_batched_tokens', kind: 'posint', help: 'token budget of one scheduler step' },
  {
    name: 'decodePromptBudget',
    flag: '--decode-prompt-budget <n>',
    toml: 'decode_prompt_budget',
    kind: 'posint',
    help: 'prompt tokens a step may take while other requests decode: bounds how long arriving prompts stall running streams, at some cost in throughput (default: no limit beyond --max-num-batched-tokens; nerva serve: 256)',
  },
  { name: 'maxModelLen', flag: '--max-model-len <n>', toml: 'max_model_len', kind: 'posint', help: 'longest prompt + output' },
  { name: 'kvCacheBytes', flag: '--kv-cache-bytes <size>', toml: 'kv_cache_bytes', kind: 'size', help: 'bytes for the paged KV cache (a size: 256MiB, or bytes)' },
  {
    name: 'kvCacheDtype',
    flag: '--kv-cache-dtype <dtype>',
    toml: 'kv_cache_dtype',
    kind: 'choice',
    choices: ['auto', 'f32', 'bf16'],
    default: 'auto',
    help: 'KV cache element type: auto (f32 under exact numerics, bf16 under bf16 numerics), f32, or bf16 (keys and values rounded once when stored: half the bytes a token)',
  },
  { name: 'enablePrefixCaching', flag: '--no-prefix-caching', toml: 'enable_prefix_caching', kind: 'bool', default: true, help: 'disable prefix caching' },
  {
    name: 'vramBudget',
    flag: '--vram-budget <size>',
    toml: 'vram_budget',
    kind: 'size',
    help: 'compute-tier memory the engine may use, e.g. 4GiB (G = GiB); weights that do not fit stream from host memory',
  },
  { name: 'hostBudget', flag: '--host-budget <size>', toml: 'host_budget', kind: 'size', help: 'host memory for streamed weights, e.g. 32GiB; beyond it they spill to --offload-dir' },
  { name: 'offloadDir', flag: '--offload-dir <dir>', toml: 'offload_dir', kind: 'path', help: 'directory of the disk tier for weights the host budget cannot hold' },
  {
    name: 'hostCompute',
    flag: '--host-compute <mode>',
    kind: 'split',
    default: 'auto',
    help: "compute near data: 'auto' (split by rates measured at start-up), 'off', or the fraction of each streamed layer's MLP channels the host computes, in (0, 1)",
  },
  {
    name: 'kvVramBudget',
    flag: '--kv-vram-budget <size>',
    toml: 'kv_vram_budget',
    kind: 'size',
    help: 'tiered KV: compute-tier memory for hot KV pages, e.g. 64MiB; pages beyond it move to pinned host memory (same tokens)',
  },
  {
    name: 'kvHostBudget',
    flag: '--kv-host-budget <size>',
    toml: 'kv_host_budget',
    kind: 'size',
    help: 'tiered KV: pinned host memory for warm KV pages (default 8x --kv-vram-budget); beyond it they spill to --kv-offload-dir',
  },
  { name: 'kvOffloadDir', flag: '--kv-offload-dir <dir>', toml: 'kv_offload_dir', kind: 'path', help: 'tiered KV: directory of the cold tier for KV pages (swapped-out sequences)' },
  {
    name: 'kvWarmLinkShare',
    flag: '--kv-warm-link-share <x>',
    toml: 'kv_warm_link_share',
    kind: 'fraction',
    help: 'tiered KV: share (0..1) of the warm KV pages the GPU attends over itself, streamed through VRAM over PCIe a layer ahead, while the host CPU attends over the rest (default on a GPU: what a staging of a quarter of --kv-vram-budget holds, up to 1; 0 on the CPU backend)',
  },
  {
    name: 'pipelineParallel',
    flag: '--pipeline-parallel <n>',
    toml: 'pipeline_parallel',
    kind: 'posint',
    help: 'pipeline stages: the layers split into N contiguous ranges (N > 1 needs N GPUs on CUDA unless --allow-single-device-stages; any N on the CPU backend)',
  },
  {
    name: 'pipelineMicroBatches',
    flag: '--pipeline-micro-batches <n>',
    toml: 'pipeline_micro_batches',
    kind: 'posint',
    help: "micro-batches a pipelined pass's sequences are split into, so stages on separate GPUs overlap (default: 1 when stages share a device, N otherwise)",
  },
  {
    name: 'stageVramBudgets',
    flag: '--stage-vram-budgets <sizes>',
    toml: 'stage_vram_budgets',
    kind: 'sizes',
    help: "each pipeline stage's VRAM budget, one per stage (e.g. 10GiB,20GiB): stages with less take fewer layers, all resident (--vram-budget gives every stage the same)",
  },
  {
    name: 'tensorParallel',
    flag: '--tensor-parallel <n>',
    toml: 'tensor_parallel',
    kind: 'posint',
    help: 'tensor-parallel shards: every layer split across N devices, exact (N must divide the KV heads; with --pipeline-parallel S, N shards per stage; N x S GPUs on CUDA unless --allow-single-device-stages; a CPU backend per shard on the CPU)',
  },
  {
    name: 'allowSingleDeviceStages',
    flag: '--allow-single-device-stages',
    toml: 'allow_single_device_stages',
    kind: 'bool',
    help: 'place every pipeline stage (or tensor-parallel shard) on one GPU (tests the split on a one-GPU machine)',
  },
  { name: 'runAhead', flag: '--no-run-ahead', kind: 'bool', help: "wait for each decode step's tokens before enqueuing the next (runAhead off)" },
  { name: 'runAheadSteps', flag: '--run-ahead-steps <n>', kind: 'posint', help: 'decode steps one graph replay enqueued ahead may run (default 4)' },
  {
    name: 'grammarThreads',
    flag: '--grammar-threads <n>',
    toml: 'grammar_threads',
    kind: 'int',
    help: "worker threads computing constrained decoding's token masks (0: on the step loop's thread); default one a core but one, at most 8",
  },
  { name: 'profile', flag: '--profile', kind: 'bool', help: 'split device time per token into buckets (projection, norm, attention, mlp, sampling)' },
] as const satisfies readonly EngineOptionSpec[];

/** The name of an engine option of {@link ENGINE_OPTIONS}. */
export type EngineOptionName = (typeof ENGINE_OPTIONS)[number]['name'];

/** The spec of an engine option, by its EngineOptions name. */
export function engineOption(name: EngineOptionName): EngineOptionSpec {
  const spec = ENGINE_OPTIONS.find((s) => s.name === name);
  if (!spec) throw new RangeError(`no engine option "${name}"`);
  return spec;
}

/** The flag's name without its placeholder (`--vram-budget`), for messages. */
export function flagName(spec: OptionSpec): string {
  if (spec.flag === undefined) throw new RangeError(`option "${spec.name}" has no flag`);
  return spec.flag.split(' ')[0];
}

/** The allowed values of a 'choice' option as a message lists them: `"cpu", "cuda" or "auto"`. */
export function describeChoices(choices: readonly string[]): string {
  const quoted = choices.map((c) => JSON.stringify(c));
  return quoted.length <= 1 ? quoted.join('') : `${quoted.slice(0, -1).join(', ')} or ${quoted[quoted.length - 1]}`;
}
