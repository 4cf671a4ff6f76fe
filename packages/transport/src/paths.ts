/**
 * Transfer paths between two endpoints and the choice among them.
 *
 * `listPaths` lists only the paths the topology and the runtime prove possible, and every other
 * path that applies to the endpoint pair as rejected, with the reason. `planPath` measures each
 * candidate through an injected `measure` function (the CUDA backend plugs in real copies; tests
 * plug in fakes), picks the cheapest for the transfer size, and says in `notes` why the preferred
 * path was not taken. A fallback is never silent: `degraded` is true and a note names the cause.
 */
import type { BackendCapabilities } from '@nerva/core';
import { peerDecision, gpuForDevice, type PeerDecision } from './classify.js';
import { TransportArgumentError, UnknownEndpointError } from './errors.js';
import type { FabricTopology } from './topology.js';

/** Path kinds, in static preference order (used when nothing is measured). */
export const PATH_KINDS = [
  /** GPU to GPU over NVLink (peer copy). */
  'nvlink-peer',
  /** GPU to GPU over PCIe peer-to-peer. */
  'pcie-peer',
  /** GPU memory to/from a NIC without host memory (GPUDirect RDMA). */
  'gpudirect-rdma',
  /** Through NCCL, which picks its own transport (no GPU-direct claim is made for it here). */
  'nccl',
  /** Host to GPU: the CPU writes its output straight into registered pinned memory, then one DMA. */
  'cpu-produced',
  /** A kernel reads or writes mapped pinned host memory directly over the bus (zero copy). */
  'mapped-pinned',
  /** Staged through a pinned host buffer (a copy into or out of it plus a DMA). */
  'pinned-bounce',
  /** Over a socket, staged through host memory. */
  'tcp',
] as const;
export type PathKind = (typeof PATH_KINDS)[number];

/** Kinds that move GPU memory without passing through host memory. */
export const GPU_DIRECT_KINDS: ReadonlySet<PathKind> = new Set<PathKind>(['nvlink-peer', 'pcie-peer', 'gpudirect-rdma']);

/**
 * One end of a transfer: a GPU by device ordinal (the runtime's, or PCI bus order without a runtime
 * probe), host memory of this node, or another node.
 */
export type Endpoint = { kind: 'gpu'; device: number } | { kind: 'host'; numaNode?: number } | { kind: 'remote'; name?: string };

/** A path that the topology and runtime prove possible. */
export interface PathCandidate {
  kind: PathKind;
  from: Endpoint;
  to: Endpoint;
  /** True only for GPU_DIRECT_KINDS, and only when proven. */
  gpuDirect: boolean;
  /** The hops, in words. */
  via: string;
  /** Stable identity for caching measurements ('pcie-peer:gpu0>gpu1'). */
  key: string;
}

/** A path that applies to the endpoints but is not possible here, and why. */
export interface RejectedPath {
  kind: PathKind;
  reason: string;
}

export interface PathListing {
  candidates: PathCandidate[];
  rejected: RejectedPath[];
}

export interface PathOptions {
  /** The backend's capabilities: peerAccess, collectives and a pinned tier gate paths. */
  capabilities?: BackendCapabilities;
}

/** A measured rate: `gbps` in GB/s (1e9 bytes per second), `latencyUs` the fixed cost of one transfer. */
export interface PathMeasurement {
  gbps: number;
  latencyUs: number;
}

/** Measure one path once (a timed copy); `undefined` when it cannot be measured here. */
export type MeasureFn = (path: PathCandidate) => PathMeasurement | undefined;

export interface PlanOptions extends PathOptions {
  /** Measurement hook; wrap it in `measureOnce` so each path is measured once per process. */
  measure?: MeasureFn;
  /** Transfer size the cost is computed for (default 1 MiB). */
  bytes?: number;
}

/** A candidate with its measurement. */
export interface PlannedPath extends PathCandidate {
  measurement: PathMeasurement | null;
  /** latencyUs + bytes / rate, in microseconds; null when not measured. */
  costUs: number | null;
  /** Why the measurement failed; such a path is never chosen. */
  error: string | null;
}

export interface PathPlan {
  from: Endpoint;
  to: Endpoint;
  bytes: number;
  chosen: PlannedPath | null;
  /** Usable candidates, best first, then the ones whose measurement failed. */
  candidates: PlannedPath[];
  rejected: RejectedPath[];
  /** The chosen path is not the preferred kind for these endpoints (or there is none). */
  degraded: boolean;
  notes: string[];
}

