#!/usr/bin/env node
// Bundles the GPU-machine entry points into single .mjs files with every dependency inlined
// (node_modules cannot travel to that machine). Workspace packages are taken from their
// TypeScript sources, so no package needs building first. Output: tools/gpu/dist/*.mjs.
//   node tools/gpu/bundle.mjs [entry.ts ...]   (default: every *.ts entry listed below that exists)
import { existsSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');
// esbuild comes with tsup (a root devDependency); resolve it through tsup's own location.
const rootRequire = createRequire(path.join(root, 'package.json'));
const esbuild = createRequire(rootRequire.resolve('tsup'))('esbuild');

const alias = {};
for (const dir of readdirSync(path.join(root, 'packages'))) {
  const src = path.join(root, 'packages', dir, 'src', 'index.ts');
  if (existsSync(src)) alias[`@nerva/${dir}`] = src;
}
// Subpath exports, from their sources too.
alias['@nerva/core/conformance'] = path.join(root, 'packages', 'core', 'src', 'conformance', 'index.ts');

const defaults = ['conformance.ts', 'checks.ts', 'parity.ts', 'bench.ts', 'offload.ts', 'cli.ts', 'nccl_check.ts', 'pipeline.ts', 'long_context.ts', 'bench_cli.ts', 'batch_invariance.ts', 'vitest_report.ts', 'contexts.ts', 'qgemv.ts', 'gguf_check.ts', 'embeddings.ts', 'grammar_cost.ts'];
const entries = (process.argv.length > 2 ? process.argv.slice(2) : defaults.filter((f) => existsSync(path.join(here, f)))).map((f) =>
  path.resolve(here, f),
);
// The engine's grammar worker (constrained decoding's token masks): a file of its own beside the
// bundles, which the engine finds as ./grammar-worker.mjs next to the bundle it runs in.
const workers = { 'grammar-worker': path.join(root, 'packages', 'engine', 'src', 'grammar', 'grammar-worker.ts') };
// Other packages may reach third-party modules (tokenizers, etc.): let esbuild look in every
// package's node_modules.
const nodePaths = readdirSync(path.join(root, 'packages')).map((d) => path.join(root, 'packages', d, 'node_modules'));
nodePaths.push(path.join(root, 'node_modules'));
await esbuild.build({
  entryPoints: [...entries.map((e) => ({ in: e, out: path.basename(e, path.extname(e)) })), ...Object.entries(workers).map(([out, e]) => ({ in: e, out }))],
  outdir: path.join(here, 'dist'),
  outExtension: { '.js': '.mjs' },
  bundle: true,
  platform: 'node',
  format: 'esm',
  target: 'node20',
  alias,
  nodePaths,
  // CommonJS dependencies inside an ESM bundle need a require.
  banner: { js: "import { createRequire as __nervaCreateRequire } from 'node:module'; const require = __nervaCreateRequire(import.meta.url);" },
  logLevel: 'warning',
});
console.log(`bundled ${[...entries.map((e) => path.basename(e)), ...Object.keys(workers)].join(', ')} -> tools/gpu/dist/`);
