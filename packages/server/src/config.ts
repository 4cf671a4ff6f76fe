import { readFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { ENGINE_OPTIONS, engineOption, flagName, type OptionSpec } from '@nerva/engine';
import { ConfigError } from './errors.js';
import { type ModelEntry, parseModelsTable } from './model-set.js';
import { checkOptionValue } from './options.js';
import { API_KEY_ENV, SECURITY_OPTIONS, type SecurityOptions } from './security-options.js';

export { API_KEY_ENV } from './security-options.js';

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

/** The options of the server itself (not the engine's), declared as the engine's are. */
export const SERVER_OPTIONS = [
  { name: 'servedModelName', flag: '--served-model-name <name>', toml: 'served_model_name', kind: 'string', help: 'model name clients use (default: the folder name)' },
  { name: 'host', flag: '--host <host>', toml: 'host', kind: 'string', default: '127.0.0.1', help: 'address to listen on' },
  { name: 'port', flag: '--port <n>', toml: 'port', kind: 'port', default: 8000, help: 'port (0 = any free port)' },
  { name: 'apiKey', flag: '--api-key <key>', toml: 'api_key', kind: 'string', help: `require Authorization: Bearer <key> on every route but /health (default: $${API_KEY_ENV})` },
  { name: 'maxQueue', flag: '--max-queue <n>', toml: 'max_queue', kind: 'int', default: 256, help: 'sequences that may wait beyond max-num-seqs before 429' },
  { name: 'requestTimeoutS', flag: '--request-timeout <s>', toml: 'request_timeout_s', kind: 'posint', default: 600, help: 'seconds before an unfinished request is aborted' },
  { name: 'bodyLimitBytes', flag: '--body-limit <bytes>', toml: 'body_limit_bytes', kind: 'posint', default: 1024 * 1024, help: 'largest request body in bytes' },
  { name: 'chatTemplate', flag: '--chat-template <file>', toml: 'chat_template', kind: 'path', help: "Jinja chat template replacing the model's" },
  { name: 'drainTimeoutS', toml: 'drain_timeout_s', kind: 'int', default: 30, help: 'seconds in-flight requests get to finish on shutdown' },
  { name: 'accessLog', flag: '--no-access-log', toml: 'access_log', kind: 'bool', default: true, help: 'no structured access log (JSON lines on stdout)' },
  // Security and robustness (SecurityOptions; resolveSecurity fills in these defaults).
  ...SECURITY_OPTIONS,
] as const satisfies readonly OptionSpec<keyof ServerConfig>[];

/**
 * Every option `nerva serve` takes from a config file, in the order its keys are listed: the
 * engine's with a TOML key (each a field of ServerConfig of the same name), then the server's.
 */
export const CONFIG_OPTIONS = ([...ENGINE_OPTIONS, ...SERVER_OPTIONS] as readonly OptionSpec[]).filter((s) => s.toml !== undefined) as readonly OptionSpec<
  keyof ServerConfig
>[];

const defaultOf = (specs: readonly OptionSpec[], name: string): unknown => specs.find((s) => s.name === name)?.default;

/**
 * `nerva serve`'s default EngineOptions.decodePromptBudget: a server's clients watch the gaps
 * between tokens, so arriving prompts enter 256 tokens a step while others decode (the engine's
 * own default, for offline batches, is the whole step budget). Measured on one H200 with
 * `nerva-bench serve` (Qwen3-0.6B shape, 64 streams, 128-token prompts, 256 tokens each):
 * inter-token p99 25.0 ms (6.9 mean steps) at 2048, 14.8 ms (3.3) at 512, 9.9 ms (2.4) at 256,
 * for 17.5k, 13.9k and 15.0k output tokens/s (docs/results/throughput.md). On an 8B, 256 prompt
 * tokens cost about two 64-row decode steps.
 */
export const SERVE_DECODE_PROMPT_BUDGET = 256;

export const DEFAULT_CONFIG: ServerConfig = {
  host: defaultOf(SERVER_OPTIONS, 'host') as string,
  port: defaultOf(SERVER_OPTIONS, 'port') as number,
  backend: engineOption('backend').default as ServerConfig['backend'],
  enablePrefixCaching: engineOption('enablePrefixCaching').default as boolean,
  decodePromptBudget: SERVE_DECODE_PROMPT_BUDGET,
  maxQueue: defaultOf(SERVER_OPTIONS, 'maxQueue') as number,
  requestTimeoutS: defaultOf(SERVER_OPTIONS, 'requestTimeoutS') as number,
  bodyLimitBytes: defaultOf(SERVER_OPTIONS, 'bodyLimitBytes') as number,
  drainTimeoutS: defaultOf(SERVER_OPTIONS, 'drainTimeoutS') as number,
};

/** The accepted keys: TOML spelling → option spec. Anything else is an error naming the key. */
const KEYS = new Map(CONFIG_OPTIONS.map((s) => [s.toml!, s]));

const BY_FIELD = new Map(CONFIG_OPTIONS.map((s) => [s.name as string, s.toml!]));

/** The TOML key of a config field (for messages about flags). */
export function configKeyOf(field: keyof ServerConfig): string {
  return BY_FIELD.get(field) ?? field;
}

/**
 * Validate a table of TOML-spelled keys (from a file or built by hand). Unknown keys and wrong
 * types throw {@link ConfigError} naming the key. Relative paths resolve against `baseDir`.
 */
export function parseConfigTable(table: Record<string, unknown>, where: string, baseDir?: string): Partial<ServerConfig> {
  const out: Partial<ServerConfig> = {};
  for (const [key, raw] of Object.entries(table)) {
    if (key === 'models') {
      if (table.model !== undefined) throw new ConfigError('models', `${where}: give "model" or [[models]] tables, not both`);
      out.models = parseModelsTable(raw, where, CONFIG_OPTIONS, baseDir);
      continue;
    }
    const spec = KEYS.get(key);
    if (!spec) throw new ConfigError(key, `${where}: unknown key "${key}" (known: ${[...KEYS.keys()].join(', ')})`);
    let v = checkOptionValue(spec, key, raw, where);
    if (spec.kind === 'path' && baseDir !== undefined) v = resolve(baseDir, v as string);
    (out as Record<string, unknown>)[spec.name] = v;
  }
  return out;
}

/** Read and validate a TOML config file. */
export async function loadConfigFile(path: string): Promise<Partial<ServerConfig>> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (e) {
    throw new ConfigError('config', `cannot read config file ${path}: ${(e as Error).message}`);
  }
  let table: Record<string, unknown>;
  try {
    table = parseToml(text) as Record<string, unknown>;
  } catch (e) {
    throw new ConfigError('config', `${path}: not valid TOML: ${(e as Error).message.split('\n')[0]}`);
  }
  return parseConfigTable(table, path, dirname(resolve(path)));
}

