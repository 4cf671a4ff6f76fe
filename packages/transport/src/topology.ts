/**
 * Fabric discovery: what the machine's PCI tree, NUMA nodes, IOMMU, kernel modules and (through an
 * injected runtime probe) CUDA say about how GPUs, NICs and host memory are connected.
 *
 * Every value comes from a file that was read, or is the string 'unknown' with a line in `notes`
 * saying why. Nothing is assumed: NVLink and peer access are 'unknown' unless a runtime probe says
 * otherwise, because sysfs alone cannot show them.
 */
import { posix } from 'node:path';
import { TopologyParseError, TransportArgumentError } from './errors.js';
import {
  GPU_VENDORS,
  NVIDIA_DEVICE_NAMES,
  PCI_VENDOR_NVIDIA,
  PCIE_GEN_BY_GTS,
  PCIE_LANE_GBPS,
  VENDOR_NAMES,
} from './pci-ids.js';
import type { SysfsReader } from './sysfs.js';

/** A value that could not be read or parsed. */
export type Unknown = 'unknown';

/** One PCIe link state. */
export interface PcieLink {
  /** Per-lane rate in GT/s (2.5, 5, 8, 16, 32, 64). */
  speedGTs: number | Unknown;
  /** PCIe generation (1-6), from the rate. */
  gen: number | Unknown;
  /** Lane count. */
  width: number | Unknown;
}

/**
 * A device's link, now and at most. NVIDIA GPUs train their link down when idle, so `current` can
 * read 2.5 GT/s on a Gen5 card; estimates use `max`.
 */
export interface PcieLinkState {
  current: PcieLink;
  max: PcieLink;
}

/** Where a PCI function sits in the tree. */
export interface PciPlacement {
  /** Root bus ('pci0000:00') = host bridge / root complex, from the device's sysfs path. */
  rootComplex: string | Unknown;
  /** Bridges from the root port down to the device's parent, by PCI address. */
  bridges: string[];
  /** The root port (first bridge); null when the device sits on the root bus itself (common in VMs). */
  rootPort: string | null | Unknown;
  /** Upstream ports of the PCIe switches between the root port and the device. */
  switches: string[];
  /** The device's directory under /sys/devices. */
  sysfsPath: string | Unknown;
}

/** What every PCI function in the topology records. */
export interface PciFunctionInfo {
  /** PCI address, 'dddd:bb:dd.f' (lower case). */
  bdf: string;
  /** 24-bit class code (0x030200 = 3D controller). */
  classCode: number | Unknown;
  vendorId: number | Unknown;
  deviceId: number | Unknown;
  /** NUMA node of the device; 'unknown' when sysfs has no affinity and the machine has several nodes. */
  numaNode: number | Unknown;
  link: PcieLinkState;
  placement: PciPlacement;
  /** IOMMU group; null when the device has none (IOMMU off). */
  iommuGroup: number | null | Unknown;
  /** The group's domain type ('identity' = passthrough, 'DMA'/'DMA-FQ' = translated, ...); null without a group. */
  iommuType: string | null | Unknown;
  /** Bound kernel driver; null when none is bound. */
  driver: string | null;
}

/** A compute GPU (display-class function from a GPU vendor). */
export interface GpuInfo extends PciFunctionInfo {
  /** Position in PCI bus order (the order of `gpus`). */
  index: number;
  vendor: 'nvidia' | 'amd';
  name: string | Unknown;
  /** 'driver': /proc/driver/nvidia; 'pci-id': this package's table. */
  nameSource: 'driver' | 'pci-id' | Unknown;
  /** The runtime's device ordinal for this GPU; null without a probe or when the runtime does not see it. */
  runtimeIndex: number | null;
  /**
   * Expected PCIe bandwidth per direction, GB/s: the narrowest maximum link between the GPU and its
   * root port. An estimate from link training values, never a measurement.
   */
  pcieGBps: number | Unknown;
}

/** A network function. */
export interface NicInfo extends PciFunctionInfo {
  /** From the class code: 0x0200 ethernet, 0x0207 infiniband, 0x0280 other network. */
  kind: 'ethernet' | 'infiniband' | 'network';
  /** Kernel network interfaces (`net/`). */
  netdevs: string[];
  /** RDMA devices (`infiniband/`, e.g. mlx5_0). */
  rdmaDevices: string[];
  /** An RDMA-capable function (InfiniBand class or an RDMA device bound). */
  rdma: boolean;
}

/** One NUMA node. */
export interface NumaNodeInfo {
  id: number;
  /** As the kernel prints it ('0-15,32-47'). */
  cpulist: string | Unknown;
  cpuCount: number | Unknown;
  /** SLIT distances to every node, in node order. */
  distances: number[] | Unknown;
}

/**
 * IOMMU state, from the groups' domain types:
 * 'off' (no groups), 'passthrough' (every group 'identity'), 'translated' (every group DMA or DMA-FQ),
 * 'mixed', or 'unknown' (groups exist but the kernel does not say their type).
 */
