/**
 * The order of devices along a same-node pipeline, from the fabric topology. (The pipeline itself,
 * its layer split and its stage links, is `@nerva/engine`'s: `src/stages/`.)
 */
import type { BackendCapabilities } from '@nerva/core';
import { deviceCount, gpuForDevice, peerDecision } from './classify.js';
import { gpuPair, type FabricTopology } from './topology.js';

const RELATION_SCORE: Record<string, number> = { PIX: 5, PXB: 4, PHB: 3, NODE: 2, SYS: 1, unknown: 0 };

/**
 * Device ordinals in pipeline order for a same-node pipeline: starting at device 0, each next
 * device is the unvisited one with the best link to the last (GPU-direct over NVLink, more links
 * first; then GPU-direct over PCIe; then by PCIe relation), ties to the lower ordinal.
 */
export function pipelineDeviceOrder(topology: FabricTopology, capabilities?: BackendCapabilities): number[] {
  const n = deviceCount(topology);
  if (n === 0) return [];
  const score = (a: number, b: number): number => {
    const d = peerDecision(topology, a, b, capabilities);
    const ga = gpuForDevice(topology, a);
    const gb = gpuForDevice(topology, b);
    const rel = ga && gb ? (gpuPair(topology, ga.index, gb.index)?.pcie ?? 'unknown') : 'unknown';
    const nv = d.transport === 'nvlink' && typeof d.nvlinkLinks === 'number' ? d.nvlinkLinks : 0;
    return (d.transport === 'nvlink' ? 10_000 + nv * 10 : d.gpuDirect ? 1_000 : 0) + RELATION_SCORE[rel];
  };
  const order = [0];
  const left = new Set(Array.from({ length: n - 1 }, (_, i) => i + 1));
  while (left.size > 0) {
    const last = order[order.length - 1];
    let pick = -1;
    let bestScore = -Infinity;
    for (const c of left) {
      const s = score(last, c);
      if (s > bestScore) {
        bestScore = s;
        pick = c;
      }
    }
    order.push(pick);
    left.delete(pick);
  }
  return order;
}
