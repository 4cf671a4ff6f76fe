import { beforeEach } from 'vitest';
import { loadAddon, type NativeAddon } from '../src/native.js';

// Which world a test file runs in. CI: no addon (the GPU-only files skip). A dev box with nvcc: the
// addon loads but finds no GPU. The GPU machine: tools/gpu/run.sh's `vitest` phase builds the
// addon and sets NERVA_GPU_TESTS=1, and there a GPU-only file that finds no addon or no GPU fails,
// naming why, instead of skipping: that phase must report 0 skipped.

/** Set by tools/gpu/run.sh's vitest phase: GPU-only files must run, never skip. */
export const gpuTestsRequired = process.env.NERVA_GPU_TESTS === '1';

let loaded: NativeAddon | null = null;
let loadError: string | null = null;
try {
  loaded = loadAddon();
} catch (e) {
  loadError = (e as Error).message;
}

/** The addon as loadAddon() finds it (NERVA_CUDA_ADDON, then the package's build), or null. */
export const addon: NativeAddon | null = loaded;

/** Why the addon did not load, or null when it did. */
export const addonError: string | null = loadError;

/** The addon loaded and sees at least one GPU. */
export const hasGpu: boolean = (() => {
  try {
    return addon?.probe().ok === true;
  } catch {
    return false;
  }
})();

/** Why the GPU tests cannot run here (no addon, or no GPU), or null when they can. */
export function gpuUnavailableReason(): string | null {
  if (!addon) return addonError ?? 'CUDA addon not loadable';
  if (hasGpu) return null;
  try {
    return addon.probe().error ?? 'no CUDA device';
  } catch (e) {
    return `CUDA probe failed: ${(e as Error).message}`;
  }
}

/**
 * Whether a GPU-only suite is skipped: only when `missing` (why it cannot run, or null) and the
 * GPU test phase is not asking for it. Pair with failEachUnless inside the suite.
 */
export function skipGpuSuite(missing: string | null): boolean {
  return missing !== null && !gpuTestsRequired;
}

/**
 * In the GPU test phase, fails every test of the suite with the reason it cannot run (a clear
 * failure per test, not a skip): call inside the describe; its beforeAll returns early when
 * `missing` is set.
 */
export function failEachUnless(missing: string | null, what: string): void {
  beforeEach(() => {
    if (missing !== null) throw new Error(`NERVA_GPU_TESTS=1 but ${what}: ${missing}`);
  });
}
