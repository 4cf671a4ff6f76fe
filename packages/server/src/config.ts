import { readFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { ConfigError } from './errors.js';
import { parseSize } from './size.js';
// --- security options (declared in security-options.ts) ---
import { SECURITY_KEYS, type SecurityOptions } from './security-options.js';
// --- end security options ---

/** Everything `nerva serve` can be told, from a TOML file, flags, or code. */
export interface ServerConfig extends SecurityOptions {
  /** Model folder; the embedded default model when absent. */
  model?: string;
  /** Name clients use in `model`; default: the folder's name. */
  servedModelName?: string;
  host: string;
  port: number;
  /** When set, /v1/* requires `Authorization: Bearer <apiKey>`. */
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
  /** Put every pipeline stage on one GPU (a test of the pipeline on a one-GPU machine). */
  allowSingleDeviceStages?: boolean;
}

export const DEFAULT_CONFIG: ServerConfig = {
  host: '127.0.0.1',
  port: 8000,
  backend: 'auto',
  enablePrefixCaching: true,
  maxQueue: 256,
  requestTimeoutS: 600,
  bodyLimitBytes: 1024 * 1024,
  drainTimeoutS: 30,
};

type Kind = 'string' | 'strings' | 'int' | 'posint' | 'bool' | 'backend' | 'numerics' | 'precision' | 'kvdtype' | 'size' | 'fraction';

/** The accepted keys: TOML spelling → field and type. Anything else is an error naming the key. */
const KEYS: Record<string, { field: keyof ServerConfig; kind: Kind; path?: boolean }> = {
  model: { field: 'model', kind: 'string', path: true },
  served_model_name: { field: 'servedModelName', kind: 'string' },
  host: { field: 'host', kind: 'string' },
  port: { field: 'port', kind: 'int' },
  api_key: { field: 'apiKey', kind: 'string' },
  backend: { field: 'backend', kind: 'backend' },
  numerics: { field: 'numerics', kind: 'numerics' },
  matmul_precision: { field: 'matmulPrecision', kind: 'precision' },
  batch_invariant: { field: 'batchInvariant', kind: 'bool' },
  max_num_seqs: { field: 'maxNumSeqs', kind: 'posint' },
  max_num_batched_tokens: { field: 'maxNumBatchedTokens', kind: 'posint' },
  kv_cache_bytes: { field: 'kvCacheBytes', kind: 'size' },
  kv_cache_dtype: { field: 'kvCacheDtype', kind: 'kvdtype' },
  max_model_len: { field: 'maxModelLen', kind: 'posint' },
  enable_prefix_caching: { field: 'enablePrefixCaching', kind: 'bool' },
  max_queue: { field: 'maxQueue', kind: 'int' },
  request_timeout_s: { field: 'requestTimeoutS', kind: 'posint' },
  body_limit_bytes: { field: 'bodyLimitBytes', kind: 'posint' },
  chat_template: { field: 'chatTemplate', kind: 'string', path: true },
  drain_timeout_s: { field: 'drainTimeoutS', kind: 'int' },
  vram_budget: { field: 'vramBudget', kind: 'size' },
  host_budget: { field: 'hostBudget', kind: 'size' },
  offload_dir: { field: 'offloadDir', kind: 'string', path: true },
  kv_vram_budget: { field: 'kvVramBudget', kind: 'size' },
  kv_host_budget: { field: 'kvHostBudget', kind: 'size' },
  kv_offload_dir: { field: 'kvOffloadDir', kind: 'string', path: true },
  kv_warm_link_share: { field: 'kvWarmLinkShare', kind: 'fraction' },
  pipeline_parallel: { field: 'pipelineParallel', kind: 'posint' },
  allow_single_device_stages: { field: 'allowSingleDeviceStages', kind: 'bool' },
  // --- security options ---
  ...SECURITY_KEYS,
  // --- end security options ---
};

const BY_FIELD = new Map(Object.entries(KEYS).map(([k, v]) => [v.field as string, k]));

/** The TOML key of a config field (for messages about flags). */
export function configKeyOf(field: keyof ServerConfig): string {
  return BY_FIELD.get(field) ?? field;
}

function check(key: string, kind: Kind, v: unknown, where: string): unknown {
  const fail = (what: string): never => {
    throw new ConfigError(key, `${where}: "${key}" must be ${what}, got ${JSON.stringify(v)}`);
  };
  switch (kind) {
    case 'string':
      if (typeof v !== 'string' || v.length === 0) fail('a non-empty string');
      return v;
    case 'strings':
      if (!Array.isArray(v) || v.length === 0 || v.some((x) => typeof x !== 'string' || x.length === 0)) fail('a list of non-empty strings');
      return v;
    case 'bool':
      if (typeof v !== 'boolean') fail('true or false');
      return v;
    case 'int':
    case 'posint': {
      // TOML integers may come back as bigint.
      const n = typeof v === 'bigint' ? Number(v) : v;
      if (typeof n !== 'number' || !Number.isSafeInteger(n) || n < (kind === 'posint' ? 1 : 0)) fail(kind === 'posint' ? 'a positive integer' : 'a non-negative integer');
      if (key === 'port' && (n as number) > 65535) fail('a port number (0-65535)');
      return n;
    }
    case 'backend':
      if (v !== 'cpu' && v !== 'cuda' && v !== 'auto') fail('"cpu", "cuda" or "auto"');
      return v;
    case 'numerics':
    case 'precision':
      if (v !== 'exact' && v !== 'bf16') fail('"exact" or "bf16"');
      return v;
    case 'fraction':
      if (typeof v !== 'number' || !(v >= 0 && v <= 1)) fail('a number from 0 to 1');
      return v;
    case 'kvdtype':
      if (v !== 'auto' && v !== 'f32' && v !== 'bf16') fail('"auto", "f32" or "bf16"');
      return v;
    case 'size':
      // A string with a unit ("4GiB", "512MB", "4G" = 4 GiB) or an integer byte count.
      if (typeof v !== 'string' && typeof v !== 'number' && typeof v !== 'bigint') fail('a size such as "4GiB" or a positive integer byte count');
      try {
        return parseSize(v as string | number | bigint, `${where}: "${key}"`);
      } catch (e) {
        throw new ConfigError(key, (e as Error).message);
      }
  }
}

/**
 * Validate a table of TOML-spelled keys (from a file or built by hand). Unknown keys and wrong
 * types throw {@link ConfigError} naming the key. Relative paths resolve against `baseDir`.
 */
export function parseConfigTable(table: Record<string, unknown>, where: string, baseDir?: string): Partial<ServerConfig> {
  const out: Partial<ServerConfig> = {};
  for (const [key, raw] of Object.entries(table)) {
    const spec = KEYS[key];
    if (!spec) throw new ConfigError(key, `${where}: unknown key "${key}" (known: ${Object.keys(KEYS).join(', ')})`);
    let v = check(key, spec.kind, raw, where);
    if (spec.path && baseDir !== undefined) v = resolve(baseDir, v as string);
    (out as Record<string, unknown>)[spec.field] = v;
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
  const extra: [string, string][] = [];
  if (config.kvHostBudget !== undefined) extra.push(['kv_host_budget', '--kv-host-budget']);
  if (config.kvOffloadDir !== undefined) extra.push(['kv_offload_dir', '--kv-offload-dir']);
  if (config.kvWarmLinkShare !== undefined) extra.push(['kv_warm_link_share', '--kv-warm-link-share']);
  if (extra.length === 0) return;
  const named = extra.map(([k, f]) => `${k} (${f})`).join(' and ');
  throw new ConfigError(extra[0][0], `${named} need${extra.length === 1 ? 's' : ''} kv_vram_budget (--kv-vram-budget): the hot KV pool that the warm and cold KV tiers extend`);
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
