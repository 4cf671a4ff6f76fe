import type { BackendCapabilities } from '@nerva/core';
import { FsSysfsReader, MemorySysfsReader, type SysfsReader } from '@nerva/transport';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { DEFAULT_CONFIG } from '../src/config.js';
import {
  CAPABILITIES_PROBE_SOURCE,
  discoverFabricTopology,
  reportedCapabilities,
  runtimeProbeFromCapabilities,
  unknownFabricTopology,
  type FabricTopologyJson,
} from '../src/fabric-topology.js';
import { startServer, type RunningServer } from '../src/server.js';

/** A recorded sysfs tree of @nerva/transport's fixtures. */
const fixture = (name: string): SysfsReader => new FsSysfsReader(fileURLToPath(new URL(`../../transport/test/fixtures/${name}`, import.meta.url)));

function cudaCaps(over: Partial<BackendCapabilities> = {}): BackendCapabilities {
  return {
    deviceKind: 'cuda',
    deviceName: 'NVIDIA H100 80GB HBM3',
    deviceCount: 1,
    memory: { vram: 80e9, pinned: 1e9 },
    computeTier: 'vram',
    dtypes: ['f32', 'bf16'],
    weightDtype: 'bf16',
    precision: { compute: 'f32', relTol: 1e-3 },
    graphCapture: true,
    peerAccess: false,
    collectives: false,
    fabric: 'DiscreteExplicit',
    ops: [],
    ...over,
  };
}

/** Every key of a JSON value, at any depth. */
function keysOf(v: unknown, out: string[] = []): string[] {
  if (Array.isArray(v)) for (const x of v) keysOf(x, out);
  else if (typeof v === 'object' && v !== null)
    for (const [k, x] of Object.entries(v)) {
      out.push(k);
      keysOf(x, out);
    }
  return out;
}

const H100_SUMMARY = 'fabric: 1 GPU(s) (1x NVIDIA H100 80GB HBM3), NVLink unknown, IOMMU off, 1 NUMA node(s), 1 NIC(s), peer memory: none';

describe('runtimeProbeFromCapabilities', () => {
  it('builds a probe of deviceCount devices with the backend peer access off the diagonal, no NVLink, no bus ids', () => {
    expect(runtimeProbeFromCapabilities(cudaCaps({ deviceCount: 2, peerAccess: true }))).toEqual({
      deviceCount: 2,
      peerAccess: [
        [false, true],
        [true, false],
      ],
      source: CAPABILITIES_PROBE_SOURCE,
    });
    expect(runtimeProbeFromCapabilities(cudaCaps())).toEqual({ deviceCount: 1, peerAccess: [[false]], source: CAPABILITIES_PROBE_SOURCE });
  });

  it('gives none for the CPU backend or a malformed count', () => {
    expect(runtimeProbeFromCapabilities(cudaCaps({ deviceKind: 'cpu' }))).toBeUndefined();
    expect(runtimeProbeFromCapabilities(cudaCaps({ deviceCount: -1 }))).toBeUndefined();
    expect(runtimeProbeFromCapabilities(cudaCaps({ deviceCount: 1.5 }))).toBeUndefined();
  });
});

describe('reportedCapabilities', () => {
  it('reads capabilities off the engine info only where it carries them', () => {
    expect(reportedCapabilities({ deviceKind: 'cuda', backendName: 'cuda' })).toBeUndefined();
    expect(reportedCapabilities({ deviceKind: 'cuda', capabilities: { deviceKind: 'cuda' } })).toBeUndefined();
    const caps = cudaCaps();
    expect(reportedCapabilities({ deviceKind: 'cuda', capabilities: caps })).toBe(caps);
  });
});

