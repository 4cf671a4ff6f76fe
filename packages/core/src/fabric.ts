/** How the host and the device see each other's memory. */
export const FABRIC_KINDS = [
  /** PCIe-style: separate memories, explicit copies (discrete GPUs). */
  'DiscreteExplicit',
  /** One virtual address space, pages migrate on demand (CUDA managed memory). */
  'UnifiedVirtualManaged',
  /** One physical memory, coherent (Grace Hopper, Apple silicon, CPU-only). */
  'CoherentSharedPhysical',
  /** A coherent fabric with memory expanders (CXL.mem). */
  'CxlCoherentFabric',
] as const;
export type FabricKind = (typeof FABRIC_KINDS)[number];
