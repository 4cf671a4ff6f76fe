import { describe, expect, it } from 'vitest';
import {
  classifyFabric,
  GPU_DIRECT_KINDS,
  listPaths,
  measureOnce,
  planFabric,
  planPath,
  TransportArgumentError,
  UnknownEndpointError,
  type Endpoint,
  type MeasureFn,
  type PathKind,
  type RuntimeProbe,
} from '../src/index.js';
import { caps, FIXTURES, fixtureRuntime, loadFixture, matrix } from './helpers.js';

const gpu = (device: number): Endpoint => ({ kind: 'gpu', device });
const host: Endpoint = { kind: 'host' };
const remote: Endpoint = { kind: 'remote', name: 'peer' };

/** A fake measurement table by kind. */
function rates(table: Partial<Record<PathKind, [number, number] | Error>>): MeasureFn {
  return (p) => {
    const r = table[p.kind];
    if (r instanceof Error) throw r;
    return r ? { gbps: r[0], latencyUs: r[1] } : undefined;
  };
}

describe('planPath between GPUs', () => {
  it('h200: NVLink peer wins when it measures fastest', () => {
    const plan = planPath(loadFixture('h200-nvlink-2gpu'), gpu(0), gpu(1), {
      capabilities: caps(),
      measure: rates({ 'nvlink-peer': [390, 8], nccl: [330, 25], 'pinned-bounce': [22, 12] }),
    });
    expect(plan.chosen?.kind).toBe('nvlink-peer');
    expect(plan.chosen?.gpuDirect).toBe(true);
    expect(plan.degraded).toBe(false);
    expect(plan.candidates.map((c) => c.kind)).toEqual(['nvlink-peer', 'nccl', 'pinned-bounce']);
    expect(plan.rejected).toEqual([{ kind: 'pcie-peer', reason: 'peer copies between these devices take NVLink' }]);
    expect(plan.chosen?.costUs).toBeCloseTo(8 + (1 << 20) / 390e3, 6);
    expect(plan.notes).toEqual(['chose nvlink-peer (measured 390.0 GB/s, 8.0 us)']);
  });

  it('h200: for a tiny transfer a cheaper-latency bounce can win, and that is reported as degraded', () => {
    const plan = planPath(loadFixture('h200-nvlink-2gpu'), gpu(0), gpu(1), {
      capabilities: caps({ collectives: false }),
      bytes: 64,
      measure: rates({ 'nvlink-peer': [390, 12], 'pinned-bounce': [22, 6] }),
    });
    expect(plan.chosen?.kind).toBe('pinned-bounce');
    expect(plan.degraded).toBe(true);
    expect(plan.notes).toContain('degraded: nvlink-peer measured slower than pinned-bounce');
  });

  it('h200: a failing NVLink measurement falls back explicitly', () => {
    const plan = planPath(loadFixture('h200-nvlink-2gpu'), gpu(1), gpu(0), {
      capabilities: caps(),
      measure: rates({ 'nvlink-peer': new Error('cudaErrorPeerAccessUnsupported'), nccl: [300, 20], 'pinned-bounce': [22, 12] }),
    });
    expect(plan.chosen?.kind).toBe('nccl');
    expect(plan.degraded).toBe(true);
    expect(plan.notes).toContain('nvlink-peer: measurement failed (cudaErrorPeerAccessUnsupported); not used');
    expect(plan.notes).toContain('degraded: nvlink-peer could not be measured');
    expect(plan.candidates.at(-1)).toMatchObject({ kind: 'nvlink-peer', error: 'cudaErrorPeerAccessUnsupported' });
  });

  it('pcie-2gpu-iommu: bounces through pinned host memory and says why', () => {
    const plan = planPath(loadFixture('pcie-2gpu-iommu'), gpu(0), gpu(1), { capabilities: caps({ collectives: false }) });
    expect(plan.chosen?.kind).toBe('pinned-bounce');
    expect(plan.degraded).toBe(true);
    expect(plan.notes).toEqual([
      'chose pinned-bounce (no measurement hook, by preference)',
      'degraded: nvlink-peer, pcie-peer unavailable: runtime (fixture) reports no peer access either way',
    ]);
    expect(plan.rejected.map((r) => r.kind)).toEqual(['nvlink-peer', 'pcie-peer', 'nccl']);
  });

  it('pcie-2gpu-iommu with a runtime that allows P2P: still refused, because of the IOMMU across root complexes', () => {
    const t = loadFixture('pcie-2gpu-iommu', { deviceCount: 2, peerAccess: matrix(2, true, false), nvlinkLinks: matrix(2, 0, 0) });
    const plan = planPath(t, gpu(0), gpu(1), { capabilities: caps() });
    expect(plan.candidates.some((c) => c.gpuDirect)).toBe(false);
    expect(plan.chosen?.kind).toBe('nccl');
    expect(plan.degraded).toBe(true);
    expect(plan.notes.join('\n')).toMatch(/IOMMU may translate DMA/);
  });

  it('the current CUDA backend (peerAccess false) never gets a direct path', () => {
    const plan = planPath(loadFixture('h200-nvlink-2gpu'), gpu(0), gpu(1), { capabilities: caps({ peerAccess: false, collectives: false }) });
    expect(plan.chosen?.kind).toBe('pinned-bounce');
    expect(plan.notes.join('\n')).toMatch(/capabilities.peerAccess = false/);
  });

  it('ranks unmeasured candidates after measured ones and drops invalid measurements', () => {
    const plan = planPath(loadFixture('h200-nvlink-2gpu'), gpu(0), gpu(1), {
      capabilities: caps(),
      measure: rates({ nccl: [0, 5], 'pinned-bounce': [20, 10] }),
    });
    expect(plan.chosen?.kind).toBe('pinned-bounce');
    expect(plan.candidates.map((c) => [c.kind, c.error])).toEqual([
      ['pinned-bounce', null],
      ['nvlink-peer', null],
      ['nccl', 'rate 0 GB/s is not positive'],
    ]);
    expect(plan.notes[0]).toBe('nccl: invalid measurement (rate 0 GB/s is not positive); not used');
  });

  it('rejects bad endpoints and sizes', () => {
    const t = loadFixture('h200-nvlink-2gpu');
    expect(() => planPath(t, gpu(0), gpu(0))).toThrow(TransportArgumentError);
    expect(() => planPath(t, gpu(0), gpu(2))).toThrow(UnknownEndpointError);
    expect(() => planPath(t, remote, remote)).toThrow(/neither end/);
    expect(() => planPath(t, { kind: 'host', numaNode: 7 }, gpu(0))).toThrow(/no NUMA node 7/);
    expect(() => planPath(t, host, gpu(0), { bytes: -1 })).toThrow(/bytes/);
    expect(() => listPaths(t, { kind: 'disk' } as unknown as Endpoint, gpu(0))).toThrow(/unknown endpoint kind/);
  });
});

