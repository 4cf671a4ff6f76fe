import { describe, expect, it } from 'vitest';
import { OP_NAMES, bf16ToF32, emptySyncCounts, f32ToBf16, type DeviceBackend, type DeviceBuffer } from '../src/index.js';
import { ConformanceRng, conformanceCases, roundToBf16, runConformance } from '../src/conformance/index.js';

/**
 * A backend with working memory but no kernels: every op throws. The suite must turn each case
 * into a failed result (not a crash) and free what the case allocated.
 */
function memoryOnlyBackend(name: string): DeviceBackend {
  const mem = new Map<number, Float32Array | Int32Array>();
  let next = 1;
  const stats = { liveBuffers: 0 };
  const be: Partial<DeviceBackend> = {
    name,
    capabilities: {
      deviceKind: 'stub',
      deviceName: 'stub',
      deviceCount: 1,
      memory: {},
      computeTier: 'dram',
      dtypes: ['f32', 'i32'],
      weightDtype: 'f32',
      precision: { compute: 'f32', relTol: 1e-6 },
      graphCapture: false,
      peerAccess: false,
      collectives: false,
      fabric: 'CoherentSharedPhysical',
      ops: OP_NAMES,
    },
    alloc(spec) {
      if (spec.dtype === 'bf16' || spec.dtype === 'f16') throw new Error('stub has no half types');
      const id = next++;
      mem.set(id, spec.dtype === 'i32' ? new Int32Array(spec.length) : new Float32Array(spec.length));
      stats.liveBuffers++;
      return { id, dtype: spec.dtype, length: spec.length, byteLength: spec.length * 4, tier: 'dram', usage: 'activations' } as DeviceBuffer;
    },
    free(buf) {
      if (!mem.delete(buf.id)) throw new Error('double free');
      stats.liveBuffers--;
    },
    write(buf, src, offset = 0) {
      mem.get(buf.id)!.set(src as Float32Array, offset);
    },
    read(buf) {
      return mem.get(buf.id)!.slice();
    },
    run(op) {
      throw new Error(`no kernel for ${op}`);
    },
    stats: () => ({
      liveBuffers: stats.liveBuffers,
      liveBytes: 0,
      allocCalls: 0,
      freeCalls: 0,
      hotPathAllocations: 0,
      h2dBytes: 0,
      d2hBytes: 0,
      d2dBytes: 0,
      launches: 0,
      graphReplays: 0,
      syncs: emptySyncCounts(),
    }),
  };
  return be as DeviceBackend;
}

describe('conformance suite', () => {
  it('has cases for every op of the catalogue', () => {
    expect(new Set(conformanceCases().map((c) => c.op))).toEqual(new Set(OP_NAMES));
  });

  it("runs the cases of an optional op field only where both backends take it (capabilities.opFields)", () => {
    const names = (o: Parameters<typeof conformanceCases>[0]) => conformanceCases(o).map((c) => `${c.op}/${c.name}`);
    const none = names({});
    const all = names({ opFields: { sample: ['push', 'advance'], decoder_layers: ['embed'] } });
    const tail = all.filter((n) => !none.includes(n));
    // The push/advance cases of op sample and the embed cases of op decoder_layers, nothing else.
    expect(tail.some((n) => n.startsWith('sample/'))).toBe(true);
    expect(tail.some((n) => n.startsWith('decoder_layers/'))).toBe(true);
    expect(tail.every((n) => n.startsWith('sample/') || n.startsWith('decoder_layers/'))).toBe(true);
    expect(names({ opFields: { sample: ['push', 'advance'] } }).filter((n) => !none.includes(n)).every((n) => n.startsWith('sample/'))).toBe(true);
    // A case needs every field it uses: push alone runs no tail case.
    expect(names({ opFields: { sample: ['push'] } })).toEqual(none);
  });

  it("runs the bf16 activation cases only where both backends take bf16 activations (capabilities.activationDtypes)", () => {
    const names = (o: Parameters<typeof conformanceCases>[0]) => conformanceCases(o).map((c) => `${c.op}/${c.name}`);
    const none = names({});
    const bf16 = names({ activationDtypes: ['bf16'] }).filter((n) => !none.includes(n));
    expect(bf16.length).toBeGreaterThan(0);
    expect(bf16.every((n) => /^(rmsnorm|silu_mul|matmul)\//.test(n))).toBe(true);
  });

  it('turns a throwing op into a failed result, frees the case buffers, and keeps going', async () => {
    const be = memoryOnlyBackend('stub');
    const report = await runConformance(be, memoryOnlyBackend('stub-ref'));
    expect(report.passed).toBe(0);
    expect(report.failed).toBe(report.results.length);
    for (const r of report.results) {
      expect(r.ok).toBe(false);
      expect(r.error).toBe(`Error: no kernel for ${r.op}`);
      expect(r.leakedBuffers).toBe(0);
    }
    expect(be.stats().liveBuffers).toBe(0);
  });

  it('generates the same inputs for the same seed and different ones for another', () => {
    const a = new ConformanceRng(7).normals(64);
    expect(new ConformanceRng(7).normals(64)).toEqual(a);
    expect(new ConformanceRng(8).normals(64)).not.toEqual(a);
    // Roughly standard normal.
    const big = new ConformanceRng(1).normals(20000);
    const mean = big.reduce((s, v) => s + v, 0) / big.length;
    const varc = big.reduce((s, v) => s + (v - mean) ** 2, 0) / big.length;
    expect(Math.abs(mean)).toBeLessThan(0.03);
    expect(Math.abs(varc - 1)).toBeLessThan(0.05);
  });

  it('roundToBf16 agrees with the scalar bf16 conversion, ties and specials included', () => {
    const r = new ConformanceRng(3);
    const xs = Float32Array.from([...r.normals(1000, 100), 1 + 2 ** -8, 1 + 3 * 2 ** -8, Infinity, -Infinity, 0, -0, 3.4e38, NaN]);
    const want = Array.from(xs, (v) => bf16ToF32(f32ToBf16(v)));
    expect(Array.from(roundToBf16(xs.slice()))).toEqual(want);
  });
});
