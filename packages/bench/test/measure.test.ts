import type { BufferSpec, DeviceBackend, DeviceBuffer } from '@nerva/core';
import { selectBackend } from '@nerva/engine';
import { describe, expect, it } from 'vitest';
import { measureH2dBandwidth } from '../src/measure.js';

/**
 * A device whose pinned arena holds at most `pinnedFree` bytes and whose copies run at `rate`
 * bytes/s: events read the device time of the copies recorded between them.
 */
function fakeDevice(pinnedFree: number, rate: number) {
  let nextId = 1;
  let clockMs = 0;
  const live = new Map<number, DeviceBuffer>();
  const stamps = new Map<number, number>();
  const copies: { dst: string; src: string; bytes: number }[] = [];
  const backend = {
    name: 'fake',
    capabilities: { deviceKind: 'cuda', computeTier: 'vram' },
    alloc(spec: BufferSpec): DeviceBuffer {
      const bytes = spec.length * 4;
      if (spec.tier === 'pinned' && bytes > pinnedFree) throw new Error(`pinned arena exhausted (${bytes} bytes asked)`);
      const b = { id: nextId++, dtype: spec.dtype, length: spec.length, byteLength: bytes, tier: spec.tier ?? 'vram', usage: spec.usage ?? 'workspace' };
      live.set(b.id, b);
      return b;
    },
    free(b: DeviceBuffer) {
      live.delete(b.id);
    },
    copy(dst: DeviceBuffer, src: DeviceBuffer, length: number) {
      copies.push({ dst: dst.tier, src: src.tier, bytes: length * 4 });
      clockMs += ((length * 4) / rate) * 1000;
    },
    createEvent: () => ({ id: nextId++ }),
    destroyEvent: () => {},
    record: (e: { id: number }) => void stamps.set(e.id, clockMs),
    synchronize: () => {},
    elapsedMs: (a: { id: number }, b: { id: number }) => stamps.get(b.id)! - stamps.get(a.id)!,
  };
  return { backend: backend as unknown as DeviceBackend, live, copies };
}

describe('measureH2dBandwidth', () => {
  it('times pinned -> vram copies with events, halving the size until the pinned arena has room', () => {
    const MiB = 2 ** 20;
    const { backend, live, copies } = fakeDevice(40 * MiB, 25e9);
    const m = measureH2dBandwidth(backend, 256 * MiB, 8)!;
    expect(m).not.toBeNull();
    // 256, 128 and 64 MiB do not fit; 32 MiB does.
    expect(m.bytes).toBe(32 * MiB);
    // Smaller copies repeat more: still 8 x 256 MiB moved.
    expect(m.iters).toBe(64);
    expect(m.bytesPerS).toBeCloseTo(25e9, -6);
    expect(copies.every((c) => c.src === 'pinned' && c.dst === 'vram')).toBe(true);
    // Warm-up copy plus the timed ones; every buffer is given back.
    expect(copies).toHaveLength(65);
    expect(live.size).toBe(0);
  });

  it('is null when no pair of buffers fits, and on a backend that computes in host memory', async () => {
    const { backend, live } = fakeDevice(2 ** 20, 25e9);
    expect(measureH2dBandwidth(backend)).toBeNull();
    expect(live.size).toBe(0);
    const { backend: cpu } = await selectBackend('cpu');
    try {
      expect(measureH2dBandwidth(cpu)).toBeNull();
    } finally {
      cpu.dispose();
    }
  });
});
