import { describe, expect, it } from 'vitest';
import { discoverTopology, MemorySysfsReader, TopologyParseError, type SysfsReader } from '../src/index.js';
import { fixtureReader, loadFixture } from './helpers.js';

describe('the malformed fixture', () => {
  const t = loadFixture('malformed');

  it('labels garbage as unknown instead of crashing', () => {
    expect(t.source).toBe('sysfs');
    const g = t.gpus.find((x) => x.bdf === '0000:00:02.0');
    expect(g).toBeDefined();
    expect(g?.numaNode).toBe('unknown');
    expect(g?.link.current).toEqual({ speedGTs: 'unknown', gen: 'unknown', width: 16 });
    expect(g?.link.max).toEqual({ speedGTs: 'unknown', gen: 'unknown', width: 'unknown' });
    expect(g?.pcieGBps).toBe('unknown');
    expect(g?.iommuGroup).toBe('unknown');
    expect(g?.iommuType).toBe('unknown');
  });

  it('keeps a device that is a directory, not a link, with an unknown place in the tree', () => {
    const g = t.gpus.find((x) => x.bdf === '0000:00:03.0');
    expect(g?.placement).toEqual({ rootComplex: 'unknown', bridges: [], rootPort: 'unknown', switches: [], sysfsPath: 'unknown' });
    expect(g?.numaNode).toBe(1);
    expect(t.pairs).toEqual([{ a: 0, b: 1, pcie: 'unknown', nvlinkLinks: 'unknown', peerAccessAB: 'unknown', peerAccessBA: 'unknown', label: '?' }]);
  });

  it('keeps a NIC whose link leads outside any PCI root, with its place unknown', () => {
    expect(t.nics).toHaveLength(1);
    expect(t.nics[0]).toMatchObject({ bdf: '0000:00:06.0', numaNode: 'unknown', placement: { rootComplex: 'unknown', sysfsPath: '/sys/devices/platform/foo/0000:00:06.0' } });
  });

  it('records every problem in notes, naming the file and the value', () => {
    const expected = [
      /0000:00:02.0\/numa_node: not a NUMA node number \(read "banana"\)/,
      /0000:00:02.0\/current_link_speed: not a link speed in GT\/s \(read "fast"\)/,
      /0000:00:02.0\/max_link_width: not a lane count \(read "x16"\)/,
      /0000:00:02.0\/iommu_group: link does not name a numbered IOMMU group/,
      /0000:00:03.0 is not a link into \/sys\/devices/,
      /0000:00:04.0: class unknown, not classified/,
      /0000:00:05.0\/class: not a hexadecimal number \(read "zz"\)/,
      /0000:00:06.0 -> .*: not a PCI path ending in the device/,
      /notabdf: not a PCI address, skipped/,
      /node0\/cpulist: not a CPU list \(read "0-3,x"\)/,
      /node1\/distance: not a list of distances \(read "ten twenty"\)/,
    ];
    for (const re of expected) expect(t.notes.some((n) => re.test(n)), String(re)).toBe(true);
    expect(t.numaNodes).toEqual([
      { id: 0, cpulist: 'unknown', cpuCount: 'unknown', distances: [10, 20] },
      { id: 1, cpulist: '4-7', cpuCount: 4, distances: 'unknown' },
    ]);
  });

  it('throws a TopologyParseError naming the file in strict mode', () => {
    let err: unknown;
    try {
      discoverTopology(fixtureReader('malformed'), { strict: true });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(TopologyParseError);
    expect((err as TopologyParseError).code).toBe('TOPOLOGY_PARSE');
    expect((err as TopologyParseError).path).toBe('/sys/bus/pci/devices/0000:00:02.0/numa_node');
    expect((err as TopologyParseError).value).toBe('banana');
  });

  it('the well-formed fixtures pass strict mode', () => {
    for (const name of ['h100-recorded', 'h100-sxm-vm', 'h200-nvlink-2gpu', 'pcie-2gpu-iommu'])
      expect(() => discoverTopology(fixtureReader(name), { strict: true })).not.toThrow();
  });
});

/** A reader over a real fixture where every file reads as the given garbage. */
class GarbageReader implements SysfsReader {
  readonly description = 'garbage';
  constructor(
    private readonly inner: SysfsReader,
    private readonly garbage: (path: string) => string | undefined,
  ) {}
  readFile(path: string) {
    return this.inner.readFile(path) === undefined ? undefined : this.garbage(path);
  }
  readdir(path: string) {
    return this.inner.readdir(path);
  }
  readlink(path: string) {
    return this.inner.readlink(path);
  }
  exists(path: string) {
    return this.inner.exists(path);
  }
}

describe('garbage in every file', () => {
  const samples = ['', '\n', '-', '0x', 'ZZZ', '-7', '99999999999999999999', '\u0000\u0001', '1.5', 'GT/s', 'Unknown', '0-', ' , ', 'null'];
  for (const name of ['h100-sxm-vm', 'h200-nvlink-2gpu', 'pcie-2gpu-iommu']) {
    it(`${name}: never crashes, every GPU field is a value or 'unknown'`, () => {
      for (const g of samples) {
        const t = discoverTopology(new GarbageReader(fixtureReader(name), () => g));
        expect(t.source).toBe('sysfs');
        for (const gpu of t.gpus) {
          for (const v of [gpu.numaNode, gpu.link.max.gen, gpu.link.max.width, gpu.pcieGBps]) expect(v === 'unknown' || typeof v === 'number').toBe(true);
        }
        expect(() => JSON.stringify(t)).not.toThrow();
      }
    });
  }

  it('each file read by its own deterministic garbage also never crashes', () => {
    let seed = 1;
    const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    for (let round = 0; round < 50; round++) {
      const t = discoverTopology(new GarbageReader(fixtureReader('h200-nvlink-2gpu'), () => samples[Math.floor(rnd() * samples.length)]));
      expect(t.source).toBe('sysfs');
    }
  });

  it('an empty device list, missing NUMA and missing modules read as empty, not as errors', () => {
    const t = discoverTopology(new MemorySysfsReader({ files: { '/sys/bus/pci/devices/.keep': '' } }));
    expect(t.source).toBe('sysfs');
    expect(t.gpus).toEqual([]);
    expect(t.numaNodes).toEqual([]);
    expect(t.iommu.state).toBe('off');
    expect(t.peerMemory).toEqual({ modules: [], peerMemory: [], nvidiaDriver: null });
  });
});

describe('IOMMU groups without a type file (kernels before 5.11)', () => {
  const base = {
    '/sys/kernel/iommu_groups/1/devices/.keep': '',
    '/sys/kernel/iommu_groups/2/devices/.keep': '',
    '/sys/bus/pci/devices/.keep': '',
  };
  it('read as passthrough with iommu=pt on the command line', () => {
    const t = discoverTopology(new MemorySysfsReader({ files: { ...base, '/proc/cmdline': 'ro intel_iommu=on iommu=pt' } }));
    expect(t.iommu.state).toBe('passthrough');
  });
  it('read as unknown otherwise', () => {
    const t = discoverTopology(new MemorySysfsReader({ files: { ...base, '/proc/cmdline': 'ro intel_iommu=on' } }));
    expect(t.iommu.state).toBe('unknown');
    expect(t.notes.some((n) => n.includes('treated as possibly translating'))).toBe(true);
  });
  it('mixed types read as mixed', () => {
    const t = discoverTopology(
      new MemorySysfsReader({ files: { ...base, '/sys/kernel/iommu_groups/1/type': 'identity', '/sys/kernel/iommu_groups/2/type': 'DMA' } }),
    );
    expect(t.iommu).toMatchObject({ state: 'mixed', groupTypes: { identity: 1, DMA: 1 } });
  });
});
