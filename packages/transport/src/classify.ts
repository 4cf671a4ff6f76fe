/**
 * Classification: the topology plus the backend's stated capabilities, mapped onto the fabric
 * kinds of `@nerva/core` and onto per-GPU-pair claims. A claim of GPU-direct transfer is made only
 * when the runtime proved peer access in both directions, the backend exposes peer access, and the
 * topology does not rule it out. Everything else is a refusal with a reason.
 */
import type { BackendCapabilities, FabricKind } from '@nerva/core';
import { UnknownEndpointError } from './errors.js';
import { NVIDIA_COHERENT_DEVICES, PCI_VENDOR_NVIDIA } from './pci-ids.js';
import { gpuPair, type FabricTopology, type GpuInfo, type PcieRelation, type Unknown } from './topology.js';

/** Number of devices path endpoints can name: the runtime's, else the GPUs sysfs shows. */
export function deviceCount(topology: FabricTopology): number {
  return topology.runtime ? topology.runtime.deviceCount : topology.gpus.length;
}

/**
 * The PCI GPU behind a device ordinal: through the runtime's mapping when a probe was given (null
 * when it could not be matched), else PCI bus order. Throws `UnknownEndpointError` out of range.
 */
export function gpuForDevice(topology: FabricTopology, device: number): GpuInfo | null {
  const n = deviceCount(topology);
  if (!Number.isInteger(device) || device < 0 || device >= n)
    throw new UnknownEndpointError(`gpu:${device}`, `the fabric has ${n} device(s)`);
  if (topology.runtime) {
    const g = topology.runtime.devices[device];
    return g === null ? null : topology.gpus[g];
  }
  return topology.gpus[device];
}

/** Whether DMA from this GPU may be translated by the IOMMU (unknown counts as yes). */
function mayTranslate(topology: FabricTopology, gpu: GpuInfo | null): boolean {
  if (gpu === null || gpu.iommuType === 'unknown') return topology.iommu.state !== 'off' && topology.iommu.state !== 'passthrough';
  if (gpu.iommuType === null) return false;
  return gpu.iommuType !== 'identity';
}

/** Whether two devices may copy GPU to GPU without host memory, and why (not). */
export interface PeerDecision {
  /** Device ordinals. */
  a: number;
  b: number;
  gpuDirect: boolean;
  /** The link a direct copy uses; 'pcie' also when NVLink is unknown (never assumed). */
  transport: 'nvlink' | 'pcie' | 'none';
  pcie: PcieRelation;
  nvlinkLinks: number | Unknown;
  /** Runtime peer access in both directions; 'unknown' without a probe. */
  peerAccess: boolean | Unknown;
  reason: string;
}

/**
 * Decide whether devices `a` and `b` (runtime ordinals) may use a GPU-direct path. Rules, in order:
 * no runtime probe: no; backend without `peerAccess`: no; runtime peer access false either way: no;
 * NVLink links > 0: yes over NVLink; PCI relation unknown (a device not matched to sysfs, placement
 * unknown): no; across root complexes with an IOMMU that may translate DMA: no; otherwise yes over
 * PCIe.
 */
export function peerDecision(topology: FabricTopology, a: number, b: number, capabilities?: BackendCapabilities): PeerDecision {
  if (a === b) throw new UnknownEndpointError(`gpu:${a}`, 'a device is not its own peer');
  const ga = gpuForDevice(topology, a);
  const gb = gpuForDevice(topology, b);
  const pair = ga && gb ? gpuPair(topology, ga.index, gb.index) : undefined;
  const pcie: PcieRelation = pair?.pcie ?? 'unknown';
  const base = { a, b, pcie };
  const rt = topology.runtime;
  if (rt === null) {
    return { ...base, gpuDirect: false, transport: 'none', nvlinkLinks: 'unknown', peerAccess: 'unknown', reason: 'no runtime probe: peer access unproven' };
  }
  const nvlinkLinks: number | Unknown = rt.nvlinkLinks ? Math.min(rt.nvlinkLinks[a][b], rt.nvlinkLinks[b][a]) : 'unknown';
  const ab = rt.peerAccess[a][b];
  const ba = rt.peerAccess[b][a];
  const peerAccess = ab && ba;
  const refuse = (reason: string): PeerDecision => ({ ...base, gpuDirect: false, transport: 'none', nvlinkLinks, peerAccess, reason });
  if (capabilities && !capabilities.peerAccess) return refuse(`backend ${capabilities.deviceKind} does not expose peer access (capabilities.peerAccess = false)`);
  if (!peerAccess) {
    const which = !ab && !ba ? 'either way' : !ab ? `${a} -> ${b}` : `${b} -> ${a}`;
    const nv = typeof nvlinkLinks === 'number' && nvlinkLinks > 0 ? ` although ${nvlinkLinks} NVLink links are up` : '';
    return refuse(`runtime (${rt.source}) reports no peer access ${which}${nv}`);
  }
  if (typeof nvlinkLinks === 'number' && nvlinkLinks > 0) {
    return { ...base, gpuDirect: true, transport: 'nvlink', nvlinkLinks, peerAccess, reason: `NVLink (${nvlinkLinks} links) with runtime peer access` };
  }
  if (pcie === 'unknown') {
    const why = !ga || !gb ? 'a device is not matched to a PCI GPU' : 'their PCI relation is unknown';
    return refuse(`runtime reports peer access but ${why}: the topology cannot confirm PCIe P2P, refused`);
  }
  if ((pcie === 'NODE' || pcie === 'SYS') && (mayTranslate(topology, ga) || mayTranslate(topology, gb))) {
    return refuse(`P2P across root complexes (${pcie}) while the IOMMU may translate DMA (${topology.iommu.state}): refused, peer writes would be redirected or faulted`);
  }
  const notes: string[] = [`PCIe P2P (${pcie}) with runtime peer access`];
  if (nvlinkLinks === 'unknown') notes.push('NVLink unknown, link taken as PCIe');
  if (pcie === 'SYS') notes.push('crosses the SMP interconnect, often slower than a host bounce: measure before use');
  return { ...base, gpuDirect: true, transport: 'pcie', nvlinkLinks, peerAccess, reason: notes.join('; ') };
}