export type IommuState = 'off' | 'passthrough' | 'translated' | 'mixed' | 'unknown';

export interface IommuInfo {
  state: IommuState;
  /** Hardware units (/sys/class/iommu: dmar0, ivhd0, ...). */
  units: string[];
  groupCount: number;
  /** Count of groups per domain type. */
  groupTypes: Record<string, number>;
  /** IOMMU-related kernel command-line arguments. */
  cmdline: string[];
}

/** Kernel modules that matter for GPU transfers. */
export interface PeerMemoryInfo {
  /**
   * Modules among the interesting ones (nvidia, nvidia_uvm, nvidia_peermem, ib_core, ...) that have
   * a /sys/module entry: loaded, or built into the kernel (an entry without `initstate`, as ib_core
   * and mlx5_core on the recorded H100 machine).
   */
  modules: string[];
  /** Loaded peer-memory modules (GPUDirect RDMA through the peer-memory API). */
  peerMemory: string[];
  /** NVIDIA kernel driver version; null when the nvidia module is not loaded. */
  nvidiaDriver: string | null | Unknown;
}

/** NVLink, which only the runtime can prove. */
export interface NvlinkInfo {
  /** 'present': some GPU pair has links; 'absent': the probe says none; 'unknown': no probe said. */
  state: 'present' | 'absent' | Unknown;
  source: 'runtime' | 'none';
  /** NVSwitch functions seen on PCI (a hint that NVLink exists, not a proof). */
  nvswitches: string[];
}

/**
 * PCIe relation of two functions, as `nvidia-smi topo -m` names it:
 * PIX at most one switch between them; PXB several switches, no host bridge; PHB through one host
 * bridge (same root complex); NODE across root complexes of one NUMA node; SYS across NUMA nodes.
 */
export type PcieRelation = 'PIX' | 'PXB' | 'PHB' | 'NODE' | 'SYS' | Unknown;

/** Two GPUs (by topology index, a < b). */
export interface GpuPair {
  a: number;
  b: number;
  pcie: PcieRelation;
  /** NVLink links between them (runtime probe); 'unknown' without one. */
  nvlinkLinks: number | Unknown;
  /** Runtime peer access a -> b and b -> a (cudaDeviceCanAccessPeer). */
  peerAccessAB: boolean | Unknown;
  peerAccessBA: boolean | Unknown;
  /** nvidia-smi style: 'NV18' when NVLink links are known, else the PCIe relation. */
  label: string;
}

/** How close a GPU is to a NIC. */
export interface GpuNicAffinity {
  gpu: number;
  nic: string;
  relation: PcieRelation;
}

/**
 * What the CUDA (or other) runtime says, injected by the caller: sysfs alone cannot show peer
 * access or NVLink. Matrices are indexed by runtime device ordinal.
 */
export interface RuntimeProbe {
  deviceCount: number;
  /** peerAccess[i][j]: device i can access device j's memory (cudaDeviceCanAccessPeer). Diagonal ignored. */
  peerAccess: boolean[][];
  /** Active NVLink links between devices i and j (0 = none). Absent: NVLink unknown. */
  nvlinkLinks?: number[][];
  /** PCI bus id of each device (cudaDeviceGetPCIBusId, '00000000:18:00.0'). Absent: PCI bus order is assumed. */
  pciBusIds?: string[];
  /** Device can map pinned host memory (cudaDevAttrCanMapHostMemory on every device). */
  mappedPinned?: boolean;
  /** GPUDirect RDMA was verified (e.g. a registered GPU buffer read by the NIC). */
  gpuDirectRdma?: boolean;
  /** Where the probe came from, for notes ('cuda', 'fixture', ...). */
  source?: string;
}

/** The runtime probe as validated and mapped onto the PCI topology. */
export interface RuntimeView {
  source: string;
  deviceCount: number;
  /** How runtime ordinals were matched to PCI GPUs. */
  mapping: 'pci-bus-id' | 'assumed-pci-order' | 'unmapped';
  /** devices[ordinal] = topology GPU index, or null when it could not be matched. */
  devices: (number | null)[];
  peerAccess: boolean[][];
  nvlinkLinks: number[][] | null;
  mappedPinned: boolean | Unknown;
  gpuDirectRdma: boolean | Unknown;
}

/** The fabric as one typed, JSON-serialisable object. */
export interface FabricTopology {
  schema: 1;
  /** 'unavailable' when the tree has no /sys/bus/pci (not Linux, sysfs not mounted). */
  source: 'sysfs' | 'unavailable';
  /** The reader's description (root directory). */
  reader: string;
  gpus: GpuInfo[];
  nics: NicInfo[];
  numaNodes: NumaNodeInfo[];
  iommu: IommuInfo;
  peerMemory: PeerMemoryInfo;
  nvlink: NvlinkInfo;
  pairs: GpuPair[];
  gpuNics: GpuNicAffinity[];
  runtime: RuntimeView | null;
  /** CXL memory devices (/sys/bus/cxl/devices/mem*). */
  cxlMemoryDevices: string[];
  /** Display functions that are not compute GPUs (BMC and VM VGA), by PCI address. */
  otherDisplays: string[];
  /** Everything assumed, inferred, missing or malformed, in words. */
  notes: string[];
}

