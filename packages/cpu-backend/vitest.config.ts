import { defineConfig } from 'vitest/config';

// CI runs every package's tests side by side on 2 cores; property tests and checkpoint I/O can
// take several seconds there, so the per-test limit is a minute rather than vitest's 5 s.
export default defineConfig({ test: { testTimeout: 60_000, hookTimeout: 60_000 } });
