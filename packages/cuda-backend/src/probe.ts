import { loadAddon } from './native.js';

/** What probeCuda found. */
export interface CudaProbe {
  available: boolean;
  /** Why not, when unavailable. */
  reason?: string;
  /** The first device's name and compute capability, when available. */
  device?: string;
  deviceCount?: number;
}

/**
 * Whether the CUDA backend can run here: the addon loads and sees a GPU. Never throws; loads the
 * addon on the first call only.
 */
export function probeCuda(opts: { addonPath?: string } = {}): CudaProbe {
  let addon;
  try {
    addon = loadAddon(opts.addonPath);
  } catch (e) {
    return { available: false, reason: (e as Error).message };
  }
  try {
    const p = addon.probe();
    if (!p.ok) return { available: false, reason: p.error ?? 'no CUDA device', deviceCount: p.count };
    return { available: true, device: `${p.name ?? 'CUDA device'} (sm_${(p.computeCapability ?? '').replace('.', '')})`, deviceCount: p.count };
  } catch (e) {
    return { available: false, reason: `CUDA probe failed: ${(e as Error).message}` };
  }
}