export interface DiscoverOptions {
  /** What the runtime says (peer access, NVLink, PCI bus ids). */
  runtime?: RuntimeProbe;
  /** Throw `TopologyParseError` on malformed values instead of recording 'unknown'. */
  strict?: boolean;
}

const PCI_DEVICES = '/sys/bus/pci/devices';
const BDF_RE = /^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$/i;
const ROOT_BUS_RE = /^pci[0-9a-f]{4,8}:[0-9a-f]{2}$/i;
const INTERESTING_MODULES = [
  'nvidia',
  'nvidia_uvm',
  'nvidia_peermem',
  'nv_peer_mem',
  'nvidia_fs',
  'ib_core',
  'ib_uverbs',
  'mlx5_core',
  'amdgpu',
  'amd_peermem',
];
const PEERMEM_RE = /peer_?mem/;

class Ctx {
  readonly notes: string[] = [];
  constructor(
    readonly reader: SysfsReader,
    readonly strict: boolean,
  ) {}

  note(text: string): void {
    if (!this.notes.includes(text)) this.notes.push(text);
  }

  /** A malformed value: throw in strict mode, else note it and return 'unknown'. */
  bad(path: string, value: string, detail: string): Unknown {
    if (this.strict) throw new TopologyParseError(path, value, detail);
    this.note(`${path}: ${detail} (read ${JSON.stringify(value.trim())}); recorded as unknown`);
    return 'unknown';
  }

  text(path: string): string | undefined {
    const t = this.reader.readFile(path);
    return t === undefined ? undefined : t.trim();
  }

  hex(path: string): number | Unknown {
    const t = this.text(path);
    if (t === undefined) return 'unknown';
    if (!/^0x[0-9a-f]+$/i.test(t)) return this.bad(path, t, 'not a hexadecimal number');
    return Number.parseInt(t.slice(2), 16);
  }
}

