import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

// tools/gpu/kernel_table.py: ncu's CSV of a run whose last kernels are decode steps -> per kernel,
// calls and microseconds a step. Run with python3 (CI has it) on CSVs in ncu's layout.
const script = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'gpu', 'kernel_table.py');
const header = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"';
const row = (id: number, name: string, value: string, unit = 'ns') =>
  `"${id}","1","node","127.0.0.1","${name}","1","14","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","${unit}","${value}"`;

function run(csv: string, ...args: string[]): { status: number | null; stdout: string; stderr: string } {
  const dir = mkdtempSync(path.join(tmpdir(), 'kernel-table-'));
  const file = path.join(dir, 'ncu.csv');
  writeFileSync(file, csv);
  const r = spawnSync('python3', [script, file, ...args], { encoding: 'utf8' });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('kernel_table.py', () => {
  it('sums the last steps per kernel, ignoring the kernels before them and ncu log lines', () => {
    const csv = [
      '==PROF== Connected to process 1',
      header,
      row(0, 'nerva::k_embedding(const void *, int)', '99,000'),
      // two steps of three kernels: gemm twice, attention once
      row(1, 'void nerva::k_gemm<1>(float *)', '2,000'),
      row(2, 'nerva::k_attn(const float *)', '3,000'),
      row(3, 'void nerva::k_gemm<1>(float *)', '4,000'),
      row(4, 'void nerva::k_gemm<1>(float *)', '6,000'),
      row(5, 'nerva::k_attn(const float *)', '5', 'us'),
      row(6, 'void nerva::k_gemm<1>(float *)', '0.002', 'ms'),
    ].join('\n');
    const r = run(csv, '3', '2');
    expect(r.status).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toBe('kernels 7; last 2 steps of 3: 11.0 us a step (kernels alone, serialized)');
    expect(lines[1]).toMatch(/^\s+7\.0 us\s+2\.0 calls\s+nerva::k_gemm$/);
    expect(lines[2]).toMatch(/^\s+4\.0 us\s+1\.0 calls\s+nerva::k_attn$/);
    expect(lines).toHaveLength(3);
  });

  it('refuses fewer kernels than the steps asked for, an unknown unit and bad arguments, with the reason', () => {
    const few = run([header, row(0, 'k(int)', '1')].join('\n'), '3', '2');
    expect(few.status).not.toBe(0);
    expect(few.stderr).toMatch(/1 kernels profiled, fewer than 2 steps of 3/);
    const unit = run([header, row(0, 'k(int)', '1', 'cycle')].join('\n'), '1', '1');
    expect(unit.status).not.toBe(0);
    expect(unit.stderr).toMatch(/unknown time unit 'cycle'/);
    const args = run(header, 'x');
    expect(args.status).not.toBe(0);
    expect(args.stderr).toMatch(/usage: kernel_table.py/);
    const missing = spawnSync('python3', [script, '/nonexistent/ncu.csv', '3'], { encoding: 'utf8' });
    expect(missing.status).not.toBe(0);
    expect(missing.stderr).toMatch(/No such file/);
  });
});
