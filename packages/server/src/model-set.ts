/**
 * Several models in one server: the TOML `[[models]]` tables (or a repeated `--model`), each a
 * model with its own engine options, memory budgets included. The top-level keys are every
 * model's defaults; the server's own keys (host, port, security) are server-wide and refused
 * inside a `[[models]]` table.
 */
import { resolve } from 'node:path';
import { ENGINE_OPTIONS, type OptionSpec } from '@nerva/engine';
import { ConfigError } from './errors.js';
import { checkOptionValue } from './options.js';
import type { ModelEntry, ServerConfig } from './server-config.js';

export type { ModelEntry, ModelFields } from './server-config.js';

/** The per-model keys, TOML spelling → spec (engine options with a TOML key, `served_model_name`, `chat_template`). */
function modelKeys(serverSpecs: readonly OptionSpec[]): Map<string, OptionSpec> {
  const own = serverSpecs.filter((s) => s.name === 'servedModelName' || s.name === 'chatTemplate');
  return new Map(([...ENGINE_OPTIONS, ...own] as readonly OptionSpec[]).filter((s) => s.toml !== undefined).map((s) => [s.toml!, s]));
}

/**
 * Check a TOML `models` value: a non-empty array of tables, each with a `model` and only per-model
 * keys. Paths other than `model` resolve against `baseDir` (the file's folder). Errors are
 * {@link ConfigError}s naming `models[i].key`.
 */
export function parseModelsTable(raw: unknown, where: string, serverSpecs: readonly OptionSpec[], baseDir?: string): ModelEntry[] {
  const keys = modelKeys(serverSpecs);
  if (!Array.isArray(raw) || raw.length === 0) throw new ConfigError('models', `${where}: "models" must be a non-empty list of [[models]] tables`);
  const names = new Set<string>();
  return raw.map((table, i) => {
    const at = `models[${i}]`;
    if (typeof table !== 'object' || table === null || Array.isArray(table)) throw new ConfigError(at, `${where}: ${at} must be a table ([[models]])`);
    const out: Record<string, unknown> = {};
    for (const [key, v] of Object.entries(table as Record<string, unknown>)) {
      const spec = keys.get(key);
      if (!spec) {
        const known = serverSpecs.some((s) => s.toml === key);
        throw new ConfigError(`${at}.${key}`, `${where}: ${at}: ${known ? `"${key}" is a server-wide key; set it at the top of the file` : `unknown key "${key}"`} (a [[models]] table takes: ${[...keys.keys()].join(', ')})`);
      }
      let value = checkOptionValue(spec, `${at}.${key}`, v, where);
      // `model` may be a name: kept as written, resolved (against the file's folder) at start.
      if (spec.kind === 'path' && key !== 'model' && baseDir !== undefined) value = resolve(baseDir, value as string);
      out[spec.name] = value;
    }
    if (typeof out.model !== 'string') throw new ConfigError(`${at}.model`, `${where}: ${at} has no "model" (a folder, an HF repo id or a short name)`);
    const served = out.servedModelName as string | undefined;
    if (served !== undefined) {
      if (names.has(served)) throw new ConfigError(`${at}.served_model_name`, `${where}: ${at}: served_model_name "${served}" is used twice`);
      names.add(served);
    }
    return out as unknown as ModelEntry;
  });
}

/**
 * The configuration of each model a server serves: for `models`, each entry over the top-level
 * configuration (the top level gives every model's defaults; `model` and `servedModelName` are
 * the entry's own); else the one model of `config`.
 */
export function modelConfigs(config: ServerConfig): ServerConfig[] {
  if (config.models === undefined) return [config];
  if (config.models.length === 0) throw new ConfigError('models', '"models" must hold at least one model');
  if (config.servedModelName !== undefined) throw new ConfigError('served_model_name', 'served_model_name names one model: with several, give each [[models]] table its own');
  return config.models.map((entry) => {
    const merged: Record<string, unknown> = { ...config, servedModelName: undefined, models: undefined };
    for (const [k, v] of Object.entries(entry)) if (v !== undefined) merged[k] = v;
    return merged as unknown as ServerConfig;
  });
}
