import { describe, expect, it } from 'vitest';
import {
  describeTopology,
  discoverTopology,
  MemorySysfsReader,
  normalizeBdf,
  parseCpuList,
  parseLinkSpeed,
  pcieRelation,
  TransportArgumentError,
  createSysfsReader,
  type PciPlacement,
} from '../src/index.js';
import { fixtureReader, fixtureRuntime, loadFixture, matrix } from './helpers.js';

describe('h100-sxm-vm fixture (one H100 SXM in a KVM guest)', () => {
  const t = loadFixture('h100-sxm-vm');

  it('finds the GPU with its name, link, placement and NUMA node', () => {
    expect(t.source).toBe('sysfs');
    expect(t.gpus).toHaveLength(1);
    const g = t.gpus[0];
    expect(g).toMatchObject({
      index: 0,
      bdf: '0000:01:00.0',
      vendor: 'nvidia',
      vendorId: 0x10de,
      deviceId: 0x2330,
      classCode: 0x030200,
      name: 'NVIDIA H100 80GB HBM3',
      nameSource: 'driver',
      numaNode: 0,
      driver: 'nvidia',
      iommuGroup: null,
      iommuType: null,
      runtimeIndex: 0,
    });
    expect(g.link.max).toEqual({ speedGTs: 32, gen: 5, width: 16 });
    expect(g.placement).toEqual({
      rootComplex: 'pci0000:00',
      bridges: ['0000:00:02.0'],
      rootPort: '0000:00:02.0',
      switches: [],
      sysfsPath: '/sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0',
    });
    expect(g.pcieGBps).toBeCloseTo(63, 0);
  });

  it('infers NUMA node 0 from the single node and says so', () => {
    expect(t.numaNodes).toEqual([{ id: 0, cpulist: '0-15', cpuCount: 16, distances: [10] }]);
    expect(t.notes.some((n) => /numa_node is -1 .* one NUMA node/.test(n))).toBe(true);
  });

  it('does not count the QEMU VGA as a GPU; finds the virtio NIC and its interface', () => {
    expect(t.otherDisplays).toEqual(['0000:00:01.0']);
    expect(t.nics).toHaveLength(1);
    expect(t.nics[0]).toMatchObject({ bdf: '0000:02:00.0', kind: 'ethernet', netdevs: ['enp2s0'], rdma: false, rdmaDevices: [] });
  });

  it('reports IOMMU off, no peer memory, the driver version, NVLink absent per the probe', () => {
    expect(t.iommu).toEqual({ state: 'off', units: [], groupCount: 0, groupTypes: {}, cmdline: [] });
    expect(t.peerMemory).toEqual({ modules: ['nvidia', 'nvidia_uvm'], peerMemory: [], nvidiaDriver: '550.90.07' });
    expect(t.nvlink).toEqual({ state: 'absent', source: 'runtime', nvswitches: [] });
    expect(t.pairs).toEqual([]);
    expect(t.runtime).toMatchObject({ mapping: 'pci-bus-id', devices: [0], mappedPinned: true, gpuDirectRdma: false });
  });

  it('is JSON-serialisable as is', () => {
    expect(JSON.parse(JSON.stringify(t))).toEqual(t);
  });
});

