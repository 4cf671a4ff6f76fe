import { defineConfig } from 'tsup';

export default defineConfig({
  // The tokenizer worker is a file of its own: OffThreadTokenizer starts it with new URL('./tokenize-worker.js', import.meta.url).
  entry: { index: 'src/index.ts', cli: 'src/cli.ts', 'tokenize-worker': 'src/tokenize-worker.ts' },
  format: ['esm'],
  dts: true,
  sourcemap: true,
  clean: true,
  target: 'node20',
});
