import { defineConfig } from 'vitest/config';

// Server and CLI tests start real processes and generate on the CPU backend.
export default defineConfig({ test: { testTimeout: 180_000, hookTimeout: 120_000 } });
