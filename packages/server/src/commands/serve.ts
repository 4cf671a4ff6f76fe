import { readFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import type { Command } from 'commander';
import { isOllamaBlob } from '@nerva/models';
import { parse as parseToml } from 'smol-toml';
import { hubRepoIdOf, MODEL_FLAG_HELP, resolveModelArg } from '../cli-model.js';
import { checkFlags, CONFIG_OPTIONS, loadConfigFile, mergeConfig, type ServerConfig } from '../config.js';
import { ConfigError } from '../errors.js';
import type { ModelEntry } from '../model-set.js';
import { addFlags, deriveFlags } from '../options.js';
import { startServer } from '../server.js';

// Every option with a config key has its flag; flags override the file, so none applies a default.
// `--model` is the command's own: it may be given more than once, and takes names, resolved here.
const FLAGS = deriveFlags(CONFIG_OPTIONS.filter((s) => s.flag !== undefined && s.name !== 'model'));

const collect = (v: string, prev: string[] = []): string[] => [...prev, v];

export function registerServe(program: Command): void {
  const cmd = program
    .command('serve')
    .description('OpenAI-compatible HTTP server (the embedded default model when --model is absent)')
    .option('--config <file>', 'TOML config file (flags override it)')
    .option('--model <model>', `${MODEL_FLAG_HELP}; give it more than once to serve several models, each under its own name (TOML: [[models]] tables, each with its own options)`, collect);
  addFlags(cmd, FLAGS).action(async (f: Record<string, unknown> & { config?: string; model?: string[] }) => {
    const flags: Partial<ServerConfig> = checkFlags(FLAGS.read(f) as Partial<ServerConfig>);
    const file = f.config ? await loadConfigFile(f.config) : {};
    const config = mergeConfig(file, flags);
    await resolveModels(config, f.model ?? [], f.config);
    const log = (line: string) => process.stderr.write(line + '\n');
    const server = await startServer(config, {
      log,
      logger: config.accessLog !== false,
      // The engine died and would not come back: exit non-zero for the supervisor to restart us.
      onFatal: () => process.exit(1),
    });
    const t0 = performance.now();
    for (const s of server.states) log(`nerva: serving ${s.modelName} at ${server.url}/v1 (loading ${s.modelDir}; GET ${server.url}/health answers 200 when ready)`);
    const what = server.states.length > 1 ? `the ${server.states.length} models` : 'the model';
    server.ready.then(
      () => log(`nerva: ready at ${server.url}/v1 (${what} loaded in ${((performance.now() - t0) / 1000).toFixed(1)} s)`),
      (e: Error) => log(`nerva: error: the model failed to load: ${e.message}`),
    );
    await new Promise<void>((resolveStop) => {
      const stop = (sig: string) => {
        log(`nerva: ${sig}: draining in-flight requests`);
        server.shutdown().then(() => resolveStop(), (e: Error) => {
          log(`nerva: error during shutdown: ${e.message}`);
          resolveStop();
        });
      };
      process.once('SIGTERM', () => stop('SIGTERM'));
      process.once('SIGINT', () => stop('SIGINT'));
    });
  });
}

/**
 * Resolve the models of `config` from their values as written (the config layer makes paths
 * absolute; a model may be a name): `--model` values against this directory, replacing the
 * file's; the file's `model` and `[[models]]` against the file's folder. A model from the HF cache
 * is served under its repo id (its folder's name is a commit hash), one of Ollama's under its
 * Ollama name, unless named otherwise.
 */
async function resolveModels(config: ServerConfig, flagModels: string[], configPath: string | undefined): Promise<void> {
  const named = async (e: ModelEntry, cwd?: string): Promise<ModelEntry> => {
    const dir = await resolveModelArg(e.model, cwd);
    // A model named with a tag (an Ollama name, whose blob's file name is its digest, or a GGUF
    // repository's Org/Repo:QUANT) is served under that name.
    const tagged = isOllamaBlob(dir) || /^[^/\\]+\/[^/\\]+:[^/\\]+$/.test(e.model ?? '');
    return { ...e, model: dir, servedModelName: e.servedModelName ?? hubRepoIdOf(dir) ?? (tagged ? e.model : undefined) };
  };
  const fileDir = configPath !== undefined ? dirname(resolve(configPath)) : undefined;
  if (flagModels.length > 1) {
    if (config.servedModelName !== undefined) throw new ConfigError('served_model_name', '--served-model-name names one model; with several --model, each is served under its own name');
    config.models = await Promise.all(flagModels.map((m) => named({ model: m })));
    config.model = undefined;
  } else if (flagModels.length === 1) {
    const one = await named({ model: flagModels[0], servedModelName: config.servedModelName });
    config.model = one.model;
    config.servedModelName = one.servedModelName;
    config.models = undefined;
  } else if (config.models !== undefined) {
    config.models = await Promise.all(config.models.map((e) => named(e, fileDir)));
  } else if (config.model !== undefined && configPath !== undefined) {
    const one = await named({ model: await modelAsWritten(configPath), servedModelName: config.servedModelName }, fileDir);
    config.model = one.model;
    config.servedModelName = one.servedModelName;
  }
}

/** The `model` key of a config file as written (the file has been checked already). */
async function modelAsWritten(path: string): Promise<string> {
  return (parseToml(await readFile(path, 'utf8')) as { model: string }).model;
}
