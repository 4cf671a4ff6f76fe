import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { discoverTopology, FsSysfsReader, MemorySysfsReader, normalizeSysPath, parseSymlinkManifest, TransportArgumentError } from '../src/index.js';
import { fixtureReader } from './helpers.js';

describe('FsSysfsReader over a fixture with a symlink manifest', () => {
  const r = fixtureReader('h200-nvlink-2gpu');

  it('lists link names from the manifest as directory entries', () => {
    const devices = r.readdir('/sys/bus/pci/devices');
    expect(devices).toContain('0000:18:00.0');
    expect(devices).toContain('0000:9b:00.0');
    expect(devices).toHaveLength(18);
    expect(r.readdir('/sys/class/iommu')).toEqual(['dmar0', 'dmar1', 'dmar2', 'dmar3']);
  });

  it('follows links in the middle of a path, and returns targets as stored', () => {
    expect(r.readFile('/sys/bus/pci/devices/0000:18:00.0/device')?.trim()).toBe('0x2335');
    expect(r.readlink('/sys/bus/pci/devices/0000:18:00.0')).toBe('../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0');
    // a link inside a linked directory
    expect(r.readlink('/sys/bus/pci/devices/0000:18:00.0/iommu_group')).toBe('../../../../../../kernel/iommu_groups/24');
    expect(r.readFile('/sys/bus/pci/devices/0000:18:00.0/iommu_group/type')?.trim()).toBe('identity');
    expect(r.readdir('/sys/kernel/iommu_groups/24/devices')).toEqual(['0000:18:00.0']);
    expect(r.readFile('/sys/kernel/iommu_groups/24/devices/0000:18:00.0/vendor')?.trim()).toBe('0x10de');
  });

  it('reads missing paths as undefined or false', () => {
    expect(r.readFile('/sys/bus/pci/devices/0000:18:00.0/nope')).toBeUndefined();
    expect(r.readdir('/sys/nope')).toBeUndefined();
    expect(r.readlink('/sys/bus/pci/devices/0000:18:00.0/vendor')).toBeUndefined();
    expect(r.readlink('/nope/nope')).toBeUndefined();
    expect(r.exists('/sys/nope')).toBe(false);
    expect(r.exists('/sys/bus/pci/devices/0000:18:00.0')).toBe(true);
    expect(r.exists('/sys/bus/pci/devices')).toBe(true);
    expect(r.exists('/sys/module/nvidia_peermem')).toBe(true);
    expect(r.readdir('/')).not.toContain('symlinks.txt');
  });
});

describe('FsSysfsReader over real symbolic links', () => {
  const root = mkdtempSync(join(tmpdir(), 'nerva-sysfs-'));
  afterAll(() => rmSync(root, { recursive: true, force: true }));
  const dev = join(root, 'sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0');
  mkdirSync(dev, { recursive: true });
  mkdirSync(join(root, 'sys/devices/pci0000:00/0000:00:01.0'), { recursive: true });
  writeFileSync(join(root, 'sys/devices/pci0000:00/0000:00:01.0/class'), '0x060400\n');
  for (const [k, v] of Object.entries({ class: '0x030200', vendor: '0x10de', device: '0x2330', numa_node: '0', max_link_speed: '32.0 GT/s PCIe', max_link_width: '16' }))
    writeFileSync(join(dev, k), `${v}\n`);
  mkdirSync(join(root, 'sys/bus/pci/devices'), { recursive: true });
  symlinkSync('../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0', join(root, 'sys/bus/pci/devices/0000:01:00.0'));
  symlinkSync('../../../devices/pci0000:00/0000:00:01.0', join(root, 'sys/bus/pci/devices/0000:00:01.0'));
  mkdirSync(join(root, 'sys/devices/system/node/node0'), { recursive: true });
  writeFileSync(join(root, 'sys/devices/system/node/node0/cpulist'), '0-7\n');

  it('reads them like the kernel tree and discovers through them', () => {
    const r = new FsSysfsReader(root);
    expect(r.readlink('/sys/bus/pci/devices/0000:01:00.0')).toBe('../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0');
    expect(r.readFile('/sys/bus/pci/devices/0000:01:00.0/device')).toBe('0x2330\n');
    const t = discoverTopology(r);
    expect(t.gpus).toHaveLength(1);
    expect(t.gpus[0]).toMatchObject({ bdf: '0000:01:00.0', name: 'NVIDIA H100 80GB HBM3', nameSource: 'pci-id', numaNode: 0, pcieGBps: 63 });
    expect(t.gpus[0].placement.rootPort).toBe('0000:00:01.0');
  });
});

describe('manifest parsing', () => {
  it('accepts comments, blank lines, leading slashes, absolute targets', () => {
    const m = parseSymlinkManifest('# hello\n\n/sys/a -> ../b\nsys/c -> /sys/d\n');
    expect([...m]).toEqual([
      ['/sys/a', '../b'],
      ['/sys/c', '/sys/d'],
    ]);
  });
  it('rejects malformed lines with the line number', () => {
    expect(() => parseSymlinkManifest('sys/a ../b')).toThrow(/line 1/);
    expect(() => parseSymlinkManifest('\nsys/a -> ')).toThrow(TransportArgumentError);
  });
  it('normalizes paths', () => {
    expect(normalizeSysPath('sys/bus/')).toBe('/sys/bus');
    expect(normalizeSysPath('/sys/./bus/../class')).toBe('/sys/class');
    expect(() => normalizeSysPath('')).toThrow(TransportArgumentError);
  });
});

describe('MemorySysfsReader', () => {
  const r = new MemorySysfsReader({
    files: { '/sys/devices/x/y/file': 'v\n', '/proc/cmdline': 'ro' },
    links: { '/sys/bus/a': '../devices/x', '/sys/loop1': 'loop2', '/sys/loop2': 'loop1', '/sys/abs': '/sys/devices/x' },
  });
  it('has implicit directories and follows relative and absolute links', () => {
    expect(r.readdir('/sys')).toEqual(['abs', 'bus', 'devices', 'loop1', 'loop2']);
    expect(r.readFile('/sys/bus/a/y/file')).toBe('v\n');
    expect(r.readFile('/sys/abs/y/file')).toBe('v\n');
    expect(r.readdir('/sys/bus/a')).toEqual(['y']);
    expect(r.readlink('/sys/bus/a')).toBe('../devices/x');
    expect(r.exists('/sys/bus/a/y')).toBe(true);
    expect(r.exists('/sys/bus/b')).toBe(false);
  });
  it('reads a link cycle as missing instead of looping', () => {
    expect(r.readFile('/sys/loop1/x')).toBeUndefined();
    expect(r.exists('/sys/loop1')).toBe(false);
  });
});
