import { readFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import type { Command } from 'commander';
import { parse as parseToml } from 'smol-toml';
import { hubRepoIdOf, MODEL_FLAG_HELP, resolveModelArg } from '../cli-model.js';
import { checkFlags, CONFIG_OPTIONS, loadConfigFile, mergeConfig, type ServerConfig } from '../config.js';
import { addFlags, deriveFlags } from '../options.js';
import { startServer } from '../server.js';

// Every option with a config key has its flag; flags override the file, so none applies a default.
// `--model` takes names (resolved here, before the server starts), not only folders.
const FLAGS = deriveFlags(CONFIG_OPTIONS.filter((s) => s.flag !== undefined).map((s) => (s.name === 'model' ? ([s, { help: MODEL_FLAG_HELP }] as const) : s)));

export function registerServe(program: Command): void {
  const cmd = program
    .command('serve')
    .description('OpenAI-compatible HTTP server (the embedded default model when --model is absent)')
    .option('--config <file>', 'TOML config file (flags override it)');
  addFlags(cmd, FLAGS).action(async (f: Record<string, unknown> & { config?: string }) => {
    const given = FLAGS.read(f) as Partial<ServerConfig>;
    const flags: Partial<ServerConfig> = checkFlags(given);
    const file = f.config ? await loadConfigFile(f.config) : {};
    const config = mergeConfig(file, flags);
    // The config layer makes every path absolute; a model may be a name, so it resolves from the
    // value as written: a flag against this directory, the file's key against the file's folder.
    const model =
      given.model !== undefined
        ? await resolveModelArg(given.model)
        : f.config !== undefined && file.model !== undefined
          ? await resolveModelArg(await modelAsWritten(f.config), dirname(resolve(f.config)))
          : undefined;
    if (model !== undefined) {
      config.model = model;
      // A hub snapshot's folder is a commit hash: clients name it by its repo id instead.
      config.servedModelName ??= hubRepoIdOf(model);
    }
    const log = (line: string) => process.stderr.write(line + '\n');
    const server = await startServer(config, {
      log,
      logger: config.accessLog !== false,
      // The engine died and would not come back: exit non-zero for the supervisor to restart us.
      onFatal: () => process.exit(1),
    });
    const t0 = performance.now();
    log(`nerva: serving ${server.state.modelName} at ${server.url}/v1 (loading ${server.state.modelDir}; GET ${server.url}/health answers 200 when ready)`);
    server.ready.then(
      () => log(`nerva: ready at ${server.url}/v1 (the model loaded in ${((performance.now() - t0) / 1000).toFixed(1)} s)`),
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

/** The `model` key of a config file as written (the file has been checked already). */
async function modelAsWritten(path: string): Promise<string> {
  return (parseToml(await readFile(path, 'utf8')) as { model: string }).model;
}
