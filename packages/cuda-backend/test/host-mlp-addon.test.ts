import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NativeAddon, NativeContext } from '../src/native.js';
import { addon as loadedAddon, failEachUnless, gpuUnavailableReason, skipGpuSuite } from './gpu-world.js';

// The addon's host-MLP methods (native/addon/host_compute.cc -> native/host/host_mlp.cc) on a real context: run now,
// enqueued on a stream, and replayed from a captured graph, against a float64 reference; the
// argument checks. Needs a GPU and an addon with hostMlpCreate: skipped elsewhere (CI), failed
// in the GPU test phase (NERVA_GPU_TESTS=1, test/gpu-world.ts). The math itself is checked
// without a GPU by host-mlp-native.test.ts.

const missing =
  gpuUnavailableReason() ??
  (typeof (loadedAddon!.Context.prototype as Partial<NativeContext>).hostMlpCreate === 'function' ? null : 'the addon has no hostMlpCreate (a stale build)');
const addon: NativeAddon | null = missing === null ? loadedAddon : null;

const rows = 3;
const H = 131;
const C = 77;
const eps = 1e-6;

function bf16(v: number): number {
  const f = new Float32Array([v]);
  const u = new Uint32Array(f.buffer);
  return ((u[0] + 0x7fff + ((u[0] >> 16) & 1)) >>> 16) & 0xffff;
}
function fromBf16(b: number): number {
  return new Float32Array(new Uint32Array([b << 16]).buffer)[0];
}

