import { describe, expect, it } from 'vitest';
import { classifyFabric, discoverTopology, gpuForDevice, MemorySysfsReader, peerDecision, UnknownEndpointError } from '../src/index.js';
import { caps, loadFixture, matrix } from './helpers.js';

describe('classifyFabric', () => {
  it('h200: discrete, the pair claimed GPU-direct over NVLink', () => {
    const c = classifyFabric(loadFixture('h200-nvlink-2gpu'));
    expect(c).toMatchObject({ fabric: 'DiscreteExplicit', hardwareFabric: 'DiscreteExplicit', backendFabric: null, agrees: true, gpuDirectPairs: 1 });
    expect(c.pairs).toEqual([
      { a: 0, b: 1, pcie: 'SYS', gpuDirect: true, transport: 'nvlink', nvlinkLinks: 18, peerAccess: true, reason: 'NVLink (18 links) with runtime peer access' },
    ]);
  });

  it('a backend without peer access (the CUDA backend today) gets no GPU-direct claim, with the reason', () => {
    const c = classifyFabric(loadFixture('h200-nvlink-2gpu'), caps({ peerAccess: false }));
    expect(c.gpuDirectPairs).toBe(0);
    expect(c.pairs[0].reason).toMatch(/capabilities.peerAccess = false/);
  });

  it('pcie-2gpu-iommu: no peer access, so no claim', () => {
    const c = classifyFabric(loadFixture('pcie-2gpu-iommu'), caps());
    expect(c.fabric).toBe('DiscreteExplicit');
    expect(c.pairs[0]).toMatchObject({ gpuDirect: false, pcie: 'NODE', peerAccess: false });
    expect(c.pairs[0].reason).toMatch(/no peer access either way/);
  });

  it('the CPU backend plans as CoherentSharedPhysical and leaves the GPUs alone', () => {
    const c = classifyFabric(loadFixture('h100-sxm-vm'), caps({ deviceKind: 'cpu', deviceCount: 1, fabric: 'CoherentSharedPhysical', peerAccess: false, collectives: false }));
    expect(c).toMatchObject({ fabric: 'CoherentSharedPhysical', hardwareFabric: 'DiscreteExplicit', agrees: true, pairs: [] });
    expect(c.notes[0]).toMatch(/computes on the CPU/);
  });

  it('overrules a backend that claims coherent memory on a discrete GPU', () => {
    const c = classifyFabric(loadFixture('h100-sxm-vm'), caps({ deviceCount: 1, fabric: 'CoherentSharedPhysical' }));
    expect(c).toMatchObject({ fabric: 'DiscreteExplicit', backendFabric: 'CoherentSharedPhysical', agrees: false });
    expect(c.notes).toContain('the backend declares CoherentSharedPhysical but the hardware is DiscreteExplicit: planning with DiscreteExplicit');
  });

  it('accepts managed memory over discrete GPUs, and notes a device-count mismatch', () => {
    const c = classifyFabric(loadFixture('h100-sxm-vm'), caps({ deviceCount: 2, fabric: 'UnifiedVirtualManaged' }));
    expect(c).toMatchObject({ fabric: 'UnifiedVirtualManaged', agrees: true });
    expect(c.notes).toContain('the backend reports 2 device(s), the fabric 1');
  });

  it('recognises Grace Hopper and CXL-only hosts, and falls back to the backend without sysfs', () => {
    const gh = discoverTopology(
      new MemorySysfsReader({
        files: {
          '/sys/devices/pci0009:00/0009:00:00.0/0009:01:00.0/class': '0x030200',
          '/sys/devices/pci0009:00/0009:00:00.0/0009:01:00.0/vendor': '0x10de',
          '/sys/devices/pci0009:00/0009:00:00.0/0009:01:00.0/device': '0x2342',
        },
        links: { '/sys/bus/pci/devices/0009:01:00.0': '../../../devices/pci0009:00/0009:00:00.0/0009:01:00.0' },
      }),
    );
    expect(gh.gpus[0].name).toBe('NVIDIA GH200 480GB');
    expect(classifyFabric(gh).fabric).toBe('CoherentSharedPhysical');
    const cxl = discoverTopology(new MemorySysfsReader({ files: { '/sys/bus/pci/devices/.keep': '', '/sys/bus/cxl/devices/mem0/size': '1' } }));
    expect(cxl.cxlMemoryDevices).toEqual(['mem0']);
    expect(classifyFabric(cxl).fabric).toBe('CxlCoherentFabric');
    const none = discoverTopology(new MemorySysfsReader({ files: {} }));
    expect(classifyFabric(none, caps({ fabric: 'DiscreteExplicit' }))).toMatchObject({ fabric: 'DiscreteExplicit', hardwareFabric: 'unknown' });
    expect(classifyFabric(none).notes[0]).toMatch(/DiscreteExplicit assumed/);
  });

  it('does not infer a GPU-less fabric when sysfs hides the GPUs the backend sees', () => {
    const hidden = discoverTopology(new MemorySysfsReader({ files: { '/sys/bus/pci/devices/.keep': '' } }));
    const c = classifyFabric(hidden, caps({ deviceCount: 1 }));
    expect(c).toMatchObject({ fabric: 'DiscreteExplicit', hardwareFabric: 'unknown', agrees: true });
    expect(c.notes[0]).toBe('sysfs shows no GPU but the cuda backend reports 1: the hardware fabric is unknown');
  });
});

