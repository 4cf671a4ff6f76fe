import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  // The README example imports the package by name; point that at the sources under test.
  resolve: { alias: { '@nerva/transport': fileURLToPath(new URL('./src/index.ts', import.meta.url)) } },
  test: { testTimeout: 60_000, hookTimeout: 60_000 },
});