describe('h100-recorded fixture (the lent H100 machine, recorded 2026-11-23)', () => {
  const t = loadFixture('h100-recorded');

  // What the recording shows (its nvidia-smi output is quoted in fixtures/README.md):
  // GPU0 at 00000000:00:06.0, NVIDIA H100 80GB HBM3, driver 580.159.04, CPU affinity 0-15, NUMA 0,
  // no NVLink links, no peer to test.
  it('finds the GPU on the root bus itself: no root port, no bridge (unlike the modelled q35 guest)', () => {
    expect(t.source).toBe('sysfs');
    expect(t.gpus).toHaveLength(1);
    const g = t.gpus[0];
    expect(g).toMatchObject({
      index: 0,
      bdf: '0000:00:06.0',
      vendor: 'nvidia',
      vendorId: 0x10de,
      deviceId: 0x2330,
      classCode: 0x030200,
      name: 'NVIDIA H100 80GB HBM3',
      nameSource: 'driver',
      driver: 'nvidia',
      runtimeIndex: 0,
    });
    expect(g.placement).toEqual({
      rootComplex: 'pci0000:00',
      bridges: [],
      rootPort: null,
      switches: [],
      sysfsPath: '/sys/devices/pci0000:00/0000:00:06.0',
    });
  });

  it('reads the Gen5 x16 link (trained up at recording time) and estimates PCIe bandwidth from the GPU alone', () => {
    const g = t.gpus[0];
    expect(g.link).toEqual({ current: { speedGTs: 32, gen: 5, width: 16 }, max: { speedGTs: 32, gen: 5, width: 16 } });
    expect(g.pcieGBps).toBeCloseTo(63, 0);
  });

  it('places numa_node -1 on the only node, as nvidia-smi does (NUMA affinity 0, CPUs 0-15)', () => {
    expect(t.gpus[0].numaNode).toBe(0);
    expect(t.numaNodes).toEqual([{ id: 0, cpulist: '0-15', cpuCount: 16, distances: [10] }]);
    expect(t.notes).toEqual(['numa_node is -1 or missing for 2 PCI functions; the machine has one NUMA node, so they are placed on node 0']);
  });

  it('reports IOMMU off: no groups, no units, no IOMMU arguments', () => {
    expect(t.gpus[0].iommuGroup).toBeNull();
    expect(t.gpus[0].iommuType).toBeNull();
    expect(t.iommu).toEqual({ state: 'off', units: [], groupCount: 0, groupTypes: {}, cmdline: [] });
  });

  it('lists nvidia, nvidia_uvm and the built-in ib_core, mlx5_core; no peer-memory module', () => {
    // ib_core, mlx5_core and mlx5_ib are built into this kernel: /sys/module entries without initstate.
    expect(t.peerMemory).toEqual({ modules: ['nvidia', 'nvidia_uvm', 'ib_core', 'mlx5_core'], peerMemory: [], nvidiaDriver: '580.159.04' });
  });

  it('finds the virtio NIC on the root bus (PHB from the GPU), no RDMA, no other display', () => {
    expect(t.nics).toHaveLength(1);
    expect(t.nics[0]).toMatchObject({ bdf: '0000:00:03.0', vendorId: 0x1af4, kind: 'ethernet', netdevs: ['eth0'], rdma: false, rdmaDevices: [], driver: 'virtio-pci' });
    expect(t.nics[0].link.max).toEqual({ speedGTs: 'unknown', gen: 'unknown', width: 'unknown' });
    expect(t.gpuNics).toEqual([{ gpu: 0, nic: '0000:00:03.0', relation: 'PHB' }]);
    expect(t.otherDisplays).toEqual([]);
    expect(t.nvlink).toEqual({ state: 'absent', source: 'runtime', nvswitches: [] });
    expect(t.pairs).toEqual([]);
    expect(t.cxlMemoryDevices).toEqual([]);
  });

  it('maps the runtime device by its CUDA bus id; without a probe NVLink stays unknown', () => {
    expect(t.runtime).toMatchObject({ mapping: 'pci-bus-id', devices: [0], nvlinkLinks: [[0]], mappedPinned: 'unknown', gpuDirectRdma: 'unknown' });
    const bare = loadFixture('h100-recorded', null);
    expect(bare.runtime).toBeNull();
    expect(bare.gpus[0].runtimeIndex).toBeNull();
    expect(bare.nvlink.state).toBe('unknown');
    expect(describeTopology(t)).toBe('fabric: 1 GPU(s) (1x NVIDIA H100 80GB HBM3), NVLink absent, IOMMU off, 1 NUMA node(s), 1 NIC(s), peer memory: none');
    expect(describeTopology(bare)).toBe('fabric: 1 GPU(s) (1x NVIDIA H100 80GB HBM3), NVLink unknown, IOMMU off, 1 NUMA node(s), 1 NIC(s), peer memory: none');
  });

  it('is JSON-serialisable as is', () => {
    expect(JSON.parse(JSON.stringify(t))).toEqual(t);
  });
});

