// The options of createCudaBackend and the defaults they take from the environment.
import { type MatmulPrecision, type Numerics } from '@nerva/core';
import { CudaArgumentError } from './errors.js';

/** How matmuls with more than 8 rows run. */
export type GemmPrecision = 'split-bf16' | 'bf16' | 'gemv';

export const GEMM_MODES: Record<GemmPrecision, number> = { 'split-bf16': 0, bf16: 1, gemv: 2 };

/** The GEMM path of a matmul precision (see `MatmulPrecision` in @nerva/core). */
export const GEMM_FOR_MATMUL_PRECISION: Readonly<Record<MatmulPrecision, GemmPrecision>> = Object.freeze({ exact: 'split-bf16', bf16: 'bf16' });

export interface CudaBackendOptions {
  /** CUDA device ordinal (default 0). */
  device?: number;
  /**
   * Bytes of the device arena every 'vram' buffer is carved from, reserved at creation with one
   * cudaMalloc. Default: 80 % of the device's memory less the workspaces.
   */
  deviceArenaBytes?: number;
  /** Bytes of mapped pinned host memory for 'pinned' buffers (default 64 MiB). */
  pinnedArenaBytes?: number;
  /** Scratch for ops (split-KV partials, GEMM activation copies, sampler rows); default 256 MiB. */
  workspaceBytes?: number;
  /** cuBLAS workspace, set once so GEMMs never allocate (and can be captured); default 32 MiB. */
  cublasWorkspaceBytes?: number;
  /**
   * Many-row matmuls (prefill). 'split-bf16' (default): activations split into two bf16 halves,
   * two tensor-core GEMMs with fp32 accumulation, about 16 mantissa bits kept (f32-grade).
   * 'bf16': activations rounded to bf16 once (what PyTorch bf16 does; declared relTol 1e-2).
   * 'gemv': no cuBLAS, the GEMV kernel in chunks of 8 rows.
   * Default from NERVA_MATMUL when set (matmul precision 'exact' -> 'split-bf16', 'bf16' -> 'bf16');
   * the capabilities report it as `matmulPrecision`.
   */
  gemm?: GemmPrecision;
  /**
   * Activation rounding (default 'exact': float32 activations, f32-grade many-row GEMMs). 'bf16':
   * every kernel rounds its activations where transformers' bf16 eager forward does (see
   * `Numerics` in @nerva/core), attention runs as eager attention (scores and probabilities
   * rounded), and op decoder_layers always runs per layer.
   */
  numerics?: Numerics;
  /**
   * Batch-invariant decode (default false; NERVA_BATCH_INVARIANT=1 turns it on when the option is
   * absent): each decode row's results are bit for bit what the row computes alone, for any number
   * of rows in the call. Op fused_matmul and op decoder_layers (and op matmul up to 8 rows) run
   * every row count on one GEMM whose kernel never depends on the rows: cuBLASLt with one
   * algorithm pinned per weight shape (no split-K; chosen once by cuBLASLt's heuristic for
   * 128 rows), never cuBLAS's per-call heuristic. Where libcublasLt does not load, k_gemm_bi (a
   * tensor-core kernel of ours, activations split into three bf16 terms; latency-bound past 64
   * rows) takes them. Decode attention sizes its key splits as for one row (at least 256 keys) and runs the
   * GQA kernel, which reads each key once for the q heads sharing it, at every row count where the
   * shapes allow (other shapes: the split-KV kernel). Op matmul past 8 rows keeps cuBLAS's GEMMs,
   * so the engine runs every projection of a batch-invariant pass as fused_matmul; prefill
   * attention cuts each sequence's run of at least 64 rows into tiles from its own first row, so a
   * prompt chunk gets its bits alone beside other chunks.
   * Reported as capabilities.batchInvariant.
   */
  batchInvariant?: boolean;
  /** Path of nerva_cuda.node (default: NERVA_CUDA_ADDON, then the package's build/Release). */
  addonPath?: string;
}

/**
 * CudaBackendOptions.batchInvariant: `requested` when given (a boolean), else the environment's
 * NERVA_BATCH_INVARIANT ('1' or 'true': on; '0', 'false' or empty: off), else false. Anything
 * else is a CudaArgumentError naming where it came from.
 */
export function resolveBatchInvariant(requested?: unknown, env: Record<string, string | undefined> = process.env): boolean {
  if (requested !== undefined) {
    if (typeof requested !== 'boolean') throw new CudaArgumentError('batchInvariant', `must be a boolean, got ${JSON.stringify(requested)}`);
    return requested;
  }
  const v = env.NERVA_BATCH_INVARIANT;
  if (v === undefined || v === '' || v === '0' || v === 'false') return false;
  if (v === '1' || v === 'true') return true;
  throw new CudaArgumentError('NERVA_BATCH_INVARIANT', `must be 1, true, 0 or false, got ${JSON.stringify(v)}`);
}


/** Sizes of the reservations an option leaves unset. */
export const DEFAULTS = {
  pinnedArenaBytes: 64 * 2 ** 20,
  workspaceBytes: 256 * 2 ** 20,
  cublasWorkspaceBytes: 32 * 2 ** 20,
};
