import type { DeviceBackend } from '@nerva/core';
import { CpuBackend } from '@nerva/cpu-backend';
import { describe, expect, it } from 'vitest';
import { hostChannels, measureRates } from '../src/rates.js';

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
    // A CPU backend whose stats report 2 ms of host compute per mlp_slice call (as the CUDA
    // backend's host MLP counters do); the calls themselves are skipped to keep the test fast.
    const cpu = new CpuBackend();
    let hostMs = 0;
    let calls = 0;
    const backend = new Proxy(cpu, {
      get(target, prop, recv) {
        if (prop === 'run')
          return (op: string, args: unknown, stream?: unknown) => {
            if (op === 'mlp_slice') {
              calls++;
              hostMs += 2;
              return;
            }
            return (target.run as (o: string, a: unknown, s?: unknown) => void)(op, args, stream);
          };
        if (prop === 'stats') return () => ({ ...target.stats(), hostComputeMs: hostMs });
        const v = Reflect.get(target, prop, recv);
        return typeof v === 'function' ? v.bind(target) : v;
      },
    }) as unknown as DeviceBackend;
    const live0 = cpu.stats().liveBuffers;
    try {
      const hidden = 256;
      const r = measureRates(backend, hidden, true);
      // One warm-up call, then 8 timed ones.
      expect(calls).toBe(9);
      const inter = Math.floor((24 * 2 ** 20) / (3 * hidden)) * 2;
      const bytes = 3 * inter * hidden * 2;
      expect(r.hostMlpGBs).toBeCloseTo((8 * bytes) / (8 * 2) / 1e6, 6);
      expect(r.h2dGBs).toBeGreaterThan(0);
      // Nothing left allocated.
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
