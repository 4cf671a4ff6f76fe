export { decodeProbe } from "./probes/decode.js";
export { generateProbe } from "./probes/generate.js";
export { measureCopyBandwidth, syntheticPrompt } from "./measure.js";