describe('h200-nvlink-2gpu fixture (two H200 SXM, one per socket, NVLink)', () => {
  const t = loadFixture('h200-nvlink-2gpu');

  it('places each GPU behind its own PCIe switch on its own socket', () => {
    expect(t.gpus.map((g) => [g.bdf, g.name, g.numaNode, g.placement.rootComplex, g.placement.rootPort, g.placement.switches])).toEqual([
      ['0000:18:00.0', 'NVIDIA H200', 0, 'pci0000:15', '0000:15:01.0', ['0000:16:00.0']],
      ['0000:9a:00.0', 'NVIDIA H200', 1, 'pci0000:97', '0000:97:01.0', ['0000:98:00.0']],
    ]);
    expect(t.gpus.map((g) => g.iommuType)).toEqual(['identity', 'identity']);
    expect(t.gpus.map((g) => g.iommuGroup)).toEqual([24, 124]);
  });

  it('relates the pair as SYS over PCIe and NV18 over NVLink', () => {
    expect(t.pairs).toEqual([{ a: 0, b: 1, pcie: 'SYS', nvlinkLinks: 18, peerAccessAB: true, peerAccessBA: true, label: 'NV18' }]);
    expect(t.nvlink.state).toBe('present');
  });

  it('pairs each GPU with the ConnectX-7 on its switch (PIX) and the other one across sockets (SYS)', () => {
    expect(t.nics.map((n) => [n.bdf, n.kind, n.rdma, n.rdmaDevices, n.netdevs, n.numaNode])).toEqual([
      ['0000:19:00.0', 'infiniband', true, ['mlx5_0'], ['ibp25s0'], 0],
      ['0000:9b:00.0', 'infiniband', true, ['mlx5_1'], ['ibp155s0'], 1],
    ]);
    expect(t.gpuNics).toEqual([
      { gpu: 0, nic: '0000:19:00.0', relation: 'PIX' },
      { gpu: 0, nic: '0000:9b:00.0', relation: 'SYS' },
      { gpu: 1, nic: '0000:19:00.0', relation: 'SYS' },
      { gpu: 1, nic: '0000:9b:00.0', relation: 'PIX' },
    ]);
  });

  it('reads two NUMA nodes, IOMMU passthrough, nvidia_peermem', () => {
    expect(t.numaNodes).toEqual([
      { id: 0, cpulist: '0-47,96-143', cpuCount: 96, distances: [10, 21] },
      { id: 1, cpulist: '48-95,144-191', cpuCount: 96, distances: [21, 10] },
    ]);
    expect(t.iommu).toMatchObject({ state: 'passthrough', units: ['dmar0', 'dmar1', 'dmar2', 'dmar3'], groupCount: 14, cmdline: ['intel_iommu=on', 'iommu=pt'] });
    expect(t.peerMemory.peerMemory).toEqual(['nvidia_peermem']);
    expect(t.peerMemory.modules).toEqual(['nvidia', 'nvidia_uvm', 'nvidia_peermem', 'ib_core', 'ib_uverbs', 'mlx5_core']);
    expect(t.otherDisplays).toEqual(['0000:03:00.0']);
    expect(describeTopology(t)).toBe(
      'fabric: 2 GPU(s) (2x NVIDIA H200), pairs 0-1:NV18, NVLink present, IOMMU passthrough, 2 NUMA node(s), 2 NIC(s) (2 RDMA), peer memory: nvidia_peermem',
    );
  });

  it('maps runtime ordinals by PCI bus id, also when the runtime sees a subset (a container)', () => {
    expect(t.runtime?.devices).toEqual([0, 1]);
    const sub = loadFixture('h200-nvlink-2gpu', { deviceCount: 1, peerAccess: [[false]], pciBusIds: ['00000000:9A:00.0'] });
    expect(sub.runtime?.devices).toEqual([1]);
    expect(sub.gpus.map((g) => g.runtimeIndex)).toEqual([null, 0]);
    expect(sub.pairs[0]).toMatchObject({ peerAccessAB: 'unknown', nvlinkLinks: 'unknown', label: 'SYS' });
  });

  it('leaves NVLink unknown without a runtime probe, even with a hint', () => {
    const bare = loadFixture('h200-nvlink-2gpu', null);
    expect(bare.nvlink.state).toBe('unknown');
    expect(bare.pairs[0]).toMatchObject({ nvlinkLinks: 'unknown', peerAccessAB: 'unknown', peerAccessBA: 'unknown', label: 'SYS' });
    expect(bare.notes).toContain('no runtime probe of NVLink: NVLink unknown, not assumed');
  });
});

