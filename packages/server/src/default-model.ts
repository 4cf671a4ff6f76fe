import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const DEFAULT_MODEL_NAME = 'tiny-shakespeare-qwen3';

/**
 * The embedded default model. NERVA_DEFAULT_MODEL overrides it; in a checkout it is the
 * repository's `models/` folder, found by walking up from this file; an installed package carries
 * its own copy in `embedded/` (put there when the package is packed: scripts/embed-model.mjs).
 * The checkout's folder is looked for first, so packing (which writes `embedded/`) never changes
 * what a checkout runs.
 */
export function defaultModelDir(): string {
  const env = process.env.NERVA_DEFAULT_MODEL;
  if (env) return resolve(env);
  const here = dirname(fileURLToPath(import.meta.url));
  for (let dir = here; ; ) {
    const candidate = join(dir, 'models', DEFAULT_MODEL_NAME);
    if (existsSync(join(candidate, 'config.json'))) return candidate;
    const up = dirname(dir);
    if (up === dir) break;
    dir = up;
  }
  // This file is dist/<chunk>.js (or src/default-model.ts in tests): the package root is one up.
  const shipped = join(here, '..', 'embedded', DEFAULT_MODEL_NAME);
  if (existsSync(join(shipped, 'config.json'))) return shipped;
  throw new Error(`the default model ${DEFAULT_MODEL_NAME} was found neither in a models/ folder above ${here} nor in ${dirname(shipped)}; pass --model or set NERVA_DEFAULT_MODEL`);
}
