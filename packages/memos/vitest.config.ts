import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

// The README example imports the package by name; point that at the sources under test. CI runs
// every package's tests side by side on 2 cores, where property tests can take several seconds,
// so the per-test limit is a minute rather than vitest's 5 s.
export default defineConfig({
  resolve: { alias: { '@nerva/memos': fileURLToPath(new URL('./src/index.ts', import.meta.url)) } },
  test: { testTimeout: 60_000, hookTimeout: 60_000 },
});
