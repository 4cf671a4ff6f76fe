export { decodeProbe } from "./probes/decode.js";
export { forkProbe, type ForkProbeOptions } from "./probes/fork.js";
export { generateProbe } from "./probes/generate.js";
export { llamaCppProbe, type LlamaCppProbeOptions } from "./probes/llama-cpp.js";
export { openLlamaCpp, LlamaCppRuntime, LlamaCppModel, type LlamaCppOpenResult, type LlamaCppOpenOptions, type LlamaCppGreedyResult } from "./llama-cpp.js";
export { parseLlamaBench, runLlamaBench, checkLlamaBench, type LlamaBenchResult } from "./llama-bench.js";
export { quantErrorProbe, QuantErrorStats, logSoftmax, QUANT_ERROR_TYPES, type QuantErrorProbeOptions } from "./probes/quant-error.js";
export {
  measureCopyBandwidth,
  measureH2dBandwidth,
  measureGemmRate,
  defaultGemmShapes,
  parseGemmShapes,
  GPU_GEMM_SHAPES,
  CPU_GEMM_SHAPES,
  syntheticPrompt,
  withScratchBackend,
  type H2dBandwidth,
  type GemmRate,
  type GemmShape,
  type GemmShapeRate,
} from "./measure.js";
export { prefillFlops, layerMatmulParams, causalPairs, type PrefillFlops } from "./flops.js";
export { prefillProbe, nominalBf16Peak, type PrefillProbeOptions } from "./probes/prefill.js";
export { offloadProbe, offloadKvCacheBytes, type OffloadProbeOptions } from "./probes/offload.js";
export { longContextProbe, type LongContextProbeOptions } from "./probes/long-context.js";
export { throughputProbe, firstDivergence, verifyIndices, type ThroughputProbeOptions } from "./probes/throughput.js";
export {
  makeWorkload,
  canonicalWorkloadJson,
  workloadSha256,
  workloadStats,
  readWorkload,
  validateWorkloadOptions,
  WorkloadError,
  WORKLOAD_TOKEN_ID_CAP,
  type Workload,
  type WorkloadOptions,
  type WorkloadRequest,
} from "./workload.js";
