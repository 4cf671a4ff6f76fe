import { defineConfig } from 'vitest/config';

// Only tools/test: tools/gpu/vitest.device.config.ts is the GPU machine's run of cuda-backend's tests.
export default defineConfig({ test: { include: ['test/**/*.test.ts'] } });
