import { defineConfig } from 'vitest/config';

// Generation on the CPU reference takes seconds per test on a 2-core CI machine.
export default defineConfig({ test: { testTimeout: 180_000, hookTimeout: 120_000 } });
