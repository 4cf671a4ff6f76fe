import { createSysfsReader, discoverTopology, planFabric, type RuntimeProbe } from '@nerva/transport';

/** Discover the fabric under a sysfs root ('/' or a recorded tree), plan every path, return JSON. */
export function topologyReport(root: string, runtime?: RuntimeProbe): string {
  const topology = discoverTopology(createSysfsReader(root), { runtime });
  const report = planFabric(topology);
  // report.summary: 'fabric: 2 GPU(s) (2x NVIDIA H200), pairs 0-1:NV18, NVLink present, ...'
  // report.degraded: every fallback with its reason
  return JSON.stringify(report, null, 2);
}
