import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { topologyReport } from '../examples/topology.js';
import type { FabricReport } from '../src/index.js';
import { FIXTURES, fixtureRoot, fixtureRuntime } from './helpers.js';

const here = (p: string) => fileURLToPath(new URL(p, import.meta.url));

describe('examples/topology.ts', () => {
  it('is in the package README verbatim', () => {
    const source = readFileSync(here('../examples/topology.ts'), 'utf8');
    expect(readFileSync(here('../README.md'), 'utf8')).toContain(source.trim());
  });

  for (const name of FIXTURES) {
    it(`runs on the ${name} fixture and prints a report that parses back`, () => {
      const json = topologyReport(fixtureRoot(name), fixtureRuntime(name));
      const report = JSON.parse(json) as FabricReport;
      expect(report.topology.source).toBe('sysfs');
      expect(report.summary).toMatch(/^fabric: /);
      // n devices: n(n-1) GPU pairs plus host -> gpu and gpu -> host for each.
      expect(report.plans).toHaveLength({ 'h100-recorded': 2, 'h100-sxm-vm': 2, 'h200-nvlink-2gpu': 6, 'pcie-2gpu-iommu': 6, malformed: 6 }[name]);
      for (const p of report.plans) expect(p.chosen === null || typeof p.chosen.kind === 'string').toBe(true);
    });
  }

  it('prints the expected summary and fallbacks for the two-GPU hosts', () => {
    const h200 = JSON.parse(topologyReport(fixtureRoot('h200-nvlink-2gpu'), fixtureRuntime('h200-nvlink-2gpu'))) as FabricReport;
    expect(h200.plans.filter((p) => p.from.kind === 'gpu' && p.to.kind === 'gpu').map((p) => p.chosen?.kind)).toEqual(['nvlink-peer', 'nvlink-peer']);
    expect(h200.degraded).toEqual([]);
    const pcie = JSON.parse(topologyReport(fixtureRoot('pcie-2gpu-iommu'), fixtureRuntime('pcie-2gpu-iommu'))) as FabricReport;
    expect(pcie.summary).toBe(
      'fabric: 2 GPU(s) (2x NVIDIA GeForce RTX 4090), pairs 0-1:NODE, NVLink absent, IOMMU translated, 1 NUMA node(s), 1 NIC(s), peer memory: none',
    );
    expect(pcie.degraded).toHaveLength(2);
  });
});
