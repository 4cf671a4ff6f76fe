import { defineConfig } from 'tsup';

export default defineConfig({
  entry: ["src/index.ts", "src/cli.ts"],
  format: ['esm'],
  dts: true,
  sourcemap: true,
  clean: true,
  target: 'node20',
  // A dev dependency with a native addon, imported at run time where installed: never bundled.
  external: ['node-llama-cpp'],
});
