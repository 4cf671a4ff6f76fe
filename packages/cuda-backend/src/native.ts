import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** Shape of the compiled addon (native/addon/). Addresses travel as JS numbers (< 2^53). */
export interface NativeContextOptions {
  device: number;
  deviceArenaBytes: number;
  pinnedArenaBytes: number;
  workspaceBytes: number;
  cublasWorkspaceBytes: number;
  gemmMode: number;
  /** bf16 numerics (CudaBackendOptions.numerics): kernels round activations to bf16. */
  bf16Activations?: boolean;
  /** Batch-invariant decode (CudaBackendOptions.batchInvariant). */
  batchInvariant?: boolean;
}

export interface NativeInfo {
  name: string;
  totalMemory: number;
  smCount: number;
  computeCapability: string;
  deviceBase: number;
  deviceArenaBytes: number;
  pinnedBase: number;
  pinnedArenaBytes: number;
  workspaceBytes: number;
  runtimeVersion: number;
  driverVersion: number;
  gemm: string;
  /** 'exact' or 'bf16': activation rounding. */
  numerics: string;
  /** Batch-invariant decode; absent from addons built before it existed. */
  batchInvariant?: boolean;
  /** Batch-invariant decode's matmul: 'cublaslt-pinned' or 'k_gemm_bi' (batchInvariant only). */
  biGemm?: string;
  /**
   * The cuBLASLt algorithm pinned per weight shape so far, `MxK: algo .. tile .. stages ..`
   * joined by '; ' (batchInvariant only; read it from CudaBackend.pinnedGemms(), which
   * asks the context now: pins are made at a shape's first matmul).
   */
  biGemmPins?: string;
  cublas: string;
  cublasNote: string;
  /**
   * How the pinned arena was allocated: anonymous memory advised for huge pages and registered
   * with CUDA, or cudaHostAlloc (and why); absent from addons built before it existed.
   */
  pinnedPages?: string;
  /**
   * Whether kernels launch with programmatic dependent launch (sm_90+ device, kernels built
   * for compute_90+); absent from addons built before it existed.
   */
  pdl?: boolean;
  /**
   * The most keys a decode row may have for op decoder_layers to run its cluster attention (the
   * addon's SA_MAX_KEYS; 0 where it never runs in this context); absent from addons built before
   * it existed (then 0).
   */
  decodeShortKeys?: number;
  /**
   * The fewest keys (op decoder_layers' minKeys) for which one-row decode takes the GQA attention
   * kernel (the addon's GQA_LONG_KEYS; 0 where minKeys changes nothing); absent from addons built
   * before it existed (then 0).
   */
  decodeLongKeys?: number;
  /** Op decoder_layers reads its embed arguments (table, ids) after the layers'. */
  decoderLayersEmbed?: boolean;
  /** Op sample reads its push and advance arguments (flags after vocab). */
  sampleStepTail?: boolean;
  /** Op sample reads and applies its mask argument (a flag after advance's; ops.ts' sample.mask). */
  sampleMask?: boolean;
}

export interface NativeCounters {
  allocCalls: number;
  freeCalls: number;
  launches: number;
  graphReplays: number;
  hotPathRejected: number;
}

/**
 * A host MLP (native/host/host_mlp.cc): part of a streamed layer's MLP computed on the CPU, where its
 * weights are. For r < rows: xn = RMSNorm(x[r]) * normW (eps), a = silu(gate . xn) * (up . xn)
 * over the `inter` channels given here, y[r] = down . a (written, not accumulated). Addresses as
 * JS numbers; the pinned arena's addresses (info().pinnedBase + offset) are translated to its host
 * view; device memory is refused. All buffers must stay valid while the id exists.
 */
export interface NativeHostMlpArgs {
  rows: number;
  hidden: number;
  /** Intermediate channels computed on the host, c >= 0 (0: y = 0). */
  inter: number;
  /** RMSNorm epsilon (default 1e-6). */
  eps?: number;
  /** f32 [rows, hidden]. */
  x: number;
  /** f32 [hidden]. */
  normW: number;
  /** bf16 [2 * inter, hidden]: inter gate rows, then inter up rows. */
  gateUp: number;
  /** bf16 [hidden, inter] (hidden rows of inter). */
  down: number;
  /** f32 [rows, hidden], written. */
  y: number;
}