describe('planPath to and from the host', () => {
  const t = loadFixture('h100-sxm-vm');

  it('host -> GPU: CPU-produced staging, mapped pinned and a pinned bounce, chosen by measured cost', () => {
    const plan = planPath(t, host, gpu(0), { measure: rates({ 'cpu-produced': [24, 9], 'mapped-pinned': [12, 3], 'pinned-bounce': [10, 15] }) });
    expect(plan.candidates.map((c) => c.kind)).toEqual(['cpu-produced', 'mapped-pinned', 'pinned-bounce']);
    expect(plan.chosen?.kind).toBe('cpu-produced');
    const small = planPath(t, host, gpu(0), { bytes: 256, measure: rates({ 'cpu-produced': [24, 9], 'mapped-pinned': [12, 3], 'pinned-bounce': [10, 15] }) });
    expect(small.chosen?.kind).toBe('mapped-pinned');
    expect(small.degraded).toBe(false);
  });

  it('GPU -> host without a runtime probe: no mapped pinned claim', () => {
    const bare = loadFixture('h100-sxm-vm', null);
    const plan = planPath(bare, gpu(0), host);
    expect(plan.candidates.map((c) => c.kind)).toEqual(['pinned-bounce']);
    expect(plan.rejected).toEqual([{ kind: 'mapped-pinned', reason: 'no runtime probe: mapping pinned host memory unproven' }]);
  });

  it('a backend without a pinned tier has no path, and the plan says so', () => {
    const plan = planPath(t, gpu(0), host, { capabilities: caps({ deviceCount: 1, memory: { vram: 1e9 } }) });
    expect(plan.chosen).toBeNull();
    expect(plan.degraded).toBe(true);
    expect(plan.notes[0]).toMatch(/^no usable path gpu0 -> host: mapped-pinned: backend cuda has no pinned tier/);
  });

  it('host <-> host and host <-> remote go over TCP', () => {
    expect(planPath(t, host, host).chosen?.kind).toBe('tcp');
    expect(planPath(t, host, remote).chosen?.kind).toBe('tcp');
    expect(planPath(t, remote, { kind: 'host', numaNode: 0 }).degraded).toBe(false);
  });
});

