#!/usr/bin/env node
// Bundles the GPU-machine entry points into single .mjs files with every dependency inlined
// (node_modules cannot travel to that machine). Workspace packages are taken from their
// TypeScript sources, so no package needs building first. Output: tools/gpu/dist/*.mjs, and the
// worker threads' entries as tools/gpu/dist/*.js.
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

const defaults = ['conformance.ts', 'checks.ts', 'parity.ts', 'bench.ts', 'offload.ts', 'cli.ts', 'nccl_check.ts', 'pipeline.ts', 'long_context.ts', 'bench_cli.ts', 'batch_invariance.ts', 'vitest_report.ts', 'contexts.ts', 'qgemv.ts', 'gguf_check.ts', 'embeddings.ts', 'grammar_cost.ts', 'fork_kernels.ts'];
const entries = (process.argv.length > 2 ? process.argv.slice(2) : defaults.filter((f) => existsSync(path.join(here, f)))).map((f) =>
  path.resolve(here, f),
);
// Other packages may reach third-party modules (tokenizers, etc.): let esbuild look in every
// package's node_modules.
const nodePaths = readdirSync(path.join(root, 'packages')).map((d) => path.join(root, 'packages', d, 'node_modules'));
nodePaths.push(path.join(root, 'node_modules'));
const common = {
  outdir: path.join(here, 'dist'),
  bundle: true,
  platform: 'node',
  format: 'esm',
  target: 'node20',
  alias,
  nodePaths,
  // CommonJS dependencies inside an ESM bundle need a require.
  banner: { js: "import { createRequire as __nervaCreateRequire } from 'node:module'; const require = __nervaCreateRequire(import.meta.url);" },
  logLevel: 'warning',
};
await esbuild.build({ ...common, entryPoints: entries, outExtension: { '.js': '.mjs' } });
// The worker threads' entries, beside the bundles and under the names the bundled code starts
// them by (new URL('./worker-entry.js', import.meta.url)): the engine's worker (WorkerEngine,
// which `nerva serve` and `nerva-bench serve` run the engine in) and the server's tokenizer
// worker, and the engine's grammar worker (constrained decoding's token masks). ESM as .js: the
// repository's package.json says "type": "module".
const workers = {
  'worker-entry': 'packages/engine/src/worker/worker-entry.ts',
  'tokenize-worker': 'packages/server/src/tokenize-worker.ts',
  'grammar-worker': 'packages/engine/src/grammar/grammar-worker.ts',
};
await esbuild.build({ ...common, entryPoints: Object.entries(workers).map(([out, src]) => ({ in: path.join(root, src), out })), outExtension: { '.js': '.js' } });
console.log(`bundled ${entries.map((e) => path.basename(e)).join(', ')}, ${Object.keys(workers).map((w) => `${w}.js`).join(', ')} -> tools/gpu/dist/`);
