import { CudaArgumentError } from './errors.js';

/** What a NERVA_* switch of the addon accepts. The empty string always means "unset". */
export type TuningKnob =
  | { readonly kind: 'int'; readonly min: number; readonly max?: number; readonly what: string }
  | { readonly kind: 'oneOf'; readonly values: readonly string[]; readonly what: string };

/**
 * The switches the CUDA addon reads from the environment where it uses them (A/B switches and
 * tuning knobs, most measured in docs/results). The addon falls back to its default on a value
 * it does not parse; {@link checkTuningEnv}, run by createCudaBackend before the addon loads,
 * turns such a value into a CudaArgumentError naming the variable instead. NERVA_CUDA_SYNC has
 * its own check (checkSyncMode); paths (NERVA_DEVICE_TRACE, NERVA_NCCL_PATH) are not checked.
 */
export const TUNING_KNOBS: Readonly<Record<string, TuningKnob>> = {
  NERVA_ATTN_WAVES: { kind: 'int', min: 1, max: 64, what: "waves of the split-KV attention kernel's resident blocks its splits aim to fill (default 1)" },
  NERVA_ATTN_MIN_CHUNK: { kind: 'int', min: 8, max: 1 << 20, what: 'fewest keys a split of the split-KV attention takes (default 32)' },
  NERVA_ATTN_SHORT: { kind: 'oneOf', values: ['0', '2', '4', '8', '16'], what: 'blocks a KV head of the cluster decode attention for contexts within capabilities.decodeShortKeys (default 8; 0: the split-KV kernel always)' },
  NERVA_ATTN_GQA_MIN_ROWS: { kind: 'int', min: 0, what: 'decode rows from which the GQA attention kernel runs (default 16; 0: never)' },
  NERVA_ATTN_GQA_MAX_KEYS: { kind: 'int', min: 0, what: 'most keys a split of the many-row GQA attention takes (default 512; 0: no bound)' },
  NERVA_BI_ATTN_CHUNK: { kind: 'int', min: 16, max: 1 << 20, what: 'fewest keys a split of batch-invariant GQA attention takes (default 256)' },
  NERVA_BI_ATTN_GQA: { kind: 'oneOf', values: ['0', '1'], what: 'batch-invariant decode attention on the GQA kernel (default 1)' },
  NERVA_BI_GEMM: { kind: 'oneOf', values: ['0', '1', 'kernel'], what: 'batch-invariant matmul: 1 cuBLASLt pinned (default), kernel k_gemm_bi, 0 the GEMV' },
  NERVA_BI_GEMM_WARPS: { kind: 'int', min: 0, what: "warps' worth of weight tiles k_gemm_bi's split-K aims for (default 2048)" },
  NERVA_BI_LT_ROWS: { kind: 'int', min: 1, what: 'rows a batch-invariant cuBLASLt call takes at most (default 128)' },
  NERVA_DECODE_EARLY: { kind: 'int', min: 0, max: 3, what: 'which decode GEMVs trigger the next kernel at entry (bits; default 3)' },
  NERVA_FLASH_PREFILL: { kind: 'oneOf', values: ['0', '1'], what: 'tensor-core prefill attention (default 1)' },
  NERVA_GEMV_MAX_ROWS: { kind: 'oneOf', values: ['8', '16'], what: 'rows of one GEMV launch (default 16)' },
  NERVA_GEMV_WIDE: { kind: 'oneOf', values: ['0', '4', '8'], what: 'outputs a block of the one-row split projections (default 8; 0: one, the many-row kernel)' },
  NERVA_GEMV_LEAN: { kind: 'oneOf', values: ['0', '1'], what: 'the one-row normed projection (qkv) in 48 registers a thread, so the cluster attention fits beside it (default 1)' },
  NERVA_GEMV_OUTPUTS: { kind: 'oneOf', values: ['0', '1'], what: '1: one output a warp at every row count (default 0)' },
  NERVA_PDL: { kind: 'oneOf', values: ['0', '1'], what: 'programmatic dependent launch on sm_90+ (default 1)' },
  NERVA_PINNED_HUGEPAGES: { kind: 'oneOf', values: ['0', '1'], what: 'pinned arenas on 2 MiB pages where the kernel allows (default 1)' },
  NERVA_PREFILL_ATTN: { kind: 'oneOf', values: ['1', '2', '3'], what: 'prefill attention variant (default 3)' },
  NERVA_PREFILL_ATTN_HPB: { kind: 'oneOf', values: ['0', '1'], what: '1: a q head a block in prefill attention (default 0)' },
  NERVA_RING_EARLY: { kind: 'oneOf', values: ['0', '1'], what: "ring_push reads the token ring's cursor before its dependency wait where no push can still be running (default 1)" },
  NERVA_SAMPLE_TAIL: { kind: 'oneOf', values: ['0', '1'], what: "op sample's push and advance run in the sampling kernel for one row on the cluster path (default 1; 0: ring_push's and advance_positions' kernels after it)" },
  NERVA_SAMPLE_CLUSTER: { kind: 'oneOf', values: ['0', '4', '8', '16'], what: 'blocks a thread block cluster of the greedy sampler merges over distributed shared memory (default 8; 0: the blocks merge through a counter)' },
  NERVA_PREFILL_ROPE: { kind: 'oneOf', values: ['0', '1'], what: 'the row-block rope_append for prefill (default 1)' },
  NERVA_SPLIT_FUSION: { kind: 'oneOf', values: ['0', '1'], what: 'bf16 operand hand-off between many-row GEMMs (default 1)' },
  NERVA_HOST_ISA: { kind: 'oneOf', values: ['scalar', 'avx2', 'avx512'], what: 'most capable vector path of the host compute modules (default avx512, where the CPU has it)' },
  NERVA_HOST_THREADS: { kind: 'int', min: 0, what: 'host compute threads (default 0: the CPUs this process may use; at most 256)' },
  NERVA_HOST_PIN: { kind: 'oneOf', values: ['0', '1'], what: 'pin host compute threads to CPUs (default 0)' },
  NERVA_HOST_SPIN_US: { kind: 'int', min: 0, what: 'µs a host compute worker spins before it sleeps (default 1000)' },
  NERVA_HOST_ATTN_SPIN_US: { kind: 'int', min: 0, what: 'deprecated alias of NERVA_HOST_SPIN_US' },
  NERVA_HOST_CHANNEL: { kind: 'oneOf', values: ['0', '1'], what: 'device-to-host call channel for host compute (default 1)' },
  NERVA_HOST_CHANNEL_SPIN_US: { kind: 'int', min: 0, what: 'µs the host channel server spins before it sleeps (default 3000)' },
  NERVA_HOST_CHANNEL_TIMEOUT_MS: { kind: 'int', min: 1, what: 'ms a device waits on a host call before it reports a timeout (default 30000)' },
};