describe('pcie-2gpu-iommu fixture (two RTX 4090 on different root complexes, IOMMU on)', () => {
  const t = loadFixture('pcie-2gpu-iommu');

  it('names the GPUs from the PCI id table and estimates Gen4 x16 from the max link, not the idle link', () => {
    expect(t.gpus.map((g) => [g.bdf, g.name, g.nameSource, g.placement.rootComplex, g.numaNode])).toEqual([
      ['0000:01:00.0', 'NVIDIA GeForce RTX 4090', 'pci-id', 'pci0000:00', 0],
      ['0000:41:00.0', 'NVIDIA GeForce RTX 4090', 'pci-id', 'pci0000:40', 0],
    ]);
    expect(t.gpus[0].link.current).toEqual({ speedGTs: 2.5, gen: 1, width: 16 });
    expect(t.gpus[0].link.max).toEqual({ speedGTs: 16, gen: 4, width: 16 });
    expect(t.gpus[0].pcieGBps).toBeCloseTo(31.5, 1);
  });

  it('relates them NODE (same NUMA node, different root complexes), with no NVLink and no peer access', () => {
    expect(t.pairs).toEqual([{ a: 0, b: 1, pcie: 'NODE', nvlinkLinks: 0, peerAccessAB: false, peerAccessBA: false, label: 'NODE' }]);
    expect(t.nvlink.state).toBe('absent');
  });

  it('reads the IOMMU as translating, with groups and AMD units', () => {
    expect(t.iommu).toEqual({ state: 'translated', units: ['ivhd0', 'ivhd1'], groupCount: 8, groupTypes: { 'DMA-FQ': 8 }, cmdline: ['amd_iommu=on'] });
    expect(t.gpus.map((g) => [g.iommuGroup, g.iommuType])).toEqual([
      [14, 'DMA-FQ'],
      [32, 'DMA-FQ'],
    ]);
    expect(t.peerMemory.peerMemory).toEqual([]);
  });

  it('assumes PCI bus order without bus ids, and says so', () => {
    expect(t.runtime?.mapping).toBe('assumed-pci-order');
    expect(t.notes.some((n) => n.includes('assumed to follow PCI bus order'))).toBe(true);
  });

  it('ignores the GPUs\' audio functions and finds the onboard NIC', () => {
    expect(t.nics.map((n) => [n.bdf, n.kind, n.netdevs])).toEqual([['0000:02:00.0', 'ethernet', ['enp2s0']]]);
    expect(t.gpuNics.map((x) => x.relation)).toEqual(['PHB', 'NODE']);
  });
});

describe('pcieRelation', () => {
  const at = (rootComplex: string, ...bridges: string[]): PciPlacement => ({
    rootComplex,
    bridges,
    rootPort: bridges[0] ?? null,
    switches: [],
    sysfsPath: 'x',
  });
  it('follows nvidia-smi topo', () => {
    expect(pcieRelation(at('pci0000:00', 'r', 'u', 'd0'), 0, at('pci0000:00', 'r', 'u', 'd1'), 0)).toBe('PIX');
    expect(pcieRelation(at('pci0000:00', 'r', 'u', 'd0', 'u2', 'e0'), 0, at('pci0000:00', 'r', 'u', 'd1', 'u3', 'e1'), 0)).toBe('PXB');
    expect(pcieRelation(at('pci0000:00', 'r0'), 0, at('pci0000:00', 'r1'), 0)).toBe('PHB');
    expect(pcieRelation(at('pci0000:00'), 0, at('pci0000:00'), 0)).toBe('PHB');
    expect(pcieRelation(at('pci0000:00', 'r0'), 0, at('pci0000:40', 'r1'), 0)).toBe('NODE');
    expect(pcieRelation(at('pci0000:00', 'r0'), 0, at('pci0000:80', 'r1'), 1)).toBe('SYS');
    expect(pcieRelation(at('pci0000:00', 'r0'), 'unknown', at('pci0000:80', 'r1'), 1)).toBe('unknown');
    expect(pcieRelation({ ...at('x'), rootComplex: 'unknown' }, 0, at('pci0000:80'), 0)).toBe('unknown');
  });
});

