// createCudaBackend: checks the options and the environment, loads the addon, reserves the arenas.
import { MATMUL_PRECISIONS, NUMERICS, type MatmulPrecision } from '@nerva/core';
import { CudaBackend } from './backend.js';
import { CudaArgumentError, CudaUnavailableError, fromNative } from './errors.js';
import { loadAddon, type NativeContext } from './native.js';
import { type CudaBackendOptions, DEFAULTS, GEMM_FOR_MATMUL_PRECISION, GEMM_MODES, resolveBatchInvariant } from './options.js';

/**
 * Creates a CUDA backend: loads the addon (lazily, here), checks for a device, reserves the
 * arenas. Throws CudaUnavailableError when the addon or a GPU is missing.
 */
export function createCudaBackend(opts: CudaBackendOptions = {}): CudaBackend {
  // Options first: a bad configuration is named even where no GPU is present.
  const numerics = opts.numerics ?? 'exact';
  if (!NUMERICS.includes(numerics)) throw new CudaArgumentError('numerics', `unknown numerics ${String(numerics)} (expected ${NUMERICS.join(' or ')})`);
  const batchInvariant = resolveBatchInvariant(opts.batchInvariant);
  let gemm = opts.gemm;
  if (gemm === undefined) {
    const env = process.env.NERVA_MATMUL || 'exact';
    if (!MATMUL_PRECISIONS.includes(env as MatmulPrecision))
      throw new CudaArgumentError('NERVA_MATMUL', `unknown matmul precision ${env} (expected ${MATMUL_PRECISIONS.join(' or ')})`);
    gemm = GEMM_FOR_MATMUL_PRECISION[env as MatmulPrecision];
  }
  if (!Object.hasOwn(GEMM_MODES, gemm)) throw new CudaArgumentError('gemm', `unknown gemm precision ${String(gemm)} (expected ${Object.keys(GEMM_MODES).join(', ')})`);
  let addon;
  try {
    addon = loadAddon(opts.addonPath);
  } catch (e) {
    throw new CudaUnavailableError((e as Error).message);
  }
  // The environment against the addon's knob table: a value the native code would ignore (it
  // falls back to the default) is an error naming the variable instead.
  const bad = addon.validateKnobs();
  if (bad) throw new CudaArgumentError(bad.name, bad.message.startsWith(`${bad.name}: `) ? bad.message.slice(bad.name.length + 2) : bad.message);
  const p = addon.probe();
  if (!p.ok) throw new CudaUnavailableError(p.error ?? 'no CUDA device');
  const device = opts.device ?? 0;
  if (!Number.isInteger(device) || device < 0 || device >= p.count) throw new CudaArgumentError('device', `device ${device} does not exist (${p.count} present)`);
  const workspaceBytes = opts.workspaceBytes ?? DEFAULTS.workspaceBytes;
  const cublasWorkspaceBytes = opts.cublasWorkspaceBytes ?? DEFAULTS.cublasWorkspaceBytes;
  const pinnedArenaBytes = opts.pinnedArenaBytes ?? DEFAULTS.pinnedArenaBytes;
  for (const [k, v] of Object.entries({ workspaceBytes, cublasWorkspaceBytes, pinnedArenaBytes })) {
    if (!Number.isSafeInteger(v) || v < 0) throw new CudaArgumentError(k, `must be a non-negative integer, got ${v}`);
  }
  let deviceArenaBytes = opts.deviceArenaBytes;
  if (deviceArenaBytes === undefined) {
    // Size the default from the device itself: a throwaway probe context would cost a reservation,
    // so ask for a small one first and read totalMemory from it.
    const probeCtx = new addon.Context({ device, deviceArenaBytes: 0, pinnedArenaBytes: 0, workspaceBytes: 256, cublasWorkspaceBytes: 0, gemmMode: GEMM_MODES.gemv });
    const total = probeCtx.info().totalMemory;
    probeCtx.dispose();
    deviceArenaBytes = Math.max(0, Math.floor((total * 0.8 - workspaceBytes - cublasWorkspaceBytes) / 2 ** 20) * 2 ** 20);
  }
  if (!Number.isSafeInteger(deviceArenaBytes) || deviceArenaBytes < 0) throw new CudaArgumentError('deviceArenaBytes', `must be a non-negative integer, got ${deviceArenaBytes}`);
  let ctx: NativeContext;
  try {
    ctx = new addon.Context({
      device,
      deviceArenaBytes,
      pinnedArenaBytes,
      workspaceBytes,
      cublasWorkspaceBytes,
      gemmMode: GEMM_MODES[gemm],
      bf16Activations: numerics === 'bf16',
      batchInvariant,
    });
  } catch (e) {
    throw fromNative(e, 'createCudaBackend');
  }
  return new CudaBackend(ctx, p.count, gemm, { device, addon });
}