export interface NativeHostMlpStats {
  /** Calls completed (process-wide, or of one id). */
  calls: number;
  /** Nanoseconds spent in them, wall time (process-wide, or of one id). */
  ns: number;
  /** Pool size, the calling thread included (NERVA_HOST_THREADS, default the CPUs available). */
  threads: number;
  /** Vector path in use (NERVA_HOST_ISA caps it). */
  isa: 'avx512' | 'avx2' | 'scalar';
  /** Whether the pool's workers are pinned to CPUs (NERVA_HOST_PIN=1). */
  pinned: boolean;
}

export interface NativeContext {
  info(): NativeInfo;
  /** The pinned arena as an ArrayBuffer (its first 2 GiB when larger). */
  pinnedArrayBuffer(): ArrayBuffer;
  /** A copy of pinned-arena bytes at an offset, without synchronizing (for ranges beyond the view). */
  peekPinned(offset: number, bytes: number): ArrayBuffer;
  launch(op: number, args: Float64Array, nargs: number, stream: number): void;
  copy(dst: number, src: number, bytes: number, stream: number): void;
  /** Returns whether the host waited for the device (a large or unstaged write, or a full ring). */
  write(dst: number, data: ArrayBufferView, stream: number, staged?: boolean): boolean;
  read(src: number, bytes: number): ArrayBuffer;
  createStream(): number;
  destroyStream(id: number): void;
  createEvent(): number;
  destroyEvent(id: number): void;
  record(event: number, stream: number): void;
  waitEvent(stream: number, event: number): void;
  elapsed(start: number, end: number): number;
  synchronize(stream: number): void;
  /** Blocks until the event completes (spinning, as synchronize does without host compute). */
  synchronizeEvent(event: number): void;
  beginCapture(stream: number): void;
  endCapture(stream: number): [number, number];
  replay(graph: number, stream: number): void;
  destroyGraph(graph: number): void;
  setHotPath(armed: boolean): void;
  counters(): NativeCounters;
  copyBandwidth(bytes: number, iters: number): number;
  dispose(): void;
  /** NCCL (native/nccl_dl.cc): a rank on this context's device -> communicator id. Absent from builds without NCCL. */
  ncclCommInit?(nranks: number, rank: number, uniqueId: Uint8Array): number;
  /** ncclSend(comm, addr, count, dtypeCode, peer, stream): enqueued on this context's stream. */
  ncclSend?(comm: number, addr: number, count: number, dtype: number, peer: number, stream: number): void;
  ncclRecv?(comm: number, addr: number, count: number, dtype: number, peer: number, stream: number): void;
  /** Host MLP: stores the arguments natively (validated; the pool's scratch reserved) -> id. Refused on the hot path. Absent from older builds. */
  hostMlpCreate?(args: NativeHostMlpArgs): number;
  /**
   * Enqueues the host MLP on a stream (cudaLaunchHostFunc): stream-ordered, capturable into a
   * graph (the id must then outlive the graph). It blocks the stream while the CPU computes.
   */
  hostMlpEnqueue?(id: number, stream: number): void;
  /** Runs the host MLP now on the calling thread and the pool (no CUDA call; tests, benchmarks). */
  hostMlpRun?(id: number): void;
  /** Waits for the device (no queued call still reads it), then frees the id. Destroy graphs using it first. */
  hostMlpDestroy?(id: number): void;
  /** The pool's counters, or one id's calls and time. */
  hostMlpStats?(id?: number): NativeHostMlpStats;
}

/** What ncclLoad reports; the library stays loaded for the process once found. */
export interface NativeNcclLoad {
  ok: boolean;
  /** ncclGetVersion's code (2.28.3 -> 22803). */
  version?: number;
  versionString?: string;
  /** The file the loader mapped. */
  path?: string;
  /** Whether the library has ncclCommInitAll. */
  initAll?: boolean;
  /** Why not, naming every candidate tried. */
  error?: string;
}

