// Not a phase: the decode steps of N batch-invariant forks, for a kernel profiler to time one by
// one (ncu). A warm-up fork run captures the N-row graph; the timed run's last steps are then
// the last kernels of the process, which tools/gpu/kernel_table.py groups by kernel.
//   ncu --csv --metrics gpu__time_duration.sum node fork_kernels.mjs MODEL_DIR [N] [STEPS] [--default]
// --default: one request on the default (not batch-invariant) path instead of N forks.
import { Engine } from '@nerva/engine';

const [dir, nArg, stepsArg, mode] = process.argv.slice(2);
if (!dir) throw new Error('usage: fork_kernels.mjs MODEL_DIR [N] [STEPS] [--default]');
const n = Number(nArg ?? 32);
const steps = Number(stepsArg ?? 6);
const single = mode === '--default';
const engine = await Engine.create({
  model: dir,
  backend: 'cuda',
  maxNumSeqs: Math.max(8, n),
  maxModelLen: 1024,
  kvCacheDtype: 'bf16',
  batchInvariant: !single,
});
const prompt = Array.from({ length: 512 }, (_, i) => (i * 7919 + 13) % 10000);
const params = { maxTokens: steps, temperature: 0.8, seed: 1, ignoreEos: true };
for (let round = 0; round < 2; round++) {
  if (single) await engine.submit(prompt, params).done;
  else await Promise.all(engine.submitFork(prompt, n, params).map((h) => h.done));
}
console.log(JSON.stringify({ graph_nodes: engine.graphNodes() }));
engine.dispose();
