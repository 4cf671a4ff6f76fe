import type { DeviceBackend, Numerics } from '@nerva/core';
import { NervaError } from '@nerva/core';

export type BackendChoice = 'cpu' | 'cuda' | 'auto';

export interface SelectedBackend {
  backend: DeviceBackend;
  /** Decisions the user must see, e.g. a fallback; also recorded in every ledger summary. */
  notes: string[];
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
  /** Activation rounding of the created backend (default 'exact'). */
  numerics?: Numerics;
}

/**
 * Pick a backend. 'cuda' fails with one clear message when the addon or a GPU is missing;
 * 'auto' tries CUDA and falls back to the CPU reference, saying so. The CUDA package is imported
 * lazily so a machine without it never loads native code.
 */
export async function selectBackend(choice: BackendChoice, opts: BackendOptions = {}): Promise<SelectedBackend> {
  if (choice === 'cpu') {
    const { CpuBackend } = await import('@nerva/cpu-backend');
    return { backend: new CpuBackend({ numerics: opts.numerics }), notes: [] };
  }
  let reason: string;
  try {
    const cuda = await import('@nerva/cuda-backend');
    const probe = cuda.probeCuda();
    if (probe.available) {
      return { backend: cuda.createCudaBackend(opts), notes: [] };
    }
    reason = probe.reason ?? 'CUDA is not available';
  } catch (e) {
    reason = (e as Error).message;
  }
  if (choice === 'cuda') throw new BackendUnavailableError(`CUDA backend unavailable: ${reason}`);
  const { CpuBackend } = await import('@nerva/cpu-backend');
  return { backend: new CpuBackend({ numerics: opts.numerics }), notes: [`backend fallback: cuda -> cpu (${reason})`] };
}
