import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const DEFAULT_MODEL_NAME = 'tiny-shakespeare-qwen3';

/**
 * The embedded default model ships in the repository's `models/` folder. NERVA_DEFAULT_MODEL
 * overrides it; otherwise we walk up from this file to the folder that holds `models/`.
 */
export function defaultModelDir(): string {
  const env = process.env.NERVA_DEFAULT_MODEL;
  if (env) return resolve(env);
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const candidate = join(dir, 'models', DEFAULT_MODEL_NAME);
    if (existsSync(join(candidate, 'config.json'))) return candidate;
    const up = dirname(dir);
    if (up === dir) throw new Error(`the default model ${DEFAULT_MODEL_NAME} was not found above ${fileURLToPath(import.meta.url)}; pass --model DIR or set NERVA_DEFAULT_MODEL`);
    dir = up;
  }
}
