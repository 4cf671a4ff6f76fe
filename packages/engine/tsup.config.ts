import { defineConfig } from 'tsup';

export default defineConfig({
  // The worker entry is a file of its own: WorkerEngine starts it with new URL('./worker-entry.js', import.meta.url).
  entry: { index: 'src/index.ts', 'worker-entry': 'src/worker/worker-entry.ts' },
  format: ['esm'],
  dts: true,
  sourcemap: true,
  clean: true,
  target: 'node20',
});