/** A pair's claim in a classification. */
export type PairClaim = PeerDecision;

export interface FabricClassification {
  /** The kind the engine should plan with. */
  fabric: FabricKind;
  /** What the hardware is, from the topology alone. */
  hardwareFabric: FabricKind | Unknown;
  /** What the backend declares; null without capabilities. */
  backendFabric: FabricKind | null;
  /** Whether the backend's declaration fits the hardware. */
  agrees: boolean;
  /** Backend collectives (NCCL) available. */
  collectives: boolean;
  /** Claims for every device pair (a < b). */
  pairs: PairClaim[];
  gpuDirectPairs: number;
  notes: string[];
}

function hardwareFabric(topology: FabricTopology): FabricKind | Unknown {
  if (topology.source === 'unavailable') return 'unknown';
  if (topology.gpus.length === 0) return topology.cxlMemoryDevices.length > 0 ? 'CxlCoherentFabric' : 'CoherentSharedPhysical';
  if (topology.gpus.some((g) => g.vendorId === PCI_VENDOR_NVIDIA && g.deviceId !== 'unknown' && NVIDIA_COHERENT_DEVICES.has(g.deviceId)))
    return 'CoherentSharedPhysical';
  return 'DiscreteExplicit';
}

/**
 * Map the topology and (optionally) a backend's capabilities to a fabric kind and per-pair claims.
 * A backend claim that would promise more than the hardware gives (coherent memory on a discrete
 * GPU) is overruled by the hardware and noted; a more conservative one is kept.
 */
export function classifyFabric(topology: FabricTopology, capabilities?: BackendCapabilities): FabricClassification {
  const notes: string[] = [];
  let hw = hardwareFabric(topology);
  if (capabilities && capabilities.deviceKind !== 'cpu' && topology.source === 'sysfs' && topology.gpus.length === 0 && capabilities.deviceCount > 0) {
    // A sandbox or container can hide the PCI tree from sysfs while the runtime still sees GPUs.
    notes.push(`sysfs shows no GPU but the ${capabilities.deviceKind} backend reports ${capabilities.deviceCount}: the hardware fabric is unknown`);
    hw = 'unknown';
  }
  const declared = capabilities?.fabric ?? null;
  let fabric: FabricKind;
  let agrees = true;
  if (capabilities && capabilities.deviceKind === 'cpu') {
    fabric = declared ?? 'CoherentSharedPhysical';
    if (topology.gpus.length > 0) notes.push(`the backend computes on the CPU; ${topology.gpus.length} GPU(s) in the tree are not used`);
  } else if (hw === 'unknown') {
    fabric = declared ?? 'DiscreteExplicit';
    notes.push(declared ? `hardware fabric unknown: ${declared} taken from the backend` : 'no sysfs topology and no backend: DiscreteExplicit assumed (explicit copies)');
  } else if (declared === null) {
    fabric = hw;
  } else if (declared === hw) {
    fabric = hw;
  } else if (hw === 'DiscreteExplicit' && declared === 'UnifiedVirtualManaged') {
    fabric = declared;
    notes.push('managed memory over discrete GPUs: pages migrate over PCIe/NVLink on demand');
  } else if (declared === 'DiscreteExplicit') {
    fabric = declared;
    notes.push(`the backend copies explicitly on ${hw} hardware (conservative)`);
  } else {
    fabric = hw;
    agrees = false;
    notes.push(`the backend declares ${declared} but the hardware is ${hw}: planning with ${hw}`);
  }

  const n = deviceCount(topology);
  if (capabilities && capabilities.deviceKind !== 'cpu' && capabilities.deviceCount !== n)
    notes.push(`the backend reports ${capabilities.deviceCount} device(s), the fabric ${n}`);
  const collectives = capabilities?.collectives === true;

  const pairs: PairClaim[] = [];
  if (!capabilities || capabilities.deviceKind !== 'cpu') {
    for (let a = 0; a < n; a++) for (let b = a + 1; b < n; b++) pairs.push(peerDecision(topology, a, b, capabilities));
  }
  const gpuDirectPairs = pairs.filter((p) => p.gpuDirect).length;
  return { fabric, hardwareFabric: hw, backendFabric: declared, agrees, collectives, pairs, gpuDirectPairs, notes };
}
