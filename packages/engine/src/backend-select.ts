import type { DeviceBackend, MatmulPrecision, Numerics } from '@nerva/core';
import { MATMUL_PRECISIONS, NervaError } from '@nerva/core';

export type BackendChoice = 'cpu' | 'cuda' | 'auto';

export interface SelectedBackend {
  backend: DeviceBackend;
  /** Decisions the user must see, e.g. a fallback; also recorded in every ledger summary. */
  notes: string[];
  /** Bytes of a device budget the backend keeps for itself, outside the buffers it hands out (workspaces). */
  reservedBytes?: number;
}

export class BackendUnavailableError extends NervaError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('BACKEND_UNAVAILABLE', message, options);
  }
}

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

/**
 * The matmul precision a backend is created with: `requested`, else the environment's
 * NERVA_MATMUL, else 'exact'. An unknown value (either way) is a RangeError naming where it came from.
 */
export function resolveMatmulPrecision(requested?: MatmulPrecision, env: Record<string, string | undefined> = process.env): MatmulPrecision {
  if (requested !== undefined) {
    if (!MATMUL_PRECISIONS.includes(requested)) throw new RangeError(`matmulPrecision must be ${MATMUL_PRECISIONS.join(' or ')}, got ${String(requested)}`);
    return requested;
  }
  const v = env.NERVA_MATMUL;
  if (v === undefined || v === '') return 'exact';
  if (!MATMUL_PRECISIONS.includes(v as MatmulPrecision)) throw new RangeError(`NERVA_MATMUL must be ${MATMUL_PRECISIONS.join(' or ')}, got ${JSON.stringify(v)}`);
  return v as MatmulPrecision;
}

/**
 * Pick a backend. 'cuda' fails with one clear message when the addon or a GPU is missing;
 * 'auto' tries CUDA and falls back to the CPU reference, saying so. The CUDA package is imported
 * lazily so a machine without it never loads native code.
 */
export async function selectBackend(choice: BackendChoice, opts: BackendOptions = {}): Promise<SelectedBackend> {
  const matmulPrecision = resolveMatmulPrecision(opts.matmulPrecision);
  if (opts.batchInvariant !== undefined && typeof opts.batchInvariant !== 'boolean') throw new RangeError(`batchInvariant must be a boolean, got ${JSON.stringify(opts.batchInvariant)}`);
  const cpuOpts = {
    numerics: opts.numerics,
    matmulPrecision,
    ...(opts.deviceBudgetBytes !== undefined ? { memoryBytes: opts.deviceBudgetBytes } : {}),
    ...(opts.hostBudgetBytes !== undefined ? { hostMemoryBytes: opts.hostBudgetBytes } : {}),
  };
  if (choice === 'cpu') {
    const { CpuBackend } = await import('@nerva/cpu-backend');
    return { backend: new CpuBackend(cpuOpts), notes: [] };
  }
  let reason: string;
  try {
    const cuda = await import('@nerva/cuda-backend');
    const probe = cuda.probeCuda();
    if (probe.available) {
      const { deviceBudgetBytes, hostBudgetBytes: _host, matmulPrecision: _mp, batchInvariant, ...rest } = opts;
      const cudaOpts = { ...rest, gemm: cuda.GEMM_FOR_MATMUL_PRECISION[matmulPrecision], ...(batchInvariant !== undefined ? { batchInvariant } : {}) };
      if (deviceBudgetBytes !== undefined) {
        // The budget covers the workspaces too: the arena gets what they leave.
        const workspaceBytes = 256 * 2 ** 20;
        const cublasWorkspaceBytes = 32 * 2 ** 20;
        // A budget below the workspaces leaves an empty arena: the residency planner then names the
        // smallest budget that works (workspaces included), rather than failing here.
        const arena = Math.max(0, Math.floor((deviceBudgetBytes - workspaceBytes - cublasWorkspaceBytes) / 2 ** 20) * 2 ** 20);
        return { backend: cuda.createCudaBackend({ ...cudaOpts, deviceArenaBytes: arena, workspaceBytes, cublasWorkspaceBytes }), notes: [], reservedBytes: workspaceBytes + cublasWorkspaceBytes };
      }
      return { backend: cuda.createCudaBackend(cudaOpts), notes: [] };
    }
    reason = probe.reason ?? 'CUDA is not available';
  } catch (e) {
    reason = (e as Error).message;
  }
  if (choice === 'cuda') throw new BackendUnavailableError(`CUDA backend unavailable: ${reason}`);
  const { CpuBackend } = await import('@nerva/cpu-backend');
  return { backend: new CpuBackend(cpuOpts), notes: [`backend fallback: cuda -> cpu (${reason})`] };
}