/** '00000000:18:00.0' (CUDA's eight-digit domain) or '0000:18:00.0' -> '0000:18:00.0'. */
export function normalizeBdf(id: string): string | undefined {
  const m = /^([0-9a-f]{1,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$/i.exec(id.trim());
  if (!m) return undefined;
  const domain = Number.parseInt(m[1], 16).toString(16).padStart(4, '0');
  return `${domain}:${m[2]}:${m[3]}.${m[4]}`.toLowerCase();
}

/** Parse a kernel cpulist ('0-15,32-47') into a CPU count; undefined when malformed. */
export function parseCpuList(text: string): number | undefined {
  const t = text.trim();
  if (t === '') return 0;
  let count = 0;
  for (const part of t.split(',')) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(part.trim());
    if (!m) return undefined;
    const lo = Number(m[1]);
    const hi = m[2] === undefined ? lo : Number(m[2]);
    if (hi < lo) return undefined;
    count += hi - lo + 1;
  }
  return count;
}

/** Parse a link speed ('32.0 GT/s PCIe', '8 GT/s', 'Unknown'). undefined = malformed. */
export function parseLinkSpeed(text: string): number | Unknown | undefined {
  const t = text.trim();
  if (/^unknown/i.test(t)) return 'unknown';
  const m = /^(\d+(?:\.\d+)?)\s*GT\/s/i.exec(t);
  if (!m) return undefined;
  const v = Number(m[1]);
  return Number.isFinite(v) && v > 0 ? v : undefined;
}

function readLink(ctx: Ctx, dir: string, speedFile: string, widthFile: string): PcieLink {
  const link: PcieLink = { speedGTs: 'unknown', gen: 'unknown', width: 'unknown' };
  const speedPath = `${dir}/${speedFile}`;
  const speed = ctx.text(speedPath);
  if (speed !== undefined) {
    const v = parseLinkSpeed(speed);
    if (v === undefined) ctx.bad(speedPath, speed, 'not a link speed in GT/s');
    else if (v !== 'unknown') {
      link.speedGTs = v;
      link.gen = PCIE_GEN_BY_GTS.get(v) ?? 'unknown';
    }
  }
  const widthPath = `${dir}/${widthFile}`;
  const width = ctx.text(widthPath);
  if (width !== undefined) {
    if (!/^\d+$/.test(width) || Number(width) > 32) ctx.bad(widthPath, width, 'not a lane count');
    else if (Number(width) > 0) link.width = Number(width);
  }
  return link;
}

interface RawFunction {
  info: PciFunctionInfo;
  /** numa_node read as -1: no affinity in sysfs. */
  noAffinity: boolean;
}

function placementOf(ctx: Ctx, bdf: string): PciPlacement {
  const target = ctx.reader.readlink(`${PCI_DEVICES}/${bdf}`);
  const unknown: PciPlacement = { rootComplex: 'unknown', bridges: [], rootPort: 'unknown', switches: [], sysfsPath: 'unknown' };
  if (target === undefined) {
    ctx.note(`${PCI_DEVICES}/${bdf} is not a link into /sys/devices: its place in the PCI tree is unknown`);
    return unknown;
  }
  const path = posix.resolve(PCI_DEVICES, target);
  const parts = path.split('/').filter(Boolean);
  let root = -1;
  for (let i = parts.length - 1; i >= 0; i--) {
    if (ROOT_BUS_RE.test(parts[i])) {
      root = i;
      break;
    }
  }
  const chain = root < 0 ? [] : parts.slice(root + 1).map((p) => p.toLowerCase());
  if (root < 0 || chain.length === 0 || chain[chain.length - 1] !== bdf || !chain.every((p) => BDF_RE.test(p))) {
    if (ctx.strict) throw new TopologyParseError(`${PCI_DEVICES}/${bdf}`, target, 'link target is not a /sys/devices/pci… path ending in the device');
    ctx.note(`${PCI_DEVICES}/${bdf} -> ${target}: not a PCI path ending in the device; its place in the tree is unknown`);
    return { ...unknown, sysfsPath: path };
  }
  const bridges = chain.slice(0, -1);
  const switches: string[] = [];
  // Below the root port, a switch is an upstream port followed by one of its downstream ports.
  for (let i = 1; i < bridges.length; i += 2) if (i + 1 < bridges.length) switches.push(bridges[i]);
  return { rootComplex: parts[root].toLowerCase(), bridges, rootPort: bridges[0] ?? null, switches, sysfsPath: path };
}

function readFunction(ctx: Ctx, bdf: string): RawFunction {
  const dir = `${PCI_DEVICES}/${bdf}`;
  const classCode = ctx.hex(`${dir}/class`);
  const vendorId = ctx.hex(`${dir}/vendor`);
  const deviceId = ctx.hex(`${dir}/device`);
  let numaNode: number | Unknown = 'unknown';
  let noAffinity = false;
  const numaPath = `${dir}/numa_node`;
  const numa = ctx.text(numaPath);
  if (numa !== undefined) {
    if (!/^-?\d+$/.test(numa)) numaNode = ctx.bad(numaPath, numa, 'not a NUMA node number');
    else if (Number(numa) < 0) noAffinity = true;
    else if (Number(numa) > 4095) numaNode = ctx.bad(numaPath, numa, 'NUMA node number out of range');
    else numaNode = Number(numa);
  } else noAffinity = true;
  const link: PcieLinkState = {
    current: readLink(ctx, dir, 'current_link_speed', 'current_link_width'),
    max: readLink(ctx, dir, 'max_link_speed', 'max_link_width'),
  };
  let iommuGroup: number | null | Unknown = null;
  let iommuType: string | null | Unknown = null;
  const groupLink = ctx.reader.readlink(`${dir}/iommu_group`);
  if (groupLink !== undefined) {
    const name = posix.basename(groupLink);
    if (!/^\d+$/.test(name)) {
      iommuGroup = ctx.bad(`${dir}/iommu_group`, groupLink, 'link does not name a numbered IOMMU group');
      iommuType = 'unknown';
    } else {
      iommuGroup = Number(name);
      iommuType = ctx.text(`/sys/kernel/iommu_groups/${name}/type`) ?? 'unknown';
    }
  }
  const driverLink = ctx.reader.readlink(`${dir}/driver`);
  const driver = driverLink === undefined ? null : posix.basename(driverLink);
  return {
    info: { bdf, classCode, vendorId, deviceId, numaNode, link, placement: placementOf(ctx, bdf), iommuGroup, iommuType, driver },
    noAffinity,
  };
}

function readNuma(ctx: Ctx): NumaNodeInfo[] {
  const base = '/sys/devices/system/node';
  const names = (ctx.reader.readdir(base) ?? []).filter((n) => /^node\d+$/.test(n));
  const nodes = names.map((n) => Number(n.slice(4))).sort((a, b) => a - b);
  return nodes.map((id) => {
    const listPath = `${base}/node${id}/cpulist`;
    const list = ctx.text(listPath);
    let cpulist: string | Unknown = 'unknown';
    let cpuCount: number | Unknown = 'unknown';
    if (list !== undefined) {
      const count = parseCpuList(list);
      if (count === undefined) ctx.bad(listPath, list, 'not a CPU list');
      else {
        cpulist = list;
        cpuCount = count;
      }
    } else ctx.note(`${listPath} is missing: CPUs of node ${id} unknown`);
    const distPath = `${base}/node${id}/distance`;
    const dist = ctx.text(distPath);
    let distances: number[] | Unknown = 'unknown';
    if (dist !== undefined) {
      const fields = dist.split(/\s+/).filter(Boolean);
      if (fields.length === 0 || !fields.every((f) => /^\d+$/.test(f))) ctx.bad(distPath, dist, 'not a list of distances');
      else distances = fields.map(Number);
    }
    return { id, cpulist, cpuCount, distances };
  });
}

function readIommu(ctx: Ctx): IommuInfo {
  const units = ctx.reader.readdir('/sys/class/iommu') ?? [];
  const groups = (ctx.reader.readdir('/sys/kernel/iommu_groups') ?? []).filter((g) => /^\d+$/.test(g));
  const groupTypes: Record<string, number> = {};
  for (const g of groups) {
    const type = ctx.text(`/sys/kernel/iommu_groups/${g}/type`) ?? 'unknown';
    groupTypes[type] = (groupTypes[type] ?? 0) + 1;
  }
  const cmdline = (ctx.text('/proc/cmdline') ?? '').split(/\s+/).filter((a) => /iommu/i.test(a));
  let state: IommuState;
  const types = Object.keys(groupTypes);
  const translated = (t: string) => t === 'DMA' || t === 'DMA-FQ';
  if (groups.length === 0) state = 'off';
  else if (types.every((t) => t === 'identity')) state = 'passthrough';
  else if (types.every(translated)) state = 'translated';
  else if (types.includes('unknown')) {
    // Kernels before 5.11 have no `type` file: fall back on the command line.
    const pt = cmdline.some((a) => a === 'iommu=pt' || a === 'iommu.passthrough=1');
    state = pt && types.length === 1 ? 'passthrough' : 'unknown';
    ctx.note(
      state === 'passthrough'
        ? 'IOMMU groups have no type file; iommu=pt on the kernel command line: treated as passthrough'
        : 'IOMMU groups exist but their domain type is unknown: treated as possibly translating',
    );
  } else state = 'mixed';
  if (units.length > 0 && groups.length === 0) ctx.note(`IOMMU hardware (${units.join(', ')}) present but no groups: IOMMU off`);
  return { state, units, groupCount: groups.length, groupTypes, cmdline };
}

function readModules(ctx: Ctx): PeerMemoryInfo {
  const all = ctx.reader.readdir('/sys/module');
  const present = (m: string) => (all ? all.includes(m) : ctx.reader.exists(`/sys/module/${m}`));
  const modules = INTERESTING_MODULES.filter(present);
  for (const m of all ?? []) if (PEERMEM_RE.test(m) && !modules.includes(m)) modules.push(m);
  const peerMemory = modules.filter((m) => PEERMEM_RE.test(m));
  let nvidiaDriver: string | null | Unknown = null;
  if (modules.includes('nvidia')) {
    nvidiaDriver = ctx.text('/sys/module/nvidia/version') ?? 'unknown';
    if (nvidiaDriver === 'unknown') {
      const m = /Kernel Module\s+(\S+)/.exec(ctx.text('/proc/driver/nvidia/version') ?? '');
      if (m) nvidiaDriver = m[1];
    }
  }
  return { modules, peerMemory, nvidiaDriver };
}

/** Network interfaces of a PCI function: `net/`, or `virtioN/net/` for virtio-net. */
function netdevsOf(ctx: Ctx, dir: string): string[] {
  const out = [...(ctx.reader.readdir(`${dir}/net`) ?? [])];
  for (const e of ctx.reader.readdir(dir) ?? []) if (/^virtio\d+$/.test(e)) out.push(...(ctx.reader.readdir(`${dir}/${e}/net`) ?? []));
  return out;
}

function nvidiaName(ctx: Ctx, bdf: string): string | undefined {
  const info = ctx.text(`/proc/driver/nvidia/gpus/${bdf}/information`);
  const m = info === undefined ? null : /^Model:\s*(.+)$/m.exec(info);
  return m ? m[1].trim() : undefined;
}

/**
 * The PCIe relation of two functions, from their placements and NUMA nodes (see `PcieRelation`).
 * 'unknown' when either placement is unknown, or they are on different root complexes and a NUMA
 * node is unknown.
 */
export function pcieRelation(a: PciPlacement, numaA: number | Unknown, b: PciPlacement, numaB: number | Unknown): PcieRelation {
  if (a.rootComplex === 'unknown' || b.rootComplex === 'unknown') return 'unknown';
  if (a.rootComplex !== b.rootComplex) {
    if (numaA === 'unknown' || numaB === 'unknown') return 'unknown';
    return numaA === numaB ? 'NODE' : 'SYS';
  }
  let common = 0;
  while (common < a.bridges.length && common < b.bridges.length && a.bridges[common] === b.bridges[common]) common++;
  if (common === 0) return 'PHB';
  return Math.max(a.bridges.length - common, b.bridges.length - common) <= 1 ? 'PIX' : 'PXB';
}

function linkGBps(link: PcieLink): number | undefined {
  if (link.gen === 'unknown' || link.width === 'unknown') return undefined;
  const lane = PCIE_LANE_GBPS[link.gen];
  return lane === undefined ? undefined : lane * link.width;
}

function validateRuntime(probe: RuntimeProbe): void {
  const n = probe.deviceCount;
  if (!Number.isInteger(n) || n < 0) throw new TransportArgumentError(`runtime.deviceCount must be a non-negative integer, got ${n}`);
  const square = (name: string, m: unknown[][] | undefined, ok: (v: unknown) => boolean) => {
    if (m === undefined) return;
    if (!Array.isArray(m) || m.length !== n || m.some((row) => !Array.isArray(row) || row.length !== n))
      throw new TransportArgumentError(`runtime.${name} must be a ${n}x${n} matrix`);
    for (const row of m) for (const v of row) if (!ok(v)) throw new TransportArgumentError(`runtime.${name} holds an invalid entry ${String(v)}`);
  };
  square('peerAccess', probe.peerAccess, (v) => typeof v === 'boolean');
  if (probe.peerAccess === undefined) throw new TransportArgumentError('runtime.peerAccess is required');
  square('nvlinkLinks', probe.nvlinkLinks, (v) => Number.isInteger(v) && (v as number) >= 0);
  if (probe.pciBusIds !== undefined && (!Array.isArray(probe.pciBusIds) || probe.pciBusIds.length !== n))
    throw new TransportArgumentError(`runtime.pciBusIds must list ${n} PCI bus ids`);
}

function mapRuntime(ctx: Ctx, probe: RuntimeProbe, gpus: GpuInfo[]): RuntimeView {
  validateRuntime(probe);
  const n = probe.deviceCount;
  const source = probe.source ?? 'runtime';
  let mapping: RuntimeView['mapping'];
  const devices: (number | null)[] = new Array(n).fill(null);
  if (probe.pciBusIds !== undefined) {
    mapping = 'pci-bus-id';
    probe.pciBusIds.forEach((id, ord) => {
      const bdf = normalizeBdf(id);
      if (bdf === undefined) throw new TransportArgumentError(`runtime.pciBusIds[${ord}] = ${JSON.stringify(id)} is not a PCI bus id`);
      const gpu = gpus.find((g) => g.bdf === bdf);
      if (gpu) devices[ord] = gpu.index;
      else ctx.note(`runtime device ${ord} (${bdf}) is not a GPU of the sysfs tree: its PCI placement is unknown`);
    });
  } else {
    const nvidia = gpus.filter((g) => g.vendor === 'nvidia');
    const pool = nvidia.length > 0 ? nvidia : gpus;
    if (pool.length === n) {
      mapping = 'assumed-pci-order';
      pool.forEach((g, ord) => (devices[ord] = g.index));
      if (n > 1) ctx.note('runtime gave no PCI bus ids: device ordinals assumed to follow PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID)');
    } else {
      mapping = 'unmapped';
      ctx.note(`runtime sees ${n} devices, sysfs ${pool.length} GPUs, and no PCI bus ids were given: devices not matched to PCI placement`);
    }
  }
  return {
    source,
    deviceCount: n,
    mapping,
    devices,
    peerAccess: probe.peerAccess.map((row) => [...row]),
    nvlinkLinks: probe.nvlinkLinks ? probe.nvlinkLinks.map((row) => [...row]) : null,
    mappedPinned: probe.mappedPinned ?? 'unknown',
    gpuDirectRdma: probe.gpuDirectRdma ?? 'unknown',
  };
}

function emptyTopology(ctx: Ctx): FabricTopology {
  return {
    schema: 1,
    source: 'unavailable',
    reader: ctx.reader.description,
    gpus: [],
    nics: [],
    numaNodes: [],
    iommu: { state: 'unknown', units: [], groupCount: 0, groupTypes: {}, cmdline: [] },
    peerMemory: { modules: [], peerMemory: [], nvidiaDriver: 'unknown' },
    nvlink: { state: 'unknown', source: 'none', nvswitches: [] },
    pairs: [],
    gpuNics: [],
    runtime: null,
    cxlMemoryDevices: [],
    otherDisplays: [],
    notes: ctx.notes,
  };
}

/**
 * Discover the fabric under a sysfs tree. Never throws on malformed or missing sysfs values unless
 * `strict` is set (then `TopologyParseError`); a malformed runtime probe is a `TransportArgumentError`.
 *
 * @example
 *   const topo = discoverTopology(createSysfsReader('/'), { runtime: probeFromCuda() });
 */
export function discoverTopology(reader: SysfsReader, options: DiscoverOptions = {}): FabricTopology {
  const ctx = new Ctx(reader, options.strict === true);
  const names = reader.readdir(PCI_DEVICES);
  if (names === undefined) {
    ctx.note(`${PCI_DEVICES} is missing under ${reader.description}: not Linux, or sysfs is not mounted; fabric unknown`);
    const topo = emptyTopology(ctx);
    if (options.runtime) topo.runtime = mapRuntime(ctx, options.runtime, []);
    return topo;
  }

  const functions = new Map<string, RawFunction>();
  for (const name of names) {
    const bdf = name.toLowerCase();
    if (!BDF_RE.test(bdf)) {
      ctx.note(`${PCI_DEVICES}/${name}: not a PCI address, skipped`);
      continue;
    }
    functions.set(bdf, readFunction(ctx, bdf));
  }
  const numaNodes = readNuma(ctx);

  // numa_node -1 means "no affinity recorded". With one node there is only one answer.
  const noAffinity = [...functions.values()].filter((f) => f.noAffinity);
  if (noAffinity.length > 0) {
    if (numaNodes.length === 1) {
      for (const f of noAffinity) f.info.numaNode = numaNodes[0].id;
      ctx.note(`numa_node is -1 or missing for ${noAffinity.length} PCI functions; the machine has one NUMA node, so they are placed on node ${numaNodes[0].id}`);
    } else {
      const gpuLike = noAffinity.filter((f) => f.info.classCode !== 'unknown' && (f.info.classCode >> 16 === 0x03 || f.info.classCode >> 16 === 0x02));
      if (gpuLike.length > 0)
        ctx.note(`numa_node is -1 or missing for ${gpuLike.map((f) => f.info.bdf).join(', ')} on a machine with ${numaNodes.length} NUMA nodes: node unknown`);
    }
  }

  if (numaNodes.length > 0) {
    for (const f of functions.values()) {
      const n = f.info.numaNode;
      if (n !== 'unknown' && !numaNodes.some((x) => x.id === n))
        f.info.numaNode = ctx.bad(`${PCI_DEVICES}/${f.info.bdf}/numa_node`, String(n), `names no NUMA node of this machine (${numaNodes.map((x) => x.id).join(', ')})`);
    }
  }

  const gpus: GpuInfo[] = [];
  const nics: NicInfo[] = [];
  const otherDisplays: string[] = [];
  const nvswitches: string[] = [];
  for (const { info } of [...functions.values()].sort((x, y) => (x.info.bdf < y.info.bdf ? -1 : 1))) {
    if (info.classCode === 'unknown') {
      ctx.note(`${info.bdf}: class unknown, not classified`);
      continue;
    }
    const base = info.classCode >> 16;
    const sub = info.classCode >> 8;
    if (base === 0x03) {
      const vendor = info.vendorId === 'unknown' ? undefined : GPU_VENDORS.get(info.vendorId);
      if (vendor === undefined) {
        otherDisplays.push(info.bdf);
        const vname = info.vendorId === 'unknown' ? 'an unknown vendor' : (VENDOR_NAMES.get(info.vendorId) ?? `vendor 0x${info.vendorId.toString(16)}`);
        ctx.note(`${info.bdf}: display function from ${vname}, not counted as a compute GPU`);
        continue;
      }
      let name: string | Unknown = 'unknown';
      let nameSource: GpuInfo['nameSource'] = 'unknown';
      const fromDriver = vendor === 'nvidia' ? nvidiaName(ctx, info.bdf) : undefined;
      if (fromDriver !== undefined) {
        name = fromDriver;
        nameSource = 'driver';
      } else if (vendor === 'nvidia' && info.deviceId !== 'unknown' && NVIDIA_DEVICE_NAMES.has(info.deviceId)) {
        name = NVIDIA_DEVICE_NAMES.get(info.deviceId) as string;
        nameSource = 'pci-id';
      }
      let pcie = linkGBps(info.link.max);
      for (const b of info.placement.bridges) {
        const bridge = functions.get(b);
        const cap = bridge ? linkGBps(bridge.info.link.max) : undefined;
        if (pcie !== undefined && cap !== undefined) pcie = Math.min(pcie, cap);
      }
      if (pcie === undefined) ctx.note(`${info.bdf}: PCIe link generation or width unknown, bandwidth not estimated`);
      gpus.push({
        ...info,
        index: gpus.length,
        vendor,
        name,
        nameSource,
        runtimeIndex: null,
        pcieGBps: pcie === undefined ? 'unknown' : Math.round(pcie * 10) / 10,
      });
    } else if (sub === 0x0200 || sub === 0x0207 || sub === 0x0280) {
      const dir = `${PCI_DEVICES}/${info.bdf}`;
      const rdmaDevices = ctx.reader.readdir(`${dir}/infiniband`) ?? [];
      nics.push({
        ...info,
        kind: sub === 0x0200 ? 'ethernet' : sub === 0x0207 ? 'infiniband' : 'network',
        netdevs: netdevsOf(ctx, dir),
        rdmaDevices,
        rdma: sub === 0x0207 || rdmaDevices.length > 0,
      });
    } else if (info.vendorId === PCI_VENDOR_NVIDIA && sub === 0x0680) nvswitches.push(info.bdf);
  }

  const iommu = readIommu(ctx);
  const peerMemory = readModules(ctx);
  const cxlMemoryDevices = (reader.readdir('/sys/bus/cxl/devices') ?? []).filter((d) => /^mem\d+$/.test(d));

  const runtime = options.runtime ? mapRuntime(ctx, options.runtime, gpus) : null;
  if (runtime) runtime.devices.forEach((g, ord) => g !== null && (gpus[g].runtimeIndex = ord));

  let nvState: NvlinkInfo['state'] = 'unknown';
  if (runtime?.nvlinkLinks) nvState = runtime.nvlinkLinks.some((row, i) => row.some((v, j) => i !== j && v > 0)) ? 'present' : 'absent';
  const nvlink: NvlinkInfo = { state: nvState, source: runtime?.nvlinkLinks ? 'runtime' : 'none', nvswitches };
  if (nvState === 'unknown' && gpus.length > 1)
    ctx.note(
      nvswitches.length > 0
        ? `NVSwitch functions visible (${nvswitches.join(', ')}) but no runtime probe of NVLink: NVLink unknown, not assumed`
        : 'no runtime probe of NVLink: NVLink unknown, not assumed',
    );

  const pairs: GpuPair[] = [];
  for (let a = 0; a < gpus.length; a++) {
    for (let b = a + 1; b < gpus.length; b++) {
      const ga = gpus[a];
      const gb = gpus[b];
      const pcie = pcieRelation(ga.placement, ga.numaNode, gb.placement, gb.numaNode);
      let nvlinkLinks: number | Unknown = 'unknown';
      let peerAccessAB: boolean | Unknown = 'unknown';
      let peerAccessBA: boolean | Unknown = 'unknown';
      if (runtime && ga.runtimeIndex !== null && gb.runtimeIndex !== null) {
        const i = ga.runtimeIndex;
        const j = gb.runtimeIndex;
        peerAccessAB = runtime.peerAccess[i][j];
        peerAccessBA = runtime.peerAccess[j][i];
        if (runtime.nvlinkLinks) nvlinkLinks = Math.min(runtime.nvlinkLinks[i][j], runtime.nvlinkLinks[j][i]);
      }
      const label = typeof nvlinkLinks === 'number' && nvlinkLinks > 0 ? `NV${nvlinkLinks}` : pcie === 'unknown' ? '?' : pcie;
      pairs.push({ a, b, pcie, nvlinkLinks, peerAccessAB, peerAccessBA, label });
    }
  }
  const gpuNics: GpuNicAffinity[] = [];
  for (const g of gpus)
    for (const n of nics) gpuNics.push({ gpu: g.index, nic: n.bdf, relation: pcieRelation(g.placement, g.numaNode, n.placement, n.numaNode) });

  return {
    schema: 1,
    source: 'sysfs',
    reader: reader.description,
    gpus,
    nics,
    numaNodes,
    iommu,
    peerMemory,
    nvlink,
    pairs,
    gpuNics,
    runtime,
    cxlMemoryDevices,
    otherDisplays,
    notes: ctx.notes,
  };
}

/** The pair record of two topology GPUs (either order). */
export function gpuPair(topology: FabricTopology, a: number, b: number): GpuPair | undefined {
  const [x, y] = a < b ? [a, b] : [b, a];
  return topology.pairs.find((p) => p.a === x && p.b === y);
}

/** One line for logs: GPUs, links, IOMMU, NUMA, peer memory, NICs. */
export function describeTopology(topology: FabricTopology): string {
  if (topology.source === 'unavailable') return 'fabric: unknown (no sysfs PCI tree)';
  const names = new Map<string, number>();
  for (const g of topology.gpus) names.set(String(g.name), (names.get(String(g.name)) ?? 0) + 1);
  const gpuText = topology.gpus.length === 0 ? '0 GPUs' : `${topology.gpus.length} GPU(s) (${[...names].map(([n, c]) => `${c}x ${n}`).join(', ')})`;
  const pairText = topology.pairs.length ? `, pairs ${topology.pairs.map((p) => `${p.a}-${p.b}:${p.label}`).join(' ')}` : '';
  const rdma = topology.nics.filter((n) => n.rdma).length;
  return (
    `fabric: ${gpuText}${pairText}, NVLink ${topology.nvlink.state}, IOMMU ${topology.iommu.state}, ` +
    `${topology.numaNodes.length} NUMA node(s), ${topology.nics.length} NIC(s)${rdma ? ` (${rdma} RDMA)` : ''}, ` +
    `peer memory: ${topology.peerMemory.peerMemory.length ? topology.peerMemory.peerMemory.join(', ') : 'none'}`
  );
}