describe.skipIf(skipGpuSuite(missing))('host MLP through the addon (GPU machine)', () => {
  failEachUnless(missing, 'the host MLP cannot run through the addon');
  let ctx: NativeContext;
  let pinnedBase = 0;
  let view: ArrayBuffer;
  // Offsets in the pinned arena.
  const off = { x: 0, normW: 4096, gateUp: 8192, down: 8192 + 2 * C * H * 2 + 256, y: 0 };
  off.y = (off.down + H * C * 2 + 255) & ~255;
  const ref = new Float64Array(rows * H);
  const scale = new Float64Array(rows * H);

  beforeAll(() => {
    if (missing !== null) return;
    ctx = new addon!.Context({ device: 0, deviceArenaBytes: 1 << 20, pinnedArenaBytes: 1 << 20, workspaceBytes: 1 << 20, cublasWorkspaceBytes: 0, gemmMode: 2 });
    pinnedBase = ctx.info().pinnedBase;
    view = ctx.pinnedArrayBuffer();
    const x = new Float32Array(view, off.x, rows * H);
    const w = new Float32Array(view, off.normW, H);
    const gu = new Uint16Array(view, off.gateUp, 2 * C * H);
    const dn = new Uint16Array(view, off.down, H * C);
    let seed = 12345;
    const rnd = (lo: number, hi: number) => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return lo + ((hi - lo) * seed) / 2147483648;
    };
    for (let i = 0; i < x.length; i++) x[i] = rnd(-2, 2);
    for (let i = 0; i < H; i++) w[i] = rnd(0.5, 1.5);
    for (let i = 0; i < gu.length; i++) gu[i] = bf16(rnd(-0.3, 0.3));
    for (let i = 0; i < dn.length; i++) dn[i] = bf16(rnd(-0.1, 0.1));
    // float64 reference and the per-output error scale (see test/native/host_mlp_test.cc)
    for (let r = 0; r < rows; r++) {
      let ss = 0;
      for (let i = 0; i < H; i++) ss += x[r * H + i] ** 2;
      const inv = 1 / Math.sqrt(ss / H + eps);
      const xn = Array.from({ length: H }, (_, i) => x[r * H + i] * inv * w[i]);
      const a = new Float64Array(C);
      const A = new Float64Array(C);
      for (let j = 0; j < C; j++) {
        let g = 0, u = 0, G = 0, U = 0;
        for (let i = 0; i < H; i++) {
          const gw = fromBf16(gu[j * H + i]) * xn[i];
          const uw = fromBf16(gu[(C + j) * H + i]) * xn[i];
          g += gw;
          u += uw;
          G += Math.abs(gw);
          U += Math.abs(uw);
        }
        const s = 1 / (1 + Math.exp(-g));
        a[j] = g * s * u;
        A[j] = Math.abs(a[j]) + Math.abs(s * (1 + g * (1 - s)) * u) * G + Math.abs(g * s) * U;
      }
      for (let h = 0; h < H; h++) {
        let y = 0, S = 0;
        for (let j = 0; j < C; j++) {
          const d = fromBf16(dn[h * C + j]);
          y += d * a[j];
          S += Math.abs(d) * A[j];
        }
        ref[r * H + h] = y;
        scale[r * H + h] = S;
      }
    }
  });
  afterAll(() => ctx?.dispose());

  const args = () => ({ rows, hidden: H, inter: C, eps, x: pinnedBase + off.x, normW: pinnedBase + off.normW, gateUp: pinnedBase + off.gateUp, down: pinnedBase + off.down, y: pinnedBase + off.y });
  const y = () => new Float32Array(view, off.y, rows * H);
  const expectMatches = () => {
    const out = y();
    const bound = (H + C + 16) * 2 ** -24;
    for (let i = 0; i < out.length; i++) expect(Math.abs(out[i] - ref[i])).toBeLessThanOrEqual(bound * scale[i]);
  };

  it('runs now, enqueued on a stream, and from a replayed graph', () => {
    const id = ctx.hostMlpCreate!(args());
    y().fill(NaN);
    ctx.hostMlpRun!(id);
    expectMatches();
    const first = Float32Array.from(y());

    const s = ctx.createStream();
    y().fill(NaN);
    ctx.hostMlpEnqueue!(id, s);
    ctx.synchronize(s);
    expect(y()).toEqual(first); // same chunks, same order: bitwise

    ctx.beginCapture(s);
    ctx.hostMlpEnqueue!(id, s);
    const [graph, nodes] = ctx.endCapture(s);
    expect(nodes).toBe(1);
    for (let k = 0; k < 3; k++) {
      y().fill(NaN);
      ctx.replay(graph, s);
      ctx.synchronize(s);
      expect(y()).toEqual(first);
    }
    ctx.destroyGraph(graph);

    const mine = ctx.hostMlpStats!(id);
    expect(mine.calls).toBe(5);
    expect(mine.ns).toBeGreaterThan(0);
    const all = ctx.hostMlpStats!();
    expect(all.calls).toBeGreaterThanOrEqual(5);
    expect(all.threads).toBeGreaterThanOrEqual(1);
    expect(['avx512', 'avx2', 'scalar']).toContain(all.isa);
    ctx.hostMlpDestroy!(id);
    expect(() => ctx.hostMlpRun!(id)).toThrow(/unknown host MLP/);
    ctx.destroyStream(s);
  });

  it('writes zeros for inter = 0 and refuses bad arguments', () => {
    const id = ctx.hostMlpCreate!({ ...args(), inter: 0, gateUp: 0, down: 0 });
    y().fill(NaN);
    ctx.hostMlpRun!(id);
    expect(y().every((v) => v === 0)).toBe(true);
    ctx.hostMlpDestroy!(id);
    expect(() => ctx.hostMlpCreate!({ ...args(), rows: 0 })).toThrow(/rows must be an integer >= 1/);
    expect(() => ctx.hostMlpCreate!({ ...args(), gateUp: 0 })).toThrow(/non-null/);
    expect(() => ctx.hostMlpCreate!({ ...args(), y: ctx.info().deviceBase })).toThrow(/device memory/);
    expect(() => ctx.hostMlpCreate!({ ...args(), down: pinnedBase + (1 << 20) - 64 })).toThrow(/past the pinned arena/);
  });
});
