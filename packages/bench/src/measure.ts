import type { DeviceBackend } from '@nerva/core';

/**
 * Copy bandwidth of the backend's compute tier, bytes read + written per second, measured with
 * the contract's own copy and events (the ceiling a decode step that streams weights can reach).
 */
export function measureCopyBandwidth(backend: DeviceBackend, bytes = 256 * 2 ** 20, iters = 10): number {
  const length = Math.floor(bytes / 4);
  const a = backend.alloc({ dtype: 'f32', length, usage: 'workspace', label: 'bench.copy.src' });
  const b = backend.alloc({ dtype: 'f32', length, usage: 'workspace', label: 'bench.copy.dst' });
  const e0 = backend.createEvent();
  const e1 = backend.createEvent();
  try {
    backend.copy(b, a, length); // warm-up
    backend.synchronize('debug');
    backend.record(e0);
    for (let i = 0; i < iters; i++) backend.copy(b, a, length);
    backend.record(e1);
    backend.synchronize('debug');
    const ms = backend.elapsedMs(e0, e1);
    return (2 * length * 4 * iters) / (ms / 1000);
  } finally {
    backend.destroyEvent(e0);
    backend.destroyEvent(e1);
    backend.free(a);
    backend.free(b);
  }
}

/** Deterministic pseudo-random token ids for a synthetic prompt. */
export function syntheticPrompt(len: number, vocab: number, seed = 1): number[] {
  let x = seed >>> 0 || 1;
  const out: number[] = [];
  for (let i = 0; i < len; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    out.push(x % vocab);
  }
  return out;
}
