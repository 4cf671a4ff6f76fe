/**
 * The machine's fabric as `GET /v1/memory` serves it (`fabric_topology`) and `nerva serve` logs it
 * at start: `@nerva/transport` discovers the topology from sysfs once, with a runtime probe built
 * from the engine backend's capabilities where the engine reports them, and plans every transfer
 * path; this module keeps the summary, the classification and the degraded choices, in snake case.
 *
 * Discovery never fails the server: an unreadable or absent sysfs (a container, not Linux) gives an
 * object that says unknown, with notes; an unexpected error is caught and reported the same way.
 */
import type { BackendCapabilities, FabricKind } from '@nerva/core';
import {
  classifyFabric,
  createSysfsReader,
  describeTopology,
  discoverTopology,
  planFabric,
  type FabricClassification,
  type FabricTopology,
  type IommuState,
  type PairClaim,
  type RuntimeProbe,
  type SysfsReader,
} from '@nerva/transport';

/** Where a runtime probe built from backend capabilities says it came from (`runtime.source`). */
export const CAPABILITIES_PROBE_SOURCE = 'backend capabilities';

/** One GPU of the PCI tree. */
export interface FabricGpuJson {
  /** Position in PCI bus order. */
  index: number;
  /** The runtime's device ordinal; null without a probe or when the runtime does not see it. */
  runtime_index: number | null;
  bdf: string;
  name: string;
  numa_node: number | 'unknown';
  /** The link's maximum (GPUs train down when idle). */
  pcie_gen: number | 'unknown';
  pcie_width: number | 'unknown';
  /** Estimated PCIe bandwidth per direction, GB/s, from link training values (not measured). */
  pcie_gbps: number | 'unknown';
  root_complex: string;
  /** null when the GPU sits on the root bus itself (common in VMs). */
  root_port: string | null;
  /** null when the GPU is in no IOMMU group (IOMMU off). */
  iommu_group: number | null | 'unknown';
  driver: string | null;
}

/** A device pair's GPU-direct decision. */
export interface FabricPairJson {
  a: number;
  b: number;
  gpu_direct: boolean;
  transport: PairClaim['transport'];
  pcie: string;
  nvlink_links: number | 'unknown';
  peer_access: boolean | 'unknown';
  reason: string;
}

export interface FabricClassificationJson {
  /** The fabric kind to plan with. */
  fabric: FabricKind;
  hardware_fabric: FabricKind | 'unknown';
  /** What the backend declares; null when its capabilities are not known here. */
  backend_fabric: FabricKind | null;
  agrees: boolean;
  collectives: boolean;
  gpu_direct_pairs: number;
  pairs: FabricPairJson[];
  notes: string[];
}

/** `fabric_topology` of `GET /v1/memory`. */
export interface FabricTopologyJson {
  /** 'sysfs': discovered; 'unavailable': no sysfs PCI tree; 'error': discovery failed (see notes). */
  source: 'sysfs' | 'unavailable' | 'error';
  /** One line, as logged at start ('fabric: 1 GPU(s) (1x NVIDIA H100 80GB HBM3), NVLink unknown, ...'). */
  summary: string;
  /** The engine backend's device kind ('cpu', 'cuda'); null when not known. */
  device_kind: string | null;
  /** Where the runtime facts (device count, peer access) came from; null without a probe. */
  runtime_probe: string | null;
  gpus: FabricGpuJson[];
  /** From a runtime probe only; there is no CUDA probe of NVLink yet, so 'unknown' unless one says. */
  nvlink: 'present' | 'absent' | 'unknown';
  iommu: IommuState;
  numa_nodes: number;
  nics: number;
  rdma_nics: number;
  /** Loaded peer-memory modules (nvidia_peermem, ...). */
  peer_memory: string[];
  nvidia_driver: string | null;
  /** null when discovery failed. */
  classification: FabricClassificationJson | null;
  /** Every path that fell back, with its reason ('gpu0 -> gpu1: pinned-bounce (degraded: ...)'). */
  degraded: string[];
  /** The topology's notes (assumed, missing or malformed values) and this module's. */
  notes: string[];
}