/**
 * The effective configuration: defaults, then the file, then flags (flags win). Flags use field
 * names; undefined flags are ignored so a file value stays.
 */
export function mergeConfig(file: Partial<ServerConfig>, flags: Partial<ServerConfig>): ServerConfig {
  const out: ServerConfig = { ...DEFAULT_CONFIG };
  for (const layer of [file, flags]) {
    for (const [k, v] of Object.entries(layer)) if (v !== undefined) (out as unknown as Record<string, unknown>)[k] = v;
  }
  return out;
}

/**
 * The KV tiers below the hot pool extend it: a warm budget or a cold directory without
 * `kv_vram_budget` is a configuration error before anything listens or loads.
 */
export function checkKvTiers(config: Pick<ServerConfig, 'kvVramBudget' | 'kvHostBudget' | 'kvOffloadDir' | 'kvWarmLinkShare'>): void {
  if (config.kvVramBudget !== undefined) return;
  const extra = (['kvHostBudget', 'kvOffloadDir', 'kvWarmLinkShare'] as const).filter((k) => config[k] !== undefined).map(engineOption);
  if (extra.length === 0) return;
  const named = extra.map((s) => `${s.toml} (${flagName(s)})`).join(' and ');
  const hot = engineOption('kvVramBudget');
  throw new ConfigError(extra[0].toml!, `${named} need${extra.length === 1 ? 's' : ''} ${hot.toml} (${flagName(hot)}): the hot KV pool that the warm and cold KV tiers extend`);
}

/** Validate flag values with the same rules as file keys (flags arrive already typed). */
export function checkFlags(flags: Partial<ServerConfig>): Partial<ServerConfig> {
  const table: Record<string, unknown> = {};
  for (const [field, v] of Object.entries(flags)) {
    if (v === undefined) continue;
    const key = BY_FIELD.get(field);
    if (!key) throw new ConfigError(field, `unknown option "${field}"`);
    table[key] = v;
  }
  return parseConfigTable(table, 'command line', process.cwd());
}