describe('planPath to another node', () => {
  it('h200: GPUDirect RDMA through the NIC on the GPU\'s own switch', () => {
    const t = loadFixture('h200-nvlink-2gpu');
    const p0 = planPath(t, gpu(0), remote, { capabilities: caps() });
    expect(p0.chosen).toMatchObject({ kind: 'gpudirect-rdma', gpuDirect: true, via: 'GPU 0 <-> NIC 0000:19:00.0 (PIX) by RDMA' });
    const p1 = planPath(t, remote, gpu(1), { capabilities: caps() });
    expect(p1.chosen?.via).toBe('GPU 1 <-> NIC 0000:9b:00.0 (PIX) by RDMA');
    expect(p1.degraded).toBe(false);
  });

  it('h100 VM: no RDMA NIC, so TCP through the host, degraded and explained', () => {
    const plan = planPath(loadFixture('h100-sxm-vm'), gpu(0), remote, { capabilities: caps({ deviceCount: 1, collectives: false }) });
    expect(plan.chosen?.kind).toBe('tcp');
    expect(plan.degraded).toBe(true);
    expect(plan.notes).toContain('degraded: gpudirect-rdma unavailable: no RDMA-capable NIC');
  });

  it('h200 without nvidia_peermem loaded or without runtime verification: no RDMA claim', () => {
    const rt = fixtureRuntime('h200-nvlink-2gpu') as RuntimeProbe;
    const unverified = loadFixture('h200-nvlink-2gpu', { ...rt, gpuDirectRdma: undefined });
    expect(listPaths(unverified, gpu(0), remote).rejected[0]).toEqual({ kind: 'gpudirect-rdma', reason: 'runtime (fixture) did not verify GPUDirect RDMA' });
    const noPeermem = { ...unverified, runtime: unverified.runtime && { ...unverified.runtime, gpuDirectRdma: true as const }, peerMemory: { ...unverified.peerMemory, peerMemory: [] } };
    expect(listPaths(noPeermem, gpu(0), remote).rejected[0].reason).toMatch(/no peer-memory module/);
  });
});

describe('measureOnce', () => {
  it('measures each path once per process, failures included', () => {
    let calls = 0;
    const m = measureOnce((p) => {
      calls++;
      if (p.kind === 'nccl') throw new Error('no comm');
      return { gbps: 10, latencyUs: 1 };
    });
    const t = loadFixture('h200-nvlink-2gpu');
    planPath(t, gpu(0), gpu(1), { capabilities: caps(), measure: m });
    const again = planPath(t, gpu(0), gpu(1), { capabilities: caps(), measure: m });
    expect(calls).toBe(3);
    expect(again.notes).toContain('nccl: measurement failed (no comm); not used');
    expect([...m.results.keys()]).toEqual(['nvlink-peer:gpu0>gpu1', 'nccl:gpu0>gpu1', 'pinned-bounce:gpu0>gpu1']);
    planPath(t, gpu(1), gpu(0), { capabilities: caps(), measure: m });
    expect(calls).toBe(6);
  });
});