/** Switches the addon no longer reads, with what replaced them: setting one is an error, not a no-op. */
export const RETIRED_KNOBS: Readonly<Record<string, string>> = {
  NERVA_ATTN_BLOCKS_PER_SM: 'NERVA_ATTN_WAVES (the splits now fill whole waves of the kernel\'s resident blocks; 8 blocks an SM was 4 waves of the fused decode kernel)',
};

const INT_MAX = 2 ** 31 - 1;

/**
 * Checks every switch of {@link TUNING_KNOBS} set in `env`: unset or empty passes (the addon's
 * default), otherwise the value must be one the addon reads as written. A switch of
 * {@link RETIRED_KNOBS} set to anything but empty is an error naming its replacement. Throws a
 * CudaArgumentError naming the variable, the value and what it accepts.
 */
export function checkTuningEnv(env: Record<string, string | undefined> = process.env): void {
  for (const [name, instead] of Object.entries(RETIRED_KNOBS)) {
    const v = env[name];
    if (v !== undefined && v !== '') throw new CudaArgumentError(name, `is no longer read, got ${JSON.stringify(v)}; use ${instead}`);
  }
  for (const [name, k] of Object.entries(TUNING_KNOBS)) {
    const v = env[name];
    if (v === undefined || v === '') continue;
    if (k.kind === 'oneOf') {
      if (!k.values.includes(v)) throw new CudaArgumentError(name, `must be ${k.values.join(', ')} or unset, got ${JSON.stringify(v)} (${k.what})`);
      continue;
    }
    const max = k.max ?? INT_MAX;
    const n = /^\d+$/.test(v) ? Number(v) : NaN;
    if (!(n >= k.min && n <= max)) {
      throw new CudaArgumentError(name, `must be an integer in [${k.min}, ${max}] or unset, got ${JSON.stringify(v)} (${k.what})`);
    }
  }
}