export interface NativeNcclCommInfo {
  nranks: number;
  rank: number;
  device: number;
  /** ncclCommGetAsyncError's result name when it is not ncclSuccess. */
  asyncError?: string;
}

/** The addon's module-level NCCL functions (native/nccl_dl.cc); communicator ids are process-wide. */
export interface NativeNccl {
  ncclLoad(candidateDirs: string[]): NativeNcclLoad;
  ncclUniqueId(): Uint8Array;
  ncclGroupStart(): void;
  ncclGroupEnd(): void;
  ncclCommInitAll(devices: number[]): number[];
  ncclCommInfo(comm: number): NativeNcclCommInfo;
  ncclCommDestroy(comm: number): void;
  ncclCommAbort(comm: number): void;
  /** ncclDataType_t codes by name (int8 ... bfloat16), from native/nccl_dl.h. */
  ncclDataTypes: Readonly<Record<string, number>>;
  ncclUniqueIdBytes: number;
}

export interface NativeProbe {
  ok: boolean;
  count: number;
  name?: string;
  computeCapability?: string;
  error?: string;
}

/**
 * One runtime setting of the native code (native/common/knobs.h): every NERVA_* name the addon
 * reads is declared once there, with its default and what it accepts.
 */
export interface NativeKnob {
  name: string;
  kind: 'int' | 'oneOf' | 'path';
  /** The default as text ('' for none). */
  default: string;
  /** Inclusive bounds of an 'int' knob. */
  min?: number;
  max?: number;
  /** The accepted values of a 'oneOf' knob. */
  values?: string[];
  /** One line. */
  doc: string;
  /** The value the native code reads: the environment's when set and valid, else the default. */
  value: string;
}

/** The first knob set to a value it does not accept; the message names the variable and the value. */
export interface NativeKnobProblem {
  name: string;
  message: string;
}

export interface NativeAddon extends Partial<NativeNccl> {
  Context: new (opts: NativeContextOptions) => NativeContext;
  probe(): NativeProbe;
  /** The knob table, in declaration order. */
  knobs(): NativeKnob[];
  /** Checks the environment against the knob table: null when every knob set is valid. */
  validateKnobs(): NativeKnobProblem | null;
  abiVersion: number;
}

/** The addon's ABI this TypeScript speaks; a stale build is reported instead of misused. */
export const ABI_VERSION = 3;

/**
 * Where the addon is looked for: an explicit path, then NERVA_CUDA_ADDON, then the package's
 * build/Release (relative to this module, which lives in dist/ or src/).
 */
export function addonCandidates(explicit?: string): string[] {
  const out: string[] = [];
  if (explicit) out.push(path.resolve(explicit));
  const env = process.env.NERVA_CUDA_ADDON;
  if (env) out.push(path.resolve(env));
  const here = path.dirname(fileURLToPath(import.meta.url));
  out.push(path.resolve(here, '..', 'build', 'Release', 'nerva_cuda.node'));
  return out;
}

const cache = new Map<string, NativeAddon>();

/**
 * Loads the addon at call time (never on import), so importing the package works on machines
 * without it. Throws a plain Error with the reason; callers turn it into CudaUnavailableError.
 */
export function loadAddon(explicit?: string): NativeAddon {
  const require = createRequire(import.meta.url);
  const tried: string[] = [];
  for (const file of addonCandidates(explicit)) {
    const hit = cache.get(file);
    if (hit) return hit;
    let mod: NativeAddon;
    try {
      mod = require(file) as NativeAddon;
    } catch (e) {
      const code = (e as { code?: string }).code;
      tried.push(code === 'MODULE_NOT_FOUND' ? `${file} (not built)` : `${file} (${(e as Error).message.split('\n')[0]})`);
      continue;
    }
    if (mod.abiVersion !== ABI_VERSION) {
      tried.push(`${file} (ABI ${mod.abiVersion}, expected ${ABI_VERSION}: rebuild with pnpm build:cuda)`);
      continue;
    }
    cache.set(file, mod);
    return mod;
  }
  throw new Error(`CUDA addon not loadable: ${tried.join('; ')}`);
}
