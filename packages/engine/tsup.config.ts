import { defineConfig } from 'tsup';

export default defineConfig({
  // The worker entries are files of their own: WorkerEngine starts new URL('./worker-entry.js', import.meta.url),
  // GrammarPool new URL('./grammar-worker.js', import.meta.url).
  entry: { index: 'src/index.ts', 'worker-entry': 'src/worker/worker-entry.ts', 'grammar-worker': 'src/grammar/grammar-worker.ts' },
  format: ['esm'],
  dts: true,
  sourcemap: true,
  clean: true,
  target: 'node20',
});
