// GPU machine: the conformance suite of @nerva/core on the CUDA backend against the CPU reference,
// small and model-sized cases. Writes $OUT/conformance.json; exits 1 when a case fails.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { runConformance } from '@nerva/core';
import { createCpuBackend } from '@nerva/cpu-backend';
import { createCudaBackend, probeCuda } from '@nerva/cuda-backend';

const out = process.env.OUT ?? '.';
const probe = probeCuda();
if (!probe.available) {
  writeFileSync(path.join(out, 'conformance.json'), JSON.stringify({ probe }, null, 1));
  console.error(`CUDA unavailable: ${probe.reason}`);
  process.exit(1);
}
const cuda = createCudaBackend({ deviceArenaBytes: 4 * 2 ** 30 });
const cpu = createCpuBackend();
const t0 = performance.now();
const report = await runConformance(cuda, cpu, { sizes: 'large' });
const seconds = (performance.now() - t0) / 1000;
const worst = report.results
  .filter((r) => r.maxRef > 0 && Number.isFinite(r.maxAbsErr))
  .map((r) => ({ case: `${r.op}/${r.name}`, rel: r.maxAbsErr / r.maxRef }))
  .sort((a, b) => b.rel - a.rel)
  .slice(0, 8);
const summary = {
  probe,
  device: cuda.info(),
  precision: cuda.capabilities.precision,
  passed: report.passed,
  failed: report.failed,
  seconds,
  worstRelErr: worst,
  failures: report.results.filter((r) => !r.ok),
  results: report.results,
  stats: cuda.stats(),
};
writeFileSync(path.join(out, 'conformance.json'), JSON.stringify(summary, null, 1));
console.log(`conformance: ${report.passed} passed, ${report.failed} failed in ${seconds.toFixed(1)} s`);
for (const f of summary.failures) console.log(`  FAIL ${f.op}/${f.name}: ${f.error}`);
cuda.dispose();
process.exit(report.failed === 0 ? 0 : 1);
