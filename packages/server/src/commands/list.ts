import { dirname } from 'node:path';
import { hfHubCacheDir, listLocalModels, ollamaModelDirs, type LocalModel } from '@nerva/models';
import type { Command } from 'commander';
import { defaultModelDir } from '../default-model.js';
import { formatSize } from '../size.js';

/** The rows of `nerva list` as a fixed-width table (name, size, dtype, path). */
export function formatModelTable(models: readonly LocalModel[]): string {
  const rows = [['NAME', 'SIZE', 'DTYPE', 'PATH'], ...models.map((m) => [m.name, formatSize(m.bytes), m.dtype ?? '-', m.path])];
  const widths = [0, 1, 2].map((c) => Math.max(...rows.map((r) => r[c].length)));
  return rows.map((r) => r.map((cell, c) => (c < 3 ? cell.padEnd(widths[c]) : cell)).join('  ')).join('\n') + '\n';
}

export function registerList(program: Command): void {
  program
    .command('list')
    .description("list the models on this machine: the embedded one, the local Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub) and Ollama's models (OLLAMA_MODELS, else ~/.ollama/models); any NAME shown is a valid --model")
    .option('--json', 'one JSON line: {"hub_cache": ..., "ollama_models": [...], "models": [{name, path, bytes, dtype, source}]}')
    .action(async (f: { json?: boolean }) => {
      let searchDirs: string[] = [];
      try {
        searchDirs = [dirname(defaultModelDir())];
      } catch {
        // No embedded model next to this install: list the cache only.
      }
      const models = await listLocalModels({ searchDirs });
      const cache = hfHubCacheDir();
      if (f.json) {
        process.stdout.write(JSON.stringify({ hub_cache: cache, ollama_models: ollamaModelDirs(), models: models.map((m) => ({ ...m, dtype: m.dtype ?? null })) }) + '\n');
        return;
      }
      process.stdout.write(formatModelTable(models));
      if (!models.some((m) => m.source === 'hub-cache')) process.stderr.write(`nerva: no models in the Hugging Face cache ${cache}\n`);
    });
}
