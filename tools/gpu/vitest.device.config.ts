// The vitest config of run.sh's `vitest` phase on the GPU machine: every test file of
// @nerva/cuda-backend (the GPU-only ones, host-mlp-addon and nccl-native, and import.test.ts in its
// addon-present world among them), with NERVA_GPU_TESTS=1 so that a GPU-only file fails instead
// of skipping. No node_modules travel there except vitest's own (pack_vitest.mjs), so the
// workspace packages are taken from their TypeScript sources, as bundle.mjs does.
import { existsSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

/** The test files of the GPU phase, relative to the repository root. */
export const GPU_TEST_FILES = ['packages/cuda-backend/test/**/*.test.ts'];

const alias: Record<string, string> = {};
for (const dir of readdirSync(path.join(root, 'packages'))) {
  const src = path.join(root, 'packages', dir, 'src', 'index.ts');
  if (existsSync(src)) alias[`@nerva/${dir}`] = src;
}

export default defineConfig({
  root,
  resolve: { alias },
  test: {
    include: GPU_TEST_FILES,
    pool: 'forks',
    // Kernels load and graphs capture on first use: slower than a CPU test.
    testTimeout: 120_000,
    hookTimeout: 120_000,
  },
});