describe('peerDecision', () => {
  it('refuses P2P across root complexes with the IOMMU translating, even when the runtime allows it', () => {
    const t = loadFixture('pcie-2gpu-iommu', { deviceCount: 2, peerAccess: matrix(2, true, false), nvlinkLinks: matrix(2, 0, 0) });
    const d = peerDecision(t, 0, 1);
    expect(d).toMatchObject({ gpuDirect: false, transport: 'none', pcie: 'NODE', peerAccess: true });
    expect(d.reason).toMatch(/across root complexes \(NODE\) while the IOMMU may translate DMA \(translated\)/);
  });

  it('allows PCIe P2P across sockets under IOMMU passthrough, with a warning, when NVLink is down', () => {
    const t = loadFixture('h200-nvlink-2gpu', { deviceCount: 2, peerAccess: matrix(2, true, false), nvlinkLinks: matrix(2, 0, 0), pciBusIds: ['0000:18:00.0', '0000:9a:00.0'] });
    const d = peerDecision(t, 1, 0);
    expect(d).toMatchObject({ gpuDirect: true, transport: 'pcie', pcie: 'SYS', nvlinkLinks: 0 });
    expect(d.reason).toMatch(/SMP interconnect/);
  });

  it('takes an unknown NVLink as PCIe, never as NVLink', () => {
    const t = loadFixture('h200-nvlink-2gpu', { deviceCount: 2, peerAccess: matrix(2, true, false), pciBusIds: ['0000:18:00.0', '0000:9a:00.0'] });
    const d = peerDecision(t, 0, 1);
    expect(d).toMatchObject({ gpuDirect: true, transport: 'pcie', nvlinkLinks: 'unknown' });
    expect(d.reason).toMatch(/NVLink unknown, link taken as PCIe/);
  });

  it('needs peer access both ways, and NVLink alone is not enough', () => {
    const t = loadFixture('h200-nvlink-2gpu', { deviceCount: 2, peerAccess: [[false, true], [false, false]], nvlinkLinks: matrix(2, 18, 0), pciBusIds: ['0000:18:00.0', '0000:9a:00.0'] });
    const d = peerDecision(t, 0, 1);
    expect(d.gpuDirect).toBe(false);
    expect(d.reason).toBe('runtime (runtime) reports no peer access 1 -> 0 although 18 NVLink links are up');
  });

  it('refuses PCIe P2P for devices the topology cannot place, whatever the runtime says', () => {
    const t = loadFixture('h100-sxm-vm', { deviceCount: 2, peerAccess: matrix(2, true, false) });
    const d = peerDecision(t, 0, 1);
    expect(d).toMatchObject({ gpuDirect: false, pcie: 'unknown', peerAccess: true });
    expect(d.reason).toMatch(/not matched to a PCI GPU: the topology cannot confirm PCIe P2P/);
  });

  it('rejects unknown devices and self-pairs', () => {
    const t = loadFixture('h200-nvlink-2gpu');
    expect(() => peerDecision(t, 0, 2)).toThrow(UnknownEndpointError);
    expect(() => peerDecision(t, 1, 1)).toThrow(UnknownEndpointError);
    expect(() => gpuForDevice(t, -1)).toThrow(/2 device/);
    expect(gpuForDevice(t, 1)?.bdf).toBe('0000:9a:00.0');
  });
});