/** 'gpu0', 'host', 'host@numa1', 'remote:name'. */
export function endpointKey(e: Endpoint): string {
  if (e.kind === 'gpu') return `gpu${e.device}`;
  if (e.kind === 'host') return e.numaNode === undefined ? 'host' : `host@numa${e.numaNode}`;
  return e.name === undefined ? 'remote' : `remote:${e.name}`;
}

function validateEndpoint(topology: FabricTopology, e: Endpoint): void {
  if (e.kind === 'gpu') gpuForDevice(topology, e.device);
  else if (e.kind === 'host') {
    if (e.numaNode !== undefined && topology.numaNodes.length > 0 && !topology.numaNodes.some((n) => n.id === e.numaNode))
      throw new UnknownEndpointError(endpointKey(e), `no NUMA node ${e.numaNode}`);
  } else if (e.kind !== 'remote') throw new TransportArgumentError(`unknown endpoint kind ${JSON.stringify((e as { kind: unknown }).kind)}`);
}

type PairClass = 'gpu-gpu' | 'gpu-host' | 'host-gpu' | 'gpu-remote' | 'remote-gpu' | 'host-host' | 'host-remote' | 'remote-host';

function pairClass(from: Endpoint, to: Endpoint): PairClass {
  if (from.kind === 'remote' && to.kind === 'remote') throw new TransportArgumentError('remote -> remote: neither end is on this node');
  return `${from.kind}-${to.kind}` as PairClass;
}

/** Whether a backend offers pinned host memory (without capabilities: assumed, every CUDA runtime pins). */
function pinnedReason(options: PathOptions): string | null {
  const caps = options.capabilities;
  if (caps && !(Number(caps.memory.pinned) > 0)) return `backend ${caps.deviceKind} has no pinned tier`;
  return null;
}

function collectivesReason(options: PathOptions): string | null {
  const caps = options.capabilities;
  if (!caps) return 'no backend capabilities given: collectives unknown';
  if (!caps.collectives) return `backend ${caps.deviceKind} has no collectives (capabilities.collectives = false)`;
  return null;
}

/**
 * List the paths between two endpoints: candidates the fabric proves possible, and the rejected
 * ones with reasons. Throws `UnknownEndpointError` for a device or NUMA node the fabric does not
 * have, and `TransportArgumentError` for gpu -> same gpu or remote -> remote.
 */