export interface FabricTopologyResult {
  /** The line to log at start. */
  line: string;
  json: FabricTopologyJson;
  /** The topology discovered, when discovery ran. */
  topology?: FabricTopology;
}

export interface FabricTopologyOptions {
  /** The sysfs tree to read; default the machine's ('/'). */
  reader?: SysfsReader;
  /**
   * The engine backend's capabilities, where known: `deviceCount` and `peerAccess` make the runtime
   * probe, and the whole object goes to classification and planning.
   */
  capabilities?: BackendCapabilities;
  /** The backend's device kind when its capabilities are not known ('cpu' plans no device paths). */
  deviceKind?: string;
}

/**
 * A runtime probe from a backend's capabilities: `deviceCount` devices, peer access between every
 * two of them as `capabilities.peerAccess` says (the diagonal false, as cudaDeviceCanAccessPeer
 * answers for a device and itself). No NVLink counts (there is no CUDA probe of NVLink yet, so
 * NVLink stays 'unknown') and no PCI bus ids (ordinals are matched to PCI GPUs in bus order when the
 * counts agree). Undefined for the CPU backend or a malformed count.
 */
export function runtimeProbeFromCapabilities(capabilities: Pick<BackendCapabilities, 'deviceKind' | 'deviceCount' | 'peerAccess'>): RuntimeProbe | undefined {
  const n = capabilities.deviceCount;
  if (capabilities.deviceKind === 'cpu' || !Number.isInteger(n) || n < 0) return undefined;
  const peer = capabilities.peerAccess === true;
  return {
    deviceCount: n,
    peerAccess: Array.from({ length: n }, (_, i) => Array.from({ length: n }, (_, j) => i !== j && peer)),
    source: CAPABILITIES_PROBE_SOURCE,
  };
}

function classificationJson(c: FabricClassification): FabricClassificationJson {
  return {
    fabric: c.fabric,
    hardware_fabric: c.hardwareFabric,
    backend_fabric: c.backendFabric,
    agrees: c.agrees,
    collectives: c.collectives,
    gpu_direct_pairs: c.gpuDirectPairs,
    pairs: c.pairs.map((p) => ({
      a: p.a,
      b: p.b,
      gpu_direct: p.gpuDirect,
      transport: p.transport,
      pcie: p.pcie,
      nvlink_links: p.nvlinkLinks,
      peer_access: p.peerAccess,
      reason: p.reason,
    })),
    notes: [...c.notes],
  };
}

/**
 * The backend capabilities the engine's worker reports with its info, if any. `WorkerEngineInfo`
 * carries only `deviceKind` today; when it gains `capabilities`, they feed the runtime probe here
 * without a change to this package.
 */
export function reportedCapabilities(info: object): BackendCapabilities | undefined {
  const c = (info as { capabilities?: unknown }).capabilities;
  if (typeof c !== 'object' || c === null) return undefined;
  const caps = c as Partial<BackendCapabilities>;
  return typeof caps.deviceKind === 'string' && typeof caps.deviceCount === 'number' && typeof caps.peerAccess === 'boolean' ? (c as BackendCapabilities) : undefined;
}

