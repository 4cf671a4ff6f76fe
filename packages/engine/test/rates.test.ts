import type { DeviceBackend } from '@nerva/core';
import { CpuBackend } from '@nerva/cpu-backend';
import { describe, expect, it } from 'vitest';
import { HOST_RATE_BYTES, HOST_RATE_SLICE_BYTES, hostChannels, measureRates } from '../src/rates.js';

/**
 * A CPU backend whose mlp_slice calls are skipped (the tests stay fast) and counted, each adding
 * `msPerCall` to the host compute time its stats report (as the CUDA backend's host MLP counters
 * do). `pinnedWeightBytes`: the pinned bf16 bytes it grants after the copies' source (the first
 * such buffer) before alloc throws, as a full pinned arena does.
 */
function fakeHostMlp(cpu: CpuBackend, msPerCall: number, pinnedWeightBytes = Number.POSITIVE_INFINITY) {
  const state = { calls: 0, hostMs: 0, slices: new Set<unknown>() };
  let pinned = 0;
  let copySource = true;
  const backend = new Proxy(cpu, {
    get(target, prop, recv) {
      if (prop === 'alloc')
        return (d: { dtype: string; length: number; tier?: string }) => {
          if (d.tier === 'pinned' && d.dtype === 'bf16') {
            if (copySource) copySource = false;
            else if ((pinned += d.length * 2) > pinnedWeightBytes) throw new RangeError('pinned arena full');
          }
          return target.alloc(d as never);
        };
      if (prop === 'run')
        return (op: string, args: { gateUp?: unknown }, stream?: unknown) => {
          if (op !== 'mlp_slice') return (target.run as (o: string, a: unknown, s?: unknown) => void)(op, args, stream);
          state.calls++;
          state.hostMs += msPerCall;
          state.slices.add(args.gateUp);
        };
      if (prop === 'stats') return () => ({ ...target.stats(), hostComputeMs: state.hostMs });
      const v = Reflect.get(target, prop, recv);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  }) as unknown as DeviceBackend;
  return { backend, state };
}

describe('compute near data: start-up rates and the split', () => {
  it('hostChannels balances the host against the link, in steps of 128 channels', () => {
    // No host rate, or no MLP: nothing computed on the host.
    expect(hostChannels({ h2dGBs: 50 }, 10, 100, 1024)).toBe(0);
    expect(hostChannels({ h2dGBs: 50, hostMlpGBs: 100 }, 10, 0, 1024)).toBe(0);
    // f = (A + M) host / (M (h2d + host)) = 110 * 100 / (100 * 150) = 0.733 -> 750.9 channels -> 640.
    expect(hostChannels({ h2dGBs: 50, hostMlpGBs: 100 }, 10, 100, 1024)).toBe(640);
    // A fast host would take everything: one block of 128 channels stays on the device.
    expect(hostChannels({ h2dGBs: 1, hostMlpGBs: 1000 }, 0, 100, 1024)).toBe(1024 - 128);
    // A slow host gets less than one block: none.
    expect(hostChannels({ h2dGBs: 100, hostMlpGBs: 1 }, 0, 100, 1024)).toBe(0);
  });

  it("the host rate is the host's own compute time, not the stream time around its calls", () => {
    // 2 ms of host compute a call.
    const cpu = new CpuBackend();
    const { backend, state } = fakeHostMlp(cpu, 2);
    const live0 = cpu.stats().liveBuffers;
    try {
      const hidden = 256;
      // Slices of at most 1 MiB (whole blocks of 64 channels) covering 8 MiB: the last read once to
      // warm up, then each once timed.
      const r = measureRates(backend, hidden, true, 8 * 2 ** 20);
      const inter = Math.floor(2 ** 20 / (6 * hidden) / 64) * 64;
      const bytes = 3 * inter * hidden * 2;
      const n = Math.round((8 * 2 ** 20) / bytes);
      expect(n).toBe(9);
      expect(state.calls).toBe(n + 1);
      expect(r.hostMlpGBs).toBeCloseTo((n * bytes) / (n * 2) / 1e6, 6);
      expect(r.h2dGBs).toBeGreaterThan(0);
      // Nothing left allocated.
      expect(cpu.stats().liveBuffers).toBe(live0);
    } finally {
      cpu.dispose();
    }
  });

  it('reads more distinct weights than a last-level cache holds, fewer when the pinned tier is full', () => {
    // A pinned tier that holds three slices' weights: the measurement runs over the three, each
    // read once timed (1 ms a call).
    const cpu = new CpuBackend();
    const { backend, state } = fakeHostMlp(cpu, 1, 3 * HOST_RATE_SLICE_BYTES);
    const live0 = cpu.stats().liveBuffers;
    try {
      expect(HOST_RATE_BYTES).toBeGreaterThanOrEqual(512 * 2 ** 20);
      const hidden = 4096;
      const r = measureRates(backend, hidden, true);
      expect(state.slices.size).toBe(3);
      expect(state.calls).toBe(4);
      const bytes = 3 * (HOST_RATE_SLICE_BYTES / (6 * hidden)) * hidden * 2;
      expect(r.hostMlpGBs).toBeCloseTo((3 * bytes) / 3 / 1e6, 6);
      expect(cpu.stats().liveBuffers).toBe(live0);
    } finally {
      cpu.dispose();
    }
  });

  it('without compute near data only the link is measured', () => {
    const cpu = new CpuBackend();
    try {
      const r = measureRates(cpu, 64, false);
      expect(r.hostMlpGBs).toBeUndefined();
      expect(r.h2dGBs).toBeGreaterThan(0);
    } finally {
      cpu.dispose();
    }
  });
});