export function listPaths(topology: FabricTopology, from: Endpoint, to: Endpoint, options: PathOptions = {}): PathListing {
  validateEndpoint(topology, from);
  validateEndpoint(topology, to);
  const cls = pairClass(from, to);
  const candidates: PathCandidate[] = [];
  const rejected: RejectedPath[] = [];
  const fk = endpointKey(from);
  const tk = endpointKey(to);
  const offer = (kind: PathKind, via: string, gpuDirect = false) =>
    candidates.push({ kind, from, to, gpuDirect, via, key: `${kind}:${fk}>${tk}` });
  const reject = (kind: PathKind, reason: string) => rejected.push({ kind, reason });
  const pinned = pinnedReason(options);
  const rt = topology.runtime;

  switch (cls) {
    case 'gpu-gpu': {
      const a = (from as { device: number }).device;
      const b = (to as { device: number }).device;
      if (a === b) throw new TransportArgumentError(`gpu${a} -> gpu${a}: a copy within one device is not a transfer path`);
      const d: PeerDecision = peerDecision(topology, a, b, options.capabilities);
      if (d.gpuDirect && d.transport === 'nvlink') offer('nvlink-peer', `GPU ${a} -> NVLink (${d.nvlinkLinks} links) -> GPU ${b}`, true);
      else reject('nvlink-peer', d.gpuDirect ? (d.nvlinkLinks === 'unknown' ? 'NVLink unknown (no runtime NVLink probe)' : 'no NVLink links between the devices') : d.reason);
      if (d.gpuDirect && d.transport === 'pcie') offer('pcie-peer', `GPU ${a} -> PCIe ${d.pcie} -> GPU ${b}`, true);
      else reject('pcie-peer', d.gpuDirect ? 'peer copies between these devices take NVLink' : d.reason);
      const coll = collectivesReason(options);
      if (coll === null) offer('nccl', `NCCL send/recv GPU ${a} -> GPU ${b} (NCCL picks the transport)`);
      else reject('nccl', coll);
      if (pinned === null) offer('pinned-bounce', `GPU ${a} -> pinned host -> GPU ${b}`);
      else reject('pinned-bounce', pinned);
      break;
    }
    case 'gpu-host':
    case 'host-gpu': {
      const dev = cls === 'gpu-host' ? (from as { device: number }).device : (to as { device: number }).device;
      const dir = cls === 'gpu-host' ? `GPU ${dev} -> host` : `host -> GPU ${dev}`;
      if (cls === 'host-gpu') {
        if (pinned === null) offer('cpu-produced', `CPU writes into registered pinned memory, DMA to GPU ${dev}`);
        else reject('cpu-produced', pinned);
      }
      if (pinned !== null) reject('mapped-pinned', pinned);
      else if (rt === null) reject('mapped-pinned', 'no runtime probe: mapping pinned host memory unproven');
      else if (rt.mappedPinned !== true) reject('mapped-pinned', `runtime (${rt.source}) did not report mappable pinned memory`);
      else offer('mapped-pinned', `${dir} through mapped pinned memory (zero copy)`);
      if (pinned === null) offer('pinned-bounce', `${dir} through a pinned staging buffer`);
      else reject('pinned-bounce', pinned);
      break;
    }
    case 'gpu-remote':
    case 'remote-gpu': {
      const dev = cls === 'gpu-remote' ? (from as { device: number }).device : (to as { device: number }).device;
      const rdmaNics = topology.nics.filter((n) => n.rdma);
      if (rdmaNics.length === 0) reject('gpudirect-rdma', 'no RDMA-capable NIC');
      else if (topology.peerMemory.peerMemory.length === 0) reject('gpudirect-rdma', 'no peer-memory module loaded (nvidia_peermem / nv_peer_mem)');
      else if (rt === null) reject('gpudirect-rdma', 'no runtime probe: GPUDirect RDMA unproven');
      else if (rt.gpuDirectRdma !== true) reject('gpudirect-rdma', `runtime (${rt.source}) did not verify GPUDirect RDMA`);
      else {
        const gpu = gpuForDevice(topology, dev);
        const near = gpu ? topology.gpuNics.filter((x) => x.gpu === gpu.index && rdmaNics.some((n) => n.bdf === x.nic)) : [];
        const rank = ['PIX', 'PXB', 'PHB', 'NODE', 'SYS', 'unknown'];
        near.sort((x, y) => rank.indexOf(x.relation) - rank.indexOf(y.relation));
        const nic = near[0]?.nic ?? rdmaNics[0].bdf;
        offer('gpudirect-rdma', `GPU ${dev} <-> NIC ${nic}${near[0] ? ` (${near[0].relation})` : ''} by RDMA`, true);
      }
      const coll = collectivesReason(options);
      if (topology.nics.length === 0) reject('nccl', 'no network function');
      else if (coll !== null) reject('nccl', coll);
      else offer('nccl', `NCCL over the network (NCCL picks the transport)`);
      if (topology.nics.length === 0) reject('tcp', 'no network function');
      else if (pinned !== null) reject('tcp', pinned);
      else offer('tcp', `GPU ${dev} <-> pinned host <-> socket`);
      break;
    }
    case 'host-remote':
    case 'remote-host':
      if (topology.nics.length === 0) reject('tcp', 'no network function');
      else offer('tcp', 'host memory <-> socket');
      break;
    case 'host-host':
      offer('tcp', 'between processes of this node over loopback');
      break;
  }
  return { candidates, rejected };
}

function validMeasurement(m: PathMeasurement): string | null {
  if (typeof m !== 'object' || m === null) return 'measurement is not an object';
  if (!Number.isFinite(m.gbps) || m.gbps <= 0) return `rate ${String(m.gbps)} GB/s is not positive`;
  if (!Number.isFinite(m.latencyUs) || m.latencyUs < 0) return `latency ${String(m.latencyUs)} us is negative or not finite`;
  return null;
}

const preference = (k: PathKind) => PATH_KINDS.indexOf(k);

/** The kinds that count as not degraded for each endpoint class. */
function preferredKinds(cls: PairClass): ReadonlySet<PathKind> | null {
  if (cls === 'gpu-gpu') return new Set<PathKind>(['nvlink-peer', 'pcie-peer']);
  if (cls === 'gpu-remote' || cls === 'remote-gpu') return new Set<PathKind>(['gpudirect-rdma', 'nccl']);
  return null; // any path will do
}

/**
 * Plan one transfer: list the paths, measure each candidate, choose the cheapest for `bytes`.
 * Measured candidates rank by cost; candidates the hook did not measure follow, in preference
 * order; without a hook the static preference order decides. A measurement that throws or is
 * invalid removes that candidate (with a note).
 */
