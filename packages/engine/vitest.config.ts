import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  // The README example imports the package by name; point that at the sources under test.
  resolve: { alias: { '@nerva/engine': fileURLToPath(new URL('./src/index.ts', import.meta.url)) } },
  // Generation on the CPU reference takes seconds per test on a 2-core CI machine.
  test: { testTimeout: 180_000, hookTimeout: 120_000 },
});
