import type { DeviceBackend, DeviceBuffer, EventHandle, StreamHandle } from '@nerva/core';

/** Transfer and compute rates measured on this machine at start-up (GB/s of weight bytes). */
export interface MeasuredRates {
  /** Host-tier (pinned) to compute-tier copies. */
  h2dGBs: number;
  /** The host computing an MLP slice over host-tier weights (op mlp_slice), while copies run. */
  hostMlpGBs?: number;
}

/**
 * The host MLP's start-up rate reads this many bytes of distinct weights (in slices of
 * HOST_RATE_SLICE_BYTES), each once a round, as a decode step reads each streamed layer's slice
 * once a token: more than a host's last-level cache holds, so the rate is the host DRAM's. One
 * 96 MiB slice read eight times was served partly from the cache: the H100 host measured
 * 153.9 GB/s at start-up and then computed at 93.5 GB/s inside the model, so the planner gave the
 * host too many channels and the link waited on it (docs/results/memory-os.md).
 */
export const HOST_RATE_BYTES = 768 * 2 ** 20;
export const HOST_RATE_SLICE_BYTES = 96 * 2 ** 20;

/**
 * Measure what the residency planner trades against each other: copying weights to the device
 * and computing near them on the host. Both run at once, on two streams, because that is how
 * they will run (and they share the host's memory bandwidth). Everything goes through the
 * backend contract (copy, run, events); buffers are freed before returning. `hostBytes` (tests):
 * the host's weights in all, HOST_RATE_BYTES by default; fewer when the pinned tier cannot hold
 * them (at least one slice).
 */
export function measureRates(backend: DeviceBackend, hidden: number, withHostMlp: boolean, hostBytes = HOST_RATE_BYTES): MeasuredRates {
  const owned: DeviceBuffer[] = [];
  const events: EventHandle[] = [];
  const streams: StreamHandle[] = [];
  const alloc = (dtype: 'f32' | 'bf16', length: number, tier?: 'pinned') => {
    const b = backend.alloc({ dtype, length, usage: 'workspace', label: 'rates', ...(tier ? { tier } : {}) });
    owned.push(b);
    return b;
  };
  const ev = () => {
    const e = backend.createEvent();
    events.push(e);
    return e;
  };
  try {
    const copyElems = 32 * 2 ** 20; // 64 MiB of bf16
    const src = alloc('bf16', copyElems, 'pinned');
    const dst = alloc('bf16', copyElems);
    const cs = backend.createStream();
    streams.push(cs);
    const [c0, c1] = [ev(), ev()];
    let mlp: { calls: Array<() => void>; bytes: number; e0: EventHandle; e1: EventHandle; stream: StreamHandle } | undefined;
    if (withHostMlp) {
      // Slices of `inter` channels (gate, up and down: 3 x inter x hidden bf16 weights each).
      const sliceBytes = Math.min(HOST_RATE_SLICE_BYTES, hostBytes / 8);
      const inter = Math.max(64, Math.floor(sliceBytes / (6 * hidden) / 64) * 64);
      const x = alloc('f32', hidden);
      const out = alloc('f32', hidden);
      const nw = alloc('f32', hidden, 'pinned');
      const xHost = alloc('f32', hidden, 'pinned');
      const yHost = alloc('f32', hidden, 'pinned');
      backend.write(nw, new Float32Array(hidden).fill(1));
      backend.write(x, new Float32Array(hidden).fill(0.5));
      const ms = backend.createStream();
      streams.push(ms);
      const want = Math.max(1, Math.round(hostBytes / (3 * inter * hidden * 2)));
      const calls: Array<() => void> = [];
      for (let i = 0; i < want; i++) {
        let gu: DeviceBuffer;
        let down: DeviceBuffer;
        try {
          gu = alloc('bf16', 2 * inter * hidden, 'pinned');
          down = alloc('bf16', hidden * inter, 'pinned');
        } catch (err) {
          // The pinned tier is full: measure over the slices it held (a small arena's rate may
          // then be the cache's; the planner only splits layers the arena also holds).
          if (i === 0) throw err;
          break;
        }
        const args = { x, normWeight: nw, gateUp: gu, down, out, rows: 1, hidden, inter, eps: 1e-6, xHost, yHost };
        calls.push(() => backend.run('mlp_slice', args, ms));
      }
      mlp = { calls, bytes: 3 * inter * hidden * 2, e0: ev(), e1: ev(), stream: ms };
      // Warm-up: the pool's threads started, on the last slice (read last again, after the others)
      calls[calls.length - 1]();
    }
    // The copies outlast the host's round (12 x 64 MiB at ~55 GB/s, 14 ms, against 768 MiB at
    // ~100-250 GB/s), so every timed host call runs while weights cross the link, as in a decode step.
    const copies = 12;
    backend.copy(dst, src, copyElems, 0, 0, cs); // warm-up
    backend.synchronize('debug');
    const hostMs0 = backend.stats().hostComputeMs;
    backend.record(c0, cs);
    if (mlp) backend.record(mlp.e0, mlp.stream);
    for (let i = 0; i < Math.max(copies, mlp?.calls.length ?? 0); i++) {
      if (i < copies) backend.copy(dst, src, copyElems, 0, 0, cs);
      mlp?.calls[i]?.();
    }
    backend.record(c1, cs);
    if (mlp) backend.record(mlp.e1, mlp.stream);
    backend.synchronize('debug');
    const gbs = (bytes: number, ms: number) => (ms > 0 ? bytes / ms / 1e6 : Number.POSITIVE_INFINITY);
    const out: MeasuredRates = { h2dGBs: gbs(copies * copyElems * 2, backend.elapsedMs(c0, c1)) };
    if (mlp) {
      // The host's own compute time when the backend reports it: the events around the calls also
      // count each call's activation copies, which queue behind the weight copies on the link
      // (that halved the measured rate), while the split must balance compute against copies.
      const hostMs1 = backend.stats().hostComputeMs;
      const ms = hostMs0 !== undefined && hostMs1 !== undefined && hostMs1 > hostMs0 ? hostMs1 - hostMs0 : backend.elapsedMs(mlp.e0, mlp.e1);
      out.hostMlpGBs = gbs(mlp.calls.length * mlp.bytes, ms);
    }
    return out;
  } finally {
    for (const b of owned) backend.free(b);
    for (const e of events) backend.destroyEvent(e);
    for (const s of streams) backend.destroyStream(s);
  }
}

/**
 * How many of a streamed layer's `inter` MLP channels the host should compute so that its time
 * matches the copy of the rest: with A attention bytes and M MLP bytes per layer,
 * (A + (1 - f) M) / h2d = f M / host, so f = (A + M) host / (M (h2d + host)). Rounded down to a
 * multiple of 128 channels; 0 when the host would get less than that.
 */
export function hostChannels(rates: MeasuredRates, attnBytes: number, mlpBytes: number, inter: number): number {
  const host = rates.hostMlpGBs;
  if (host === undefined || !(host > 0) || !(rates.h2dGBs > 0) || mlpBytes <= 0) return 0;
  const f = ((attnBytes + mlpBytes) * host) / (mlpBytes * (rates.h2dGBs + host));
  const c = Math.floor((Math.min(f, 1) * inter) / 128) * 128;
  return c >= 128 ? Math.min(c, inter - 128) : 0;
}
