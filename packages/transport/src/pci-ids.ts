/**
 * A few PCI ids this package names without help from a driver. A name from the NVIDIA driver
 * (`/proc/driver/nvidia/gpus/<bdf>/information`) always wins over this table; an id not listed
 * here is named 'unknown', never guessed.
 */

export const PCI_VENDOR_NVIDIA = 0x10de;
export const PCI_VENDOR_AMD = 0x1002;
export const PCI_VENDOR_MELLANOX = 0x15b3;

/** Vendors whose display-class devices are treated as compute GPUs. */
export const GPU_VENDORS: ReadonlyMap<number, 'nvidia' | 'amd'> = new Map([
  [PCI_VENDOR_NVIDIA, 'nvidia'],
  [PCI_VENDOR_AMD, 'amd'],
]);

/** NVIDIA device ids -> marketing names (the SKUs NERVA is run on or tested against). */
export const NVIDIA_DEVICE_NAMES: ReadonlyMap<number, string> = new Map([
  [0x20b0, 'NVIDIA A100-SXM4-40GB'],
  [0x20b2, 'NVIDIA A100-SXM4-80GB'],
  [0x20b5, 'NVIDIA A100 80GB PCIe'],
  [0x20f1, 'NVIDIA A100-PCIE-40GB'],
  [0x2204, 'NVIDIA GeForce RTX 3090'],
  [0x2330, 'NVIDIA H100 80GB HBM3'],
  [0x2331, 'NVIDIA H100 PCIe'],
  [0x2335, 'NVIDIA H200'],
  [0x2342, 'NVIDIA GH200 480GB'],
  [0x2684, 'NVIDIA GeForce RTX 4090'],
  [0x26b9, 'NVIDIA L40S'],
  [0x27b8, 'NVIDIA L4'],
]);

/** NVIDIA device ids of Grace-coupled parts: the GPU and the CPU share a coherent NVLink-C2C fabric. */
export const NVIDIA_COHERENT_DEVICES: ReadonlySet<number> = new Set([0x2342]);

/** Vendor names for notes. */
export const VENDOR_NAMES: ReadonlyMap<number, string> = new Map([
  [0x10de, 'NVIDIA'],
  [0x1002, 'AMD'],
  [0x1022, 'AMD'],
  [0x8086, 'Intel'],
  [0x15b3, 'Mellanox'],
  [0x1000, 'Broadcom/LSI'],
  [0x1a03, 'ASPEED'],
  [0x1af4, 'Red Hat (virtio)'],
  [0x1b36, 'Red Hat (QEMU)'],
  [0x1234, 'QEMU'],
]);

/** Per-lane PCIe bandwidth in GB/s (one direction, after line encoding) by link generation. */
export const PCIE_LANE_GBPS: Readonly<Record<number, number>> = {
  1: 0.25,
  2: 0.5,
  3: 0.985,
  4: 1.969,
  5: 3.938,
  6: 7.563,
};

/** Link generation by per-lane transfer rate (GT/s). */
export const PCIE_GEN_BY_GTS: ReadonlyMap<number, number> = new Map([
  [2.5, 1],
  [5, 2],
  [8, 3],
  [16, 4],
  [32, 5],
  [64, 6],
]);
