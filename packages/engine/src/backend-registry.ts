import type { DeviceBackend, MatmulPrecision, Numerics } from '@nerva/core';
import type { NcclPointToPoint } from './stages/links.js';

/** How the engine asks for a backend: budgets, numerics, the device (each factory reads what applies to it). */
export interface BackendOptions {
  /** Bytes of device memory the CUDA backend reserves up front (weights + KV + activations). */
  deviceArenaBytes?: number;
  pinnedArenaBytes?: number;
  /**
   * A budget for everything the backend takes from its compute tier (the memory OS's VRAM
   * budget): on CUDA the arena plus the op and cuBLAS workspaces; on the CPU the 'dram' tier.
   */
  deviceBudgetBytes?: number;
  /** Host-tier bytes for the CPU backend's 'pinned' tier (the memory OS's host budget). */
  hostBudgetBytes?: number;
  /** Activation rounding of the created backend (default 'exact'). */
  numerics?: Numerics;
  /**
   * Many-row matmul precision of the created backend (default: NERVA_MATMUL, else 'exact'); see
   * `MatmulPrecision` in @nerva/core. On CUDA 'exact' runs the split-bf16 GEMMs (gemm 'split-bf16')
   * and 'bf16' one bf16 GEMM (gemm 'bf16', also plain-bf16 prefill attention); the CPU backend
   * rounds the activations of matmuls over more than 8 rows to bf16.
   */
  matmulPrecision?: MatmulPrecision;
  /** CUDA device ordinal (default 0); a pipeline stage's GPU. Ignored by the CPU backend. */
  device?: number;
  /**
   * Batch-invariant decode on CUDA (see CudaBackendOptions.batchInvariant; default:
   * NERVA_BATCH_INVARIANT, else off). The CPU backend ignores it.
   */
  batchInvariant?: boolean;
}

/** Whether a registered backend can be created on this machine, and why not. */
export interface BackendProbe {
  available: boolean;
  reason?: string;
}

/** A created backend, with what the engine must know of its making. */
export interface CreatedBackend {
  backend: DeviceBackend;
  /** Bytes of a device budget the backend keeps for itself, outside the buffers it hands out (workspaces). */
  reservedBytes?: number;
}

/** A point-to-point communicator joining several backends of one kind (pipeline stages on separate devices). */
export interface StageCommunicator extends NcclPointToPoint {
  /** What the pipeline notes about it (the library and its version). */
  readonly description: string;
  destroy(): void;
}

/**
 * How the engine makes a backend of one kind. Implementations import their package lazily (in
 * `probe` and `create`), so a machine without it never loads its native code.
 */
export interface BackendFactory {
  /** Whether `create` can succeed here; may load the backend's package. */
  probe(): Promise<BackendProbe>;
  /** Create a backend (after an available probe). */
  create(opts: BackendOptions): Promise<CreatedBackend>;
  /**
   * A reference backend, always available: never probed, and a failure to create it (an invalid
   * option) is the caller's error rather than a reason to fall back.
   */
  reference?: boolean;
  /** Join backends this factory made, on separate devices, for pipeline stage links; absent where they share memory. */
  communicator?(backends: DeviceBackend[]): Promise<StageCommunicator>;
}

interface Registered {
  name: string;
  factory: BackendFactory;
  priority: number;
}

const registry = new Map<string, Registered>();

/**
 * Register a backend kind under `name` (as tfjs registers backends): `selectBackend(name)`
 * creates it, and `selectBackend('auto')` tries the registered kinds from the highest `priority`
 * down, taking the first available. Registering a name again replaces it.
 */
export function registerBackend(name: string, factory: BackendFactory, priority = 0): void {
  if (name === 'auto' || name === '') throw new RangeError(`'${name}' cannot name a backend`);
  registry.set(name, { name, factory, priority });
}

/** Remove a registered backend kind (tests); true if it was registered. */
export function unregisterBackend(name: string): boolean {
  return registry.delete(name);
}

/** The factory registered under `name`, if any. */
export function backendFactory(name: string): BackendFactory | undefined {
  return registry.get(name)?.factory;
}

/** The registered backend kinds, highest priority first (the order 'auto' tries them in). */
export function registeredBackends(): { name: string; priority: number }[] {
  return [...registry.values()].sort((a, b) => b.priority - a.priority).map(({ name, priority }) => ({ name, priority }));
}
