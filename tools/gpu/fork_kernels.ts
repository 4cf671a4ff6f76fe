// Not a phase: the decode steps of N batch-invariant forks, for a kernel profiler to time one by
// one (ncu). A warm-up fork run captures the N-row graph; the timed run's last steps are then
// the last kernels of the process, which tools/gpu/kernel_table.py groups by kernel.
//   ncu --csv --metrics gpu__time_duration.sum node fork_kernels.mjs MODEL_DIR [N] [STEPS] [--default]
// --default: one request on the default (not batch-invariant) path instead of N forks.
import { syntheticPrompt } from '@nerva/bench';
import { Engine } from '@nerva/engine';

const usage = 'usage: fork_kernels.mjs MODEL_DIR [N] [STEPS] [--default] (N, STEPS: positive integers)';
const [dir, nArg, stepsArg, mode] = process.argv.slice(2);
const n = Number(nArg ?? 32);
const steps = Number(stepsArg ?? 6);
if (!dir || !Number.isSafeInteger(n) || n < 1 || !Number.isSafeInteger(steps) || steps < 1 || (mode !== undefined && mode !== '--default')) {
  console.error(usage);
  process.exit(2);
}
const single = mode === '--default';
const engine = await Engine.create({
  model: dir,
  backend: 'cuda',
  maxNumSeqs: Math.max(8, n),
  maxModelLen: 1024,
  kvCacheDtype: 'bf16',
  batchInvariant: !single,
});
// The fork probe's prompt (nerva-bench fork: 512 tokens, seed 7).
const prompt = syntheticPrompt(512, engine.spec.vocabSize, 7);
const params = { maxTokens: steps, temperature: 0.8, seed: 1, ignoreEos: true };
for (let round = 0; round < 2; round++) {
  if (single) await engine.submit(prompt, params).done;
  else await Promise.all(engine.submitFork(prompt, n, params).map((h) => h.done));
}
console.log(JSON.stringify({ graph_nodes: engine.graphNodes() }));
engine.dispose();