describe('planFabric', () => {
  it('plans every pair and host direction, listing the fallbacks', () => {
    const h200 = planFabric(loadFixture('h200-nvlink-2gpu'), { capabilities: caps() });
    expect(h200.plans).toHaveLength(6);
    expect(h200.degraded).toEqual([]);
    expect(h200.fabric).toBe('DiscreteExplicit');
    const pcie = planFabric(loadFixture('pcie-2gpu-iommu'), { capabilities: caps({ collectives: false }) });
    expect(pcie.degraded).toEqual([
      'gpu0 -> gpu1: pinned-bounce (degraded: nvlink-peer, pcie-peer unavailable: runtime (fixture) reports no peer access either way)',
      'gpu1 -> gpu0: pinned-bounce (degraded: nvlink-peer, pcie-peer unavailable: runtime (fixture) reports no peer access either way)',
    ]);
    expect(JSON.parse(JSON.stringify(pcie)).summary).toBe(pcie.summary);
  });

  it('plans the recorded H100 host paths without a fallback and nothing GPU-direct', () => {
    const r = planFabric(loadFixture('h100-recorded'), { capabilities: caps({ deviceCount: 1, peerAccess: false, collectives: false }) });
    expect(r.plans.map((p) => [p.from.kind, p.to.kind, p.chosen?.kind])).toEqual([
      ['host', 'gpu', 'cpu-produced'],
      ['gpu', 'host', 'pinned-bounce'],
    ]);
    expect(r.degraded).toEqual([]);
    expect(r.classification).toMatchObject({ fabric: 'DiscreteExplicit', hardwareFabric: 'DiscreteExplicit', agrees: true, pairs: [], gpuDirectPairs: 0 });
    // The recording cannot show whether pinned host memory maps into the GPU: not claimed.
    expect(r.plans[0].rejected.map((x) => x.kind)).toEqual(['mapped-pinned']);
  });

  it('plans nothing for the CPU backend', () => {
    expect(planFabric(loadFixture('h100-sxm-vm'), { capabilities: caps({ deviceKind: 'cpu', deviceCount: 1 }) }).plans).toEqual([]);
  });
});

/**
 * Zero false GPU-direct claims. The facts below are read off each fixture by hand (not computed by
 * the code under test): whether its PCI topology lets PCIe peer-to-peer through at all.
 * h200: passthrough IOMMU, so yes (across sockets, with a warning). pcie-2gpu-iommu: different
 * root complexes with a translating IOMMU, so no. malformed: placements unknown and a translating
 * IOMMU group, so no. h100 (recorded and modelled): one GPU, no pairs.
 */
const PCIE_P2P_POSSIBLE: Record<string, boolean> = { 'h100-recorded': false, 'h100-sxm-vm': false, 'h200-nvlink-2gpu': true, 'pcie-2gpu-iommu': false, malformed: false };
/**
 * Whether an RDMA NIC and a peer-memory module exist (by hand). h100-recorded has ib_core and
 * mlx5_core built into its kernel but only a virtio NIC and no peer-memory module: no.
 */
const RDMA_POSSIBLE: Record<string, boolean> = { 'h100-recorded': false, 'h100-sxm-vm': false, 'h200-nvlink-2gpu': true, 'pcie-2gpu-iommu': false, malformed: false };

function runtimeVariants(name: string, gpus: number): (RuntimeProbe | null)[] {
  const own = fixtureRuntime(name) ?? null;
  const n = own?.deviceCount ?? gpus;
  const ids = own?.pciBusIds;
  const v: (RuntimeProbe | null)[] = [own, null];
  if (n > 0) {
    v.push({ deviceCount: n, peerAccess: matrix(n, true, false), nvlinkLinks: matrix(n, 0, 0), pciBusIds: ids, mappedPinned: true, gpuDirectRdma: true });
    v.push({ deviceCount: n, peerAccess: matrix(n, true, false), pciBusIds: ids, gpuDirectRdma: true });
    v.push({ deviceCount: n, peerAccess: matrix(n, true, false), nvlinkLinks: matrix(n, 12, 0), pciBusIds: ids });
    v.push({ deviceCount: n, peerAccess: matrix(n, false, false), nvlinkLinks: matrix(n, 18, 0), pciBusIds: ids, gpuDirectRdma: true });
    v.push({ deviceCount: n, peerAccess: matrix(n, false, false).map((row, i) => row.map((_, j) => i < j)), nvlinkLinks: matrix(n, 4, 0), pciBusIds: ids });
    v.push({ deviceCount: n + 1, peerAccess: matrix(n + 1, true, false), gpuDirectRdma: true });
  }
  return v;
}