describe('parsers', () => {
  it('parse cpulists, link speeds and bus ids', () => {
    expect(parseCpuList('0-15,32-47')).toBe(32);
    expect(parseCpuList('3')).toBe(1);
    expect(parseCpuList('')).toBe(0);
    expect(parseCpuList('0-3,x')).toBeUndefined();
    expect(parseCpuList('5-2')).toBeUndefined();
    expect(parseLinkSpeed('32.0 GT/s PCIe')).toBe(32);
    expect(parseLinkSpeed('8 GT/s')).toBe(8);
    expect(parseLinkSpeed('2.5 GT/s PCIe\n')).toBe(2.5);
    expect(parseLinkSpeed('Unknown')).toBe('unknown');
    expect(parseLinkSpeed('Unknown speed')).toBe('unknown');
    expect(parseLinkSpeed('fast')).toBeUndefined();
    expect(normalizeBdf('00000000:9A:00.0')).toBe('0000:9a:00.0');
    expect(normalizeBdf('0000:01:00.0')).toBe('0000:01:00.0');
    expect(normalizeBdf('10000:e1:00.0')).toBe('10000:e1:00.0');
    expect(normalizeBdf('01:00.0')).toBeUndefined();
  });
});

describe('runtime probes', () => {
  it('are validated', () => {
    const r = fixtureReader('pcie-2gpu-iommu');
    expect(() => discoverTopology(r, { runtime: { deviceCount: -1, peerAccess: [] } })).toThrow(TransportArgumentError);
    expect(() => discoverTopology(r, { runtime: { deviceCount: 2, peerAccess: [[false]] } })).toThrow(/2x2 matrix/);
    expect(() => discoverTopology(r, { runtime: { deviceCount: 2, peerAccess: matrix(2, 1 as unknown as boolean, false) } })).toThrow(/invalid entry/);
    expect(() => discoverTopology(r, { runtime: { deviceCount: 2, peerAccess: matrix(2, false, false), nvlinkLinks: matrix(2, -1, 0) } })).toThrow(/invalid entry/);
    expect(() => discoverTopology(r, { runtime: { deviceCount: 2, peerAccess: matrix(2, false, false), pciBusIds: ['x', 'y'] } })).toThrow(/not a PCI bus id/);
    expect(() => discoverTopology(r, { runtime: { deviceCount: 1, peerAccess: [[false]], pciBusIds: [] } })).toThrow(/must list 1/);
  });

  it('that cannot be matched leave devices unmapped, with a note', () => {
    const t = discoverTopology(fixtureReader('pcie-2gpu-iommu'), { runtime: { deviceCount: 3, peerAccess: matrix(3, true, false) } });
    expect(t.runtime).toMatchObject({ mapping: 'unmapped', devices: [null, null, null] });
    expect(t.pairs.every((p) => p.peerAccessAB === 'unknown')).toBe(true);
    const odd = discoverTopology(fixtureReader('pcie-2gpu-iommu'), { runtime: { deviceCount: 1, peerAccess: [[false]], pciBusIds: ['0000:aa:00.0'] } });
    expect(odd.runtime?.devices).toEqual([null]);
    expect(odd.notes.some((n) => n.includes('0000:aa:00.0') && n.includes('not a GPU of the sysfs tree'))).toBe(true);
  });

  it('runtime.json fixtures are well formed', () => {
    for (const name of ['h100-recorded', 'h100-sxm-vm', 'h200-nvlink-2gpu', 'pcie-2gpu-iommu']) expect(fixtureRuntime(name)?.source).toBe('fixture');
  });
});

describe('a tree without sysfs', () => {
  it('is unavailable, not an error', () => {
    const t = discoverTopology(new MemorySysfsReader({ files: {} }));
    expect(t.source).toBe('unavailable');
    expect(t.gpus).toEqual([]);
    expect(t.notes[0]).toMatch(/sys\/bus\/pci\/devices is missing/);
    expect(describeTopology(t)).toBe('fabric: unknown (no sysfs PCI tree)');
  });
});

describe('this machine', () => {
  it('discovers without throwing, whatever /sys holds', () => {
    const t = discoverTopology(createSysfsReader('/'));
    expect(['sysfs', 'unavailable']).toContain(t.source);
    expect(JSON.parse(JSON.stringify(t))).toEqual(t);
    expect(typeof describeTopology(t)).toBe('string');
  });
});
