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
const stats = cuda.stats();
const device = cuda.info();
cuda.dispose();
// bf16 numerics: the CUDA kernels against the CPU reference, both rounding at transformers' points.
const bf16Backend = createCudaBackend({ deviceArenaBytes: 4 * 2 ** 30, numerics: 'bf16' });
const bf16Report = await runConformance(bf16Backend, createCpuBackend({ numerics: 'bf16' }), { sizes: 'large' });
const bf16 = {
  precision: bf16Backend.capabilities.precision,
  passed: bf16Report.passed,
  failed: bf16Report.failed,
  failures: bf16Report.results.filter((r) => !r.ok),
  worstRelErr: bf16Report.results
    .filter((r) => r.maxRef > 0 && Number.isFinite(r.maxAbsErr))
    .map((r) => ({ case: `${r.op}/${r.name}`, rel: r.maxAbsErr / r.maxRef }))
    .sort((a, b) => b.rel - a.rel)
    .slice(0, 8),
};
bf16Backend.dispose();
// Matmul precision 'bf16' (gemm 'bf16'): many-row GEMMs and the prefill attention tiles round
// their operands to bf16 once; the backend declares the looser relTol that allows.
const bf16GemmBackend = createCudaBackend({ deviceArenaBytes: 4 * 2 ** 30, gemm: 'bf16' });
const bf16GemmReport = await runConformance(bf16GemmBackend, cpu, { sizes: 'large', ops: ['attention', 'matmul'] });
const bf16Gemm = {
  precision: bf16GemmBackend.capabilities.precision,
  passed: bf16GemmReport.passed,
  failed: bf16GemmReport.failed,
  failures: bf16GemmReport.results.filter((r) => !r.ok),
  results: bf16GemmReport.results.map((r) => ({ case: `${r.op}/${r.name}`, ok: r.ok, rel: r.maxRef > 0 ? r.maxAbsErr / r.maxRef : r.maxAbsErr })),
};
bf16GemmBackend.dispose();
const summary = {
  probe,
  device,
  precision: cuda.capabilities.precision,
  passed: report.passed,
  failed: report.failed,
  seconds,
  worstRelErr: worst,
  failures: report.results.filter((r) => !r.ok),
  results: report.results,
  stats,
  bf16,
  bf16Gemm,
};
writeFileSync(path.join(out, 'conformance.json'), JSON.stringify(summary, null, 1));
console.log(`conformance: ${report.passed} passed, ${report.failed} failed in ${seconds.toFixed(1)} s`);
for (const f of summary.failures) console.log(`  FAIL ${f.op}/${f.name}: ${f.error}`);
console.log(`conformance bf16 numerics: ${bf16.passed} passed, ${bf16.failed} failed; worst ${bf16.worstRelErr[0]?.case} ${bf16.worstRelErr[0]?.rel.toExponential(2)}`);
for (const f of bf16.failures) console.log(`  FAIL bf16 ${f.op}/${f.name}: ${f.error}`);
console.log(`conformance gemm bf16 (attention, matmul): ${bf16Gemm.passed} passed, ${bf16Gemm.failed} failed`);
for (const f of bf16Gemm.failures) console.log(`  FAIL gemm-bf16 ${f.op}/${f.name}: ${f.error}`);
process.exit(report.failed === 0 && bf16.failed === 0 && bf16Gemm.failed === 0 ? 0 : 1);
