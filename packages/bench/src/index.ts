export { decodeProbe } from "./probes/decode.js";
export { generateProbe } from "./probes/generate.js";
export { measureCopyBandwidth, measureH2dBandwidth, syntheticPrompt, withScratchBackend, type H2dBandwidth } from "./measure.js";
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
