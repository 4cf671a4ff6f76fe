import { readFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { ENGINE_OPTIONS, engineOption, flagName, type OptionSpec } from '@nerva/engine';
import { ConfigError } from './errors.js';
import { parseModelsTable } from './model-set.js';
import { checkOptionValue } from './options.js';
import { API_KEY_ENV, SECURITY_OPTIONS } from './security-options.js';
import type { ServerConfig } from './server-config.js';

export { API_KEY_ENV } from './security-options.js';
export type { ServerConfig } from './server-config.js';

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
