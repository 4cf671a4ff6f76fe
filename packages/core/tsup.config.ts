import { defineConfig } from 'tsup';

export default defineConfig({
  // The conformance suite is a subpath export (@nerva/core/conformance), not part of the runtime index.
  entry: { index: 'src/index.ts', 'conformance/index': 'src/conformance/index.ts' },
  format: ['esm'],
  dts: true,
  sourcemap: true,
  clean: true,
  target: 'node20',
});