export function planPath(topology: FabricTopology, from: Endpoint, to: Endpoint, options: PlanOptions = {}): PathPlan {
  const bytes = options.bytes ?? 1 << 20;
  if (!Number.isFinite(bytes) || bytes < 0) throw new TransportArgumentError(`bytes must be a non-negative number, got ${bytes}`);
  const { candidates, rejected } = listPaths(topology, from, to, options);
  const notes: string[] = [];
  const planned: PlannedPath[] = candidates.map((c) => {
    if (!options.measure) return { ...c, measurement: null, costUs: null, error: null };
    let m: PathMeasurement | undefined;
    try {
      m = options.measure(c);
    } catch (e) {
      const msg = e instanceof Error ? e.message : String(e);
      notes.push(`${c.kind}: measurement failed (${msg}); not used`);
      return { ...c, measurement: null, costUs: null, error: msg };
    }
    if (m === undefined) return { ...c, measurement: null, costUs: null, error: null };
    const bad = validMeasurement(m);
    if (bad !== null) {
      notes.push(`${c.kind}: invalid measurement (${bad}); not used`);
      return { ...c, measurement: null, costUs: null, error: bad };
    }
    const measurement = { gbps: m.gbps, latencyUs: m.latencyUs };
    return { ...c, measurement, costUs: m.latencyUs + bytes / (m.gbps * 1e3), error: null };
  });
  const usable = planned.filter((p) => p.error === null);
  usable.sort((x, y) => {
    if (x.costUs !== null && y.costUs !== null && x.costUs !== y.costUs) return x.costUs - y.costUs;
    if ((x.costUs === null) !== (y.costUs === null)) return x.costUs === null ? 1 : -1;
    return preference(x.kind) - preference(y.kind);
  });
  const chosen = usable[0] ?? null;
  const cls = pairClass(from, to);
  const preferred = preferredKinds(cls);
  const degraded = chosen === null || (preferred !== null && !preferred.has(chosen.kind));

  if (chosen === null) {
    notes.push(`no usable path ${endpointKey(from)} -> ${endpointKey(to)}${rejected.length ? `: ${rejected.map((r) => `${r.kind}: ${r.reason}`).join('; ')}` : ''}`);
  } else {
    const how = chosen.measurement
      ? `measured ${chosen.measurement.gbps.toFixed(1)} GB/s, ${chosen.measurement.latencyUs.toFixed(1)} us`
      : options.measure
        ? 'not measured, by preference'
        : 'no measurement hook, by preference';
    notes.push(`chose ${chosen.kind} (${how})`);
    if (degraded && preferred !== null) {
      const better = usable.filter((p) => preferred.has(p.kind));
      if (better.length > 0) notes.push(`degraded: ${better.map((p) => p.kind).join(', ')} measured slower than ${chosen.kind}`);
      const failed = planned.filter((p) => p.error !== null && preferred.has(p.kind));
      if (failed.length > 0) notes.push(`degraded: ${failed.map((p) => p.kind).join(', ')} could not be measured`);
      const byReason = new Map<string, PathKind[]>();
      for (const r of rejected) if (preferred.has(r.kind)) byReason.set(r.reason, [...(byReason.get(r.reason) ?? []), r.kind]);
      for (const [reason, kinds] of byReason) notes.push(`degraded: ${kinds.join(', ')} unavailable: ${reason}`);
    }
  }
  const ordered = [...usable, ...planned.filter((p) => p.error !== null)];
  return { from, to, bytes, chosen, candidates: ordered, rejected, degraded, notes };
}

/**
 * Wrap a measurement hook so each path (by `key`) is measured once per process, as the runtime
 * rules ask (measure at start, never on the hot path). A failure is remembered and rethrown.
 */
export function measureOnce(measure: MeasureFn): MeasureFn & { readonly results: ReadonlyMap<string, PathMeasurement | undefined | Error> } {
  const results = new Map<string, PathMeasurement | undefined | Error>();
  const fn = (path: PathCandidate): PathMeasurement | undefined => {
    if (!results.has(path.key)) {
      try {
        results.set(path.key, measure(path));
      } catch (e) {
        results.set(path.key, e instanceof Error ? e : new Error(String(e)));
      }
    }
    const r = results.get(path.key);
    if (r instanceof Error) throw r;
    return r;
  };
  return Object.assign(fn, { results: results as ReadonlyMap<string, PathMeasurement | undefined | Error> });
}