describe('discoverFabricTopology on the recorded H100 machine', () => {
  it('serves the GPU, its link, NUMA node and IOMMU state, with the probe from the CUDA backend capabilities', () => {
    const { line, json, topology } = discoverFabricTopology({ reader: fixture('h100-recorded'), capabilities: cudaCaps() });
    expect(line).toBe(H100_SUMMARY);
    expect(topology?.runtime?.mapping).toBe('assumed-pci-order');
    expect(json).toMatchObject({
      source: 'sysfs',
      summary: H100_SUMMARY,
      device_kind: 'cuda',
      runtime_probe: CAPABILITIES_PROBE_SOURCE,
      nvlink: 'unknown',
      iommu: 'off',
      numa_nodes: 1,
      nics: 1,
      rdma_nics: 0,
      peer_memory: [],
      nvidia_driver: '580.159.04',
      degraded: [],
    });
    expect(json.gpus).toEqual([
      {
        index: 0,
        runtime_index: 0,
        bdf: '0000:00:06.0',
        name: 'NVIDIA H100 80GB HBM3',
        numa_node: 0,
        pcie_gen: 5,
        pcie_width: 16,
        pcie_gbps: 63,
        root_complex: 'pci0000:00',
        root_port: null,
        iommu_group: null,
        driver: 'nvidia',
      },
    ]);
    expect(json.classification).toEqual({
      fabric: 'DiscreteExplicit',
      hardware_fabric: 'DiscreteExplicit',
      backend_fabric: 'DiscreteExplicit',
      agrees: true,
      collectives: false,
      gpu_direct_pairs: 0,
      pairs: [],
      notes: [],
    });
    expect(json.notes).toContain('runtime probe from the cuda backend\'s capabilities: 1 device(s), peer access off; NVLink not probed');
    expect(json.notes.some((n) => n.includes('numa_node is -1'))).toBe(true);
  });

  it('is snake case throughout and JSON-serialisable as is', () => {
    const { json } = discoverFabricTopology({ reader: fixture('h200-nvlink-2gpu'), capabilities: cudaCaps({ deviceCount: 2 }) });
    expect(JSON.parse(JSON.stringify(json))).toEqual(json);
    for (const k of keysOf(json)) expect(k, k).toMatch(/^[a-z0-9_]+$/);
  });

  it('without the backend capabilities: no probe, classification from the hardware, noted', () => {
    const { json } = discoverFabricTopology({ reader: fixture('h100-recorded'), deviceKind: 'cuda' });
    expect(json.runtime_probe).toBeNull();
    expect(json.gpus[0].runtime_index).toBeNull();
    expect(json.classification?.backend_fabric).toBeNull();
    expect(json.notes.some((n) => n.startsWith('the engine does not report its backend\'s capabilities'))).toBe(true);
  });

  it('on the CPU backend plans no device paths', () => {
    const { json } = discoverFabricTopology({ reader: fixture('h100-recorded'), deviceKind: 'cpu' });
    expect(json).toMatchObject({ device_kind: 'cpu', runtime_probe: null, degraded: [] });
    expect(json.classification?.fabric).toBe('DiscreteExplicit');
    expect(json.notes).toContain('the backend computes on the CPU: no device transfer paths planned');
    const withCaps = discoverFabricTopology({ reader: fixture('h100-recorded'), capabilities: cudaCaps({ deviceKind: 'cpu', fabric: 'CoherentSharedPhysical' }) });
    expect(withCaps.json.classification).toMatchObject({ fabric: 'CoherentSharedPhysical', pairs: [] });
    expect(withCaps.json.degraded).toEqual([]);
  });
});

describe('discoverFabricTopology elsewhere', () => {
  it('NVLink hardware without an NVLink probe: unknown, and no GPU-direct claim without backend peer access', () => {
    const { json } = discoverFabricTopology({ reader: fixture('h200-nvlink-2gpu'), capabilities: cudaCaps({ deviceCount: 2 }) });
    expect(json.nvlink).toBe('unknown');
    expect(json.gpus.map((g) => [g.bdf, g.runtime_index])).toEqual([
      ['0000:18:00.0', 0],
      ['0000:9a:00.0', 1],
    ]);
    expect(json.classification?.gpu_direct_pairs).toBe(0);
    expect(json.classification?.pairs[0]).toMatchObject({ a: 0, b: 1, gpu_direct: false, transport: 'none', pcie: 'SYS', nvlink_links: 'unknown', peer_access: false });
    expect(json.degraded).toHaveLength(2);
    for (const d of json.degraded) expect(d).toMatch(/^gpu[01] -> gpu[01]: pinned-bounce \(degraded: /);
  });

  it('an unreadable sysfs (no PCI tree) says unknown with notes', () => {
    const { line, json } = discoverFabricTopology({ reader: new MemorySysfsReader({ files: {} }), deviceKind: 'cpu' });
    expect(line).toBe('fabric: unknown (no sysfs PCI tree)');
    expect(json).toMatchObject({ source: 'unavailable', gpus: [], nvlink: 'unknown', iommu: 'unknown', numa_nodes: 0, degraded: [] });
    expect(json.classification?.hardware_fabric).toBe('unknown');
    expect(json.notes[0]).toMatch(/sys\/bus\/pci\/devices is missing/);
  });

  it('a reader that throws does not fail: the object says unknown, with the error', () => {
    const broken: SysfsReader = {
      description: 'broken',
      readFile: () => {
        throw new Error('EIO on /sys');
      },
      readdir: () => {
        throw new Error('EIO on /sys');
      },
      readlink: () => undefined,
      exists: () => false,
    };
    const { line, json } = discoverFabricTopology({ reader: broken, capabilities: cudaCaps() });
    expect(line).toBe('fabric: unknown (fabric discovery failed: EIO on /sys)');
    expect(json).toEqual<FabricTopologyJson>({ ...unknownFabricTopology('fabric discovery failed: EIO on /sys', 'cuda') });
    expect(json.classification).toBeNull();
  });
});

describe('nerva serve start', () => {
  let server: RunningServer | undefined;
  afterAll(async () => {
    await server?.shutdown();
  });

  it('logs the fabric line once and serves it in GET /v1/memory', async () => {
    const lines: string[] = [];
    server = await startServer({ ...DEFAULT_CONFIG, port: 0, backend: 'cpu' }, { log: (l) => lines.push(l), sysfs: fixture('h100-recorded') });
    await server.ready;
    expect(lines.filter((l) => l.startsWith('nerva: fabric: '))).toEqual([`nerva: ${H100_SUMMARY}`]);
    const m = (await (await fetch(`${server.url}/v1/memory`)).json()) as { fabric_topology: FabricTopologyJson };
    expect(m.fabric_topology).toEqual(server.state.fabricTopology);
    expect(m.fabric_topology).toMatchObject({ source: 'sysfs', summary: H100_SUMMARY, device_kind: 'cpu', runtime_probe: null, degraded: [] });
    expect(m.fabric_topology.gpus[0]).toMatchObject({ bdf: '0000:00:06.0', pcie_gen: 5, pcie_width: 16, numa_node: 0, iommu_group: null, root_port: null });
  });
});
