#!/usr/bin/env node
// The Python unittest of tools/gpu (test_torch_throughput.py) needs torch: it runs where torch
// imports and is skipped with the reason printed elsewhere (CI has python3 but no torch). Its
// workload part, which needs no torch, is also checked by @nerva/bench's throughput test.
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const gpuDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'gpu');
const probe = spawnSync('python3', ['-c', 'import torch, numpy; print(torch.__version__)'], { encoding: 'utf8' });
if (probe.error || probe.status !== 0) {
  const why = probe.error ? `no python3 (${probe.error.message})` : (probe.stderr.trim().split('\n').pop() ?? `exit ${probe.status}`);
  console.log(`SKIPPED tools/gpu/test_torch_throughput.py: torch does not import here: ${why}`);
  process.exit(0);
}
console.log(`tools/gpu/test_torch_throughput.py with torch ${probe.stdout.trim()}`);
const r = spawnSync('python3', ['-m', 'unittest', 'discover', '-s', gpuDir, '-p', 'test_torch_throughput.py', '-v'], { stdio: 'inherit' });
process.exit(r.status ?? 1);