/** The topology, classification and degraded plans in the JSON of `fabric_topology`. */
export function fabricTopologyJson(
  topology: FabricTopology,
  classification: FabricClassification,
  degraded: string[],
  deviceKind: string | null,
  notes: string[] = [],
): FabricTopologyJson {
  return {
    source: topology.source,
    summary: describeTopology(topology),
    device_kind: deviceKind,
    runtime_probe: topology.runtime?.source ?? null,
    gpus: topology.gpus.map((g) => ({
      index: g.index,
      runtime_index: g.runtimeIndex,
      bdf: g.bdf,
      name: g.name,
      numa_node: g.numaNode,
      pcie_gen: g.link.max.gen,
      pcie_width: g.link.max.width,
      pcie_gbps: g.pcieGBps,
      root_complex: g.placement.rootComplex,
      root_port: g.placement.rootPort,
      iommu_group: g.iommuGroup,
      driver: g.driver,
    })),
    nvlink: topology.nvlink.state,
    iommu: topology.iommu.state,
    numa_nodes: topology.numaNodes.length,
    nics: topology.nics.length,
    rdma_nics: topology.nics.filter((n) => n.rdma).length,
    peer_memory: [...topology.peerMemory.peerMemory],
    nvidia_driver: topology.peerMemory.nvidiaDriver === 'unknown' ? null : topology.peerMemory.nvidiaDriver,
    classification: classificationJson(classification),
    degraded: [...degraded],
    notes: [...topology.notes, ...notes],
  };
}

/** A `fabric_topology` that says unknown, with the reason in its notes. */
export function unknownFabricTopology(reason: string, deviceKind: string | null = null): FabricTopologyJson {
  return {
    source: 'error',
    summary: `fabric: unknown (${reason})`,
    device_kind: deviceKind,
    runtime_probe: null,
    gpus: [],
    nvlink: 'unknown',
    iommu: 'unknown',
    numa_nodes: 0,
    nics: 0,
    rdma_nics: 0,
    peer_memory: [],
    nvidia_driver: null,
    classification: null,
    degraded: [],
    notes: [reason],
  };
}

/**
 * Discover the fabric once and build `fabric_topology` and the start-up log line. Never throws:
 * a runtime probe the topology rejects is dropped (noted), and any other failure gives
 * `unknownFabricTopology`.
 */
export function discoverFabricTopology(options: FabricTopologyOptions = {}): FabricTopologyResult {
  const capabilities = options.capabilities;
  const deviceKind = capabilities?.deviceKind ?? options.deviceKind ?? null;
  const notes: string[] = [];
  try {
    const reader = options.reader ?? createSysfsReader('/');
    let runtime = capabilities ? runtimeProbeFromCapabilities(capabilities) : undefined;
    if (runtime) {
      notes.push(
        `runtime probe from the ${capabilities?.deviceKind} backend's capabilities: ${runtime.deviceCount} device(s), peer access ${capabilities?.peerAccess ? 'on' : 'off'}; NVLink not probed`,
      );
    } else if (deviceKind !== 'cpu') {
      notes.push(
        capabilities
          ? `the ${deviceKind} backend's capabilities give no device count: no runtime probe, peer access and NVLink unknown`
          : `the engine does not report its backend's capabilities: no runtime probe (peer access and NVLink unknown), classification from the hardware alone`,
      );
    }
    let topology: FabricTopology;
    try {
      topology = discoverTopology(reader, { runtime });
    } catch (e) {
      if (runtime === undefined) throw e;
      notes.push(`runtime probe rejected (${(e as Error).message}): discovered without it`);
      runtime = undefined;
      topology = discoverTopology(reader);
    }
    let classification: FabricClassification;
    let degraded: string[];
    if (capabilities || deviceKind !== 'cpu') {
      const report = planFabric(topology, { capabilities });
      classification = report.classification;
      degraded = report.degraded;
    } else {
      // The CPU backend moves nothing between devices: classify the hardware, plan no paths.
      classification = classifyFabric(topology);
      degraded = [];
      notes.push('the backend computes on the CPU: no device transfer paths planned');
    }
    const json = fabricTopologyJson(topology, classification, degraded, deviceKind, notes);
    return { line: json.summary, json, topology };
  } catch (e) {
    const json = unknownFabricTopology(`fabric discovery failed: ${(e as Error)?.message ?? String(e)}`, deviceKind);
    return { line: json.summary, json };
  }
}
