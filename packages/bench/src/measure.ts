import type { DeviceBackend } from '@nerva/core';
import { selectBackend } from '@nerva/engine';

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

/** A host-to-device copy rate measured on the backend, and how. */
export interface H2dBandwidth {
  /** Bytes moved per second (each byte counted once: it crosses the link once). */
  bytesPerS: number;
  /** Size of one timed copy. */
  bytes: number;
  iters: number;
}

/**
 * Pinned host -> compute-tier copy bandwidth: `iters` copies of one buffer from a 'pinned' buffer
 * to a compute-tier buffer, timed with the backend's events (the path streamed weight blocks
 * take). The pinned arena may be mostly taken by the engine's host replicas, so sizes are tried
 * from `bytes` down by halves to 4 MiB. Returns null on a backend whose compute tier is host
 * memory (there is no host-to-device link) or when no buffer pair could be allocated.
 */
export function measureH2dBandwidth(backend: DeviceBackend, bytes = 256 * 2 ** 20, iters = 8): H2dBandwidth | null {
  const caps = backend.capabilities;
  if (caps.deviceKind === 'cpu' || caps.computeTier !== 'vram') return null;
  for (let size = bytes; size >= 4 * 2 ** 20; size /= 2) {
    const length = Math.floor(size / 4);
    let src: ReturnType<DeviceBackend['alloc']> | undefined;
    let dst: ReturnType<DeviceBackend['alloc']> | undefined;
    try {
      src = backend.alloc({ dtype: 'f32', length, tier: 'pinned', usage: 'workspace', label: 'bench.h2d.src' });
      dst = backend.alloc({ dtype: 'f32', length, tier: caps.computeTier, usage: 'workspace', label: 'bench.h2d.dst' });
    } catch {
      if (src) backend.free(src);
      continue;
    }
    const e0 = backend.createEvent();
    const e1 = backend.createEvent();
    // Smaller copies repeat more, so every measurement moves at least `iters` x `bytes`.
    const n = Math.max(iters, Math.ceil((iters * bytes) / (length * 4)));
    try {
      backend.copy(dst, src, length); // warm-up
      backend.synchronize('debug');
      backend.record(e0);
      for (let i = 0; i < n; i++) backend.copy(dst, src, length);
      backend.record(e1);
      backend.synchronize('debug');
      const ms = backend.elapsedMs(e0, e1);
      return { bytesPerS: (length * 4 * n) / (ms / 1000), bytes: length * 4, iters: n };
    } finally {
      backend.destroyEvent(e0);
      backend.destroyEvent(e1);
      backend.free(src);
      backend.free(dst);
    }
  }
  return null;
}

/**
 * Run `fn` on a short-lived backend of the given kind with room for the scratch buffers of the
 * measurements above (1 GiB of device memory, 512 MiB pinned), then dispose of it. An engine under
 * a memory budget sizes its arenas to the budget and fills them by design, so rates are timed
 * here, before it is created. Undefined when that backend cannot be created (the engine will say why).
 */
export async function withScratchBackend<T>(choice: 'cpu' | 'cuda' | 'auto', fn: (b: DeviceBackend) => T): Promise<T | undefined> {
  let backend: DeviceBackend;
  try {
    ({ backend } = await selectBackend(choice, { deviceArenaBytes: 2 ** 30, pinnedArenaBytes: 512 * 2 ** 20 }));
  } catch {
    return undefined;
  }
  try {
    return fn(backend);
  } finally {
    backend.dispose();
  }
}
