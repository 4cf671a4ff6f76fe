import { defineConfig } from 'vitest/config';

// The native tests (g++ builds and their programs, child processes of up to 120 s each on a busy
// two-core machine) are awaited, not run synchronously: their tests need the longer timeout.
export default defineConfig({ test: { include: ['test/**/*.test.ts'], testTimeout: 150_000 } });
