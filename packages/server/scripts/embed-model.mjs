#!/usr/bin/env node
// Packing @nerva/server: the embedded default model (the repository's models/ folder) is copied
// into the package as embedded/<name>, so that an installed package runs `nerva run` with no
// checkout around it (default-model.ts finds it beside dist/). `--remove` deletes the copy again
// after packing, so a checkout keeps one copy of the weights.
import { cpSync, existsSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const NAME = 'tiny-shakespeare-qwen3';
const pkg = join(dirname(fileURLToPath(import.meta.url)), '..');
const dest = join(pkg, 'embedded', NAME);
if (process.argv.includes('--remove')) {
  rmSync(join(pkg, 'embedded'), { recursive: true, force: true });
} else {
  if (!existsSync(join(pkg, 'dist', 'cli.js'))) {
    process.stderr.write('embed-model: dist/cli.js is missing; build @nerva/server before packing it\n');
    process.exit(1);
  }
  const src = join(pkg, '..', '..', 'models', NAME);
  if (!existsSync(join(src, 'config.json'))) {
    process.stderr.write(`embed-model: ${src} has no config.json; the package cannot ship its default model\n`);
    process.exit(1);
  }
  cpSync(src, dest, { recursive: true });
}
