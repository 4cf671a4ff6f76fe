import type { DeviceBackend } from '@nerva/core';
import type { BackendOptions } from './backend-select.js';
import { registerBackend, type StageCommunicator } from './backend-registry.js';
import { CUDA_BUDGET_WORKSPACES, resolveMatmulPrecision } from './backend-select.js';

/**
 * The engine's default backends, registered when `@nerva/engine` is imported: the CUDA backend
 * (priority 100, tried first by 'auto') and the CPU reference (priority 0, always available).
 * Each package is imported only when its backend is probed or created, so a machine without the
 * CUDA addon never loads native code.
 */

/** The CPU backend's options from the engine's. */
function cpuOptions(opts: BackendOptions) {
  return {
    numerics: opts.numerics,
    matmulPrecision: resolveMatmulPrecision(opts.matmulPrecision),
    ...(opts.deviceBudgetBytes !== undefined ? { memoryBytes: opts.deviceBudgetBytes } : {}),
    ...(opts.hostBudgetBytes !== undefined ? { hostMemoryBytes: opts.hostBudgetBytes } : {}),
  };
}

registerBackend(
  'cpu',
  {
    reference: true,
    probe: async () => ({ available: true }),
    create: async (opts) => {
      const { CpuBackend } = await import('@nerva/cpu-backend');
      return { backend: new CpuBackend(cpuOptions(opts)) };
    },
  },
  0,
);

registerBackend(
  'cuda',
  {
    probe: async () => {
      try {
        const probe = (await import('@nerva/cuda-backend')).probeCuda();
        return probe.available ? { available: true } : { available: false, reason: probe.reason ?? 'CUDA is not available' };
      } catch (e) {
        return { available: false, reason: (e as Error).message };
      }
    },
    create: async (opts) => {
      const cuda = await import('@nerva/cuda-backend');
      const matmulPrecision = resolveMatmulPrecision(opts.matmulPrecision);
      const { deviceBudgetBytes, hostBudgetBytes: _host, matmulPrecision: _mp, batchInvariant, ...rest } = opts;
      const cudaOpts = { ...rest, gemm: cuda.GEMM_FOR_MATMUL_PRECISION[matmulPrecision], ...(batchInvariant !== undefined ? { batchInvariant } : {}) };
      if (deviceBudgetBytes !== undefined) {
        // The budget covers the workspaces too: the arena gets what they leave.
        const { workspaceBytes, cublasWorkspaceBytes } = CUDA_BUDGET_WORKSPACES;
        // A budget below the workspaces leaves an empty arena: the residency planner then names the
        // smallest budget that works (workspaces included), rather than failing here.
        const arena = Math.max(0, Math.floor((deviceBudgetBytes - workspaceBytes - cublasWorkspaceBytes) / 2 ** 20) * 2 ** 20);
        return { backend: cuda.createCudaBackend({ ...cudaOpts, deviceArenaBytes: arena, workspaceBytes, cublasWorkspaceBytes }), reservedBytes: workspaceBytes + cublasWorkspaceBytes };
      }
      return { backend: cuda.createCudaBackend(cudaOpts) };
    },
    communicator: async (backends: DeviceBackend[]): Promise<StageCommunicator> => {
      const cuda = await import('@nerva/cuda-backend');
      // Rank i on backends[i].
      const comm = cuda.NcclCommunicator.initAll(backends as InstanceType<typeof cuda.CudaBackend>[]);
      return {
        description: `NCCL ${comm.library.version ?? ''} (${comm.library.path ?? 'libnccl'})`.trim(),
        send: (buf, peer, o) => comm.send(buf, peer, o),
        recv: (buf, peer, o) => comm.recv(buf, peer, o),
        group: (fn) => comm.group(fn),
        destroy: () => comm.destroy(),
      };
    },
  },
  100,
);
