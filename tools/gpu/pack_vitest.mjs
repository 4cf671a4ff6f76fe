#!/usr/bin/env node
// Packs vitest and what it needs at run time out of the pnpm store into one tar.xz for the GPU
// machine (run.sh's `vitest` phase; node_modules itself is far over carry's 64 MiB). pnpm keeps
// each package at node_modules/.pnpm/<name@version>/node_modules/<name> with its dependencies as
// symlinks beside it, so the closure is the .pnpm folders reached from node_modules/vitest through
// those siblings; the archive holds them (symlinks included) and the top-level vitest link.
//   node tools/gpu/pack_vitest.mjs OUT.tar.xz
import { execFileSync } from 'node:child_process';
import { readdirSync, realpathSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const out = path.resolve(process.argv[2] ?? '.device/vitest.tar.xz');
const store = path.join(root, 'node_modules', '.pnpm');
// Type declarations are never loaded at run time.
const skip = /^@types\+|^undici-types@/;

/** The .pnpm folder (name@version) that holds a package's real directory. */
function storeEntry(real) {
  const rel = path.relative(store, real);
  if (rel.startsWith('..')) throw new Error(`${real} is outside ${store}`);
  return rel.split(path.sep)[0];
}

const entries = new Set();
const queue = [realpathSync(path.join(root, 'node_modules', 'vitest'))];
while (queue.length) {
  const entry = storeEntry(queue.pop());
  if (entries.has(entry) || skip.test(entry)) continue;
  entries.add(entry);
  const nm = path.join(store, entry, 'node_modules');
  for (const name of readdirSync(nm)) {
    const names = name.startsWith('@') ? readdirSync(path.join(nm, name)).map((n) => path.join(name, n)) : [name];
    for (const n of names) {
      try {
        queue.push(realpathSync(path.join(nm, n)));
      } catch {
        // a dangling link: an optional dependency not installed here
      }
    }
  }
}
const files = ['node_modules/vitest', ...[...entries].sort().map((e) => `node_modules/.pnpm/${e}`)];
execFileSync('sh', ['-c', 'tar -cf - "$@" | xz -T0 -6 > "$0"', out, ...files], { cwd: root, stdio: 'inherit' });
console.log(`vitest: ${entries.size} packages -> ${path.relative(root, out)} (${(statSync(out).size / 2 ** 20).toFixed(1)} MiB)`);