describe('zero false GPU-direct claims', () => {
  for (const name of FIXTURES) {
    it(`${name}: every GPU-direct claim is backed by runtime peer access and the topology`, () => {
      const gpus = loadFixture(name, null).gpus.length;
      let checked = 0;
      let direct = 0;
      for (const runtime of runtimeVariants(name, gpus)) {
        const t = loadFixture(name, runtime);
        for (const capabilities of [undefined, caps(), caps({ peerAccess: false }), caps({ collectives: false })]) {
          const n = t.runtime ? t.runtime.deviceCount : t.gpus.length;
          const endpoints: Endpoint[] = [host, remote, ...Array.from({ length: n }, (_, i) => gpu(i))];
          for (const from of endpoints) {
            for (const to of endpoints) {
              if (from.kind === 'remote' && to.kind === 'remote') continue;
              if (from.kind === 'gpu' && to.kind === 'gpu' && from.device === to.device) continue;
              const plan = planPath(t, from, to, { capabilities, measure: () => ({ gbps: 1, latencyUs: 1 }) });
              for (const c of plan.candidates) {
                checked++;
                expect(c.gpuDirect, `${c.kind} flag`).toBe(GPU_DIRECT_KINDS.has(c.kind));
                if (!c.gpuDirect) continue;
                direct++;
                expect(runtime, `${name} ${c.key}: a direct claim without a runtime`).not.toBeNull();
                const rt = runtime as RuntimeProbe;
                if (capabilities) expect(capabilities.peerAccess || c.kind === 'gpudirect-rdma', `${c.key} with peerAccess=false`).toBe(true);
                if (c.kind === 'gpudirect-rdma') {
                  expect(rt.gpuDirectRdma).toBe(true);
                  expect(RDMA_POSSIBLE[name]).toBe(true);
                  continue;
                }
                const a = (from as { device: number }).device;
                const b = (to as { device: number }).device;
                expect(rt.peerAccess[a][b] && rt.peerAccess[b][a], `${name} ${c.key}: runtime peer access`).toBe(true);
                if (c.kind === 'nvlink-peer') expect(rt.nvlinkLinks?.[a][b] ?? 0).toBeGreaterThan(0);
                if (c.kind === 'pcie-peer') {
                  expect(PCIE_P2P_POSSIBLE[name], `${name} ${c.key}: PCIe P2P on a topology that rules it out`).toBe(true);
                  expect(rt.nvlinkLinks?.[a][b] ?? 0).toBe(0);
                }
              }
            }
          }
          const cls = classifyFabric(t, capabilities);
          for (const p of cls.pairs) {
            if (!p.gpuDirect) continue;
            const rt = runtime as RuntimeProbe;
            expect(rt.peerAccess[p.a][p.b] && rt.peerAccess[p.b][p.a]).toBe(true);
            if (p.transport === 'pcie') expect(PCIE_P2P_POSSIBLE[name]).toBe(true);
          }
        }
      }
      expect(checked).toBeGreaterThan(0);
      // The H200 fixture does get direct paths (the check above is not vacuous); elsewhere only a
      // runtime variant that itself reports NVLink links can produce one.
      if (name === 'h200-nvlink-2gpu') expect(direct).toBeGreaterThan(0);
      if (name === 'h100-recorded' || name === 'h100-sxm-vm') expect(direct).toBe(0);
    });
  }
});
