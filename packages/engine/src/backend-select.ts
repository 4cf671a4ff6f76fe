import type { DeviceBackend, MatmulPrecision } from '@nerva/core';
import { MATMUL_PRECISIONS, NervaError } from '@nerva/core';
import { backendFactory, type BackendOptions, type CreatedBackend, registeredBackends } from './backend-registry.js';

export type { BackendOptions } from './backend-registry.js';

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

/**
 * What a CUDA backend made under a budget (`deviceBudgetBytes`) takes before its arena: the op
 * workspace and the cuBLAS workspace. The arena gets the budget less these.
 */
export const CUDA_BUDGET_WORKSPACES = { workspaceBytes: 256 * 2 ** 20, cublasWorkspaceBytes: 32 * 2 ** 20 } as const;


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
 * Create a backend of a registered kind (undefined: none registered), or say why it is
 * unavailable: its probe, or a failed creation (except for a reference backend, whose errors are
 * the caller's).
 */
async function createKind(name: string, opts: BackendOptions): Promise<CreatedBackend | { reason: string } | undefined> {
  const factory = backendFactory(name);
  if (!factory) return undefined;
  if (factory.reference) return factory.create(opts);
  try {
    const probe = await factory.probe();
    if (!probe.available) return { reason: probe.reason ?? 'not available' };
    return await factory.create(opts);
  } catch (e) {
    return { reason: (e as Error).message };
  }
}

/**
 * Pick a backend from the registry (`registerBackend`; the engine's entry registers 'cuda' and
 * 'cpu'). A named kind fails with one clear message when it is unavailable; 'auto' tries the
 * registered kinds from the highest priority down and takes the first available, saying which
 * it fell back from (so 'auto' tries CUDA, then falls back to the CPU reference).
 */
export async function selectBackend(choice: BackendChoice, opts: BackendOptions = {}): Promise<SelectedBackend> {
  resolveMatmulPrecision(opts.matmulPrecision);
  if (opts.batchInvariant !== undefined && typeof opts.batchInvariant !== 'boolean') throw new RangeError(`batchInvariant must be a boolean, got ${JSON.stringify(opts.batchInvariant)}`);
  const kinds = choice === 'auto' ? registeredBackends().map((b) => b.name) : [choice];
  const passed: { name: string; reason: string }[] = [];
  for (const name of kinds) {
    const made = await createKind(name, opts);
    if (!made) throw new BackendUnavailableError(`no backend '${name}' is registered (registered: ${registeredBackends().map((b) => b.name).join(', ') || 'none'})`);
    if ('backend' in made) return { ...made, notes: passed.map((p) => `backend fallback: ${p.name} -> ${name} (${p.reason})`) };
    if (choice !== 'auto') throw new BackendUnavailableError(`${name.toUpperCase()} backend unavailable: ${made.reason}`);
    passed.push({ name, reason: made.reason });
  }
  throw new BackendUnavailableError(`no registered backend is available (${passed.map((p) => `${p.name}: ${p.reason}`).join('; ') || 'none registered'})`);
}
