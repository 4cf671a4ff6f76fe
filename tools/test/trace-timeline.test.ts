import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

// tools/gpu/trace_timeline.py: a device timeline (an addon built with -DNERVA_TRACE) -> the last
// decode steps, launch by launch. Kernels are named from the sources by the line of their trace
// macro (plus NERVA_TRACE_KERNEL_AT's base); run with python3 (CI has it) on a trace built here in
// the addon's layout: u32 capacity, u32 record count for each of 256 SMs, then each SM's ring of
// records of six u64 (tag << 40 | sm << 32 | block, entry, wait release, exit, grid, mark).
const script = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'gpu', 'trace_timeline.py');
const SMS = 256;

interface Rec {
  tag: number;
  block: number;
  entry: number;
  wait: number;
  exit: number;
  grid: number;
}

function traceFile(dir: string, recs: Rec[]): string {
  const cap = recs.length;
  const buf = Buffer.alloc(4 + 4 * SMS + SMS * cap * 6 * 8);
  buf.writeUInt32LE(cap, 0);
  buf.writeUInt32LE(recs.length, 4); // every record on SM 0
  recs.forEach((r, i) => {
    const off = 4 + 4 * SMS + i * 6 * 8;
    buf.writeBigUInt64LE((BigInt(r.tag) << 40n) | BigInt(r.block), off);
    buf.writeBigUInt64LE(BigInt(r.entry), off + 8);
    buf.writeBigUInt64LE(BigInt(r.wait), off + 16);
    buf.writeBigUInt64LE(BigInt(r.exit), off + 24);
    buf.writeBigUInt64LE(BigInt(r.grid), off + 32);
    buf.writeBigUInt64LE(0n, off + 40);
  });
  const file = path.join(dir, 'trace.bin');
  writeFileSync(file, buf);
  return file;
}

// Line numbers matter: k_embedding's macro is on line 2 (tag 2), k_first's on line 5 (tag 5).
const aCu = ['__global__ void k_embedding(int x) {', '  NERVA_TRACE_KERNEL();', '}', '__global__ void k_first(int x) {', '  NERVA_TRACE_KERNEL();', '}', ''].join('\n');
// k_q4 carries a base (tag 300000 + 3); k_clash's macro is on line 5 too: tag 5 again.
const bCu = ['template <int N>', '__global__ void k_q4(int x) {', '  NERVA_TRACE_KERNEL_AT(300000);', '}', '__global__ void k_clash(int y) { NERVA_TRACE_KERNEL(); }', ''].join('\n');

function run(recs: Rec[], ...args: string[]) {
  const dir = mkdtempSync(path.join(tmpdir(), 'trace-timeline-'));
  const a = path.join(dir, 'a.cu');
  const b = path.join(dir, 'b.cu');
  writeFileSync(a, aCu);
  writeFileSync(b, bCu);
  const json = path.join(dir, 'out.json');
  const r = spawnSync('python3', [script, traceFile(dir, recs), '--json', json, ...args, '--src', a, b], { encoding: 'utf8' });
  return { ...r, json };
}

// Three steps 100 us apart: the embedding (one block), then k_q4 (two blocks) released 2 us in.
function steps(n: number): Rec[] {
  const recs: Rec[] = [];
  for (let s = 0; s < n; s++) {
    const t = 1_000_000 + s * 100_000;
    recs.push({ tag: 2, block: 0, entry: t, wait: t + 100, exit: t + 1_000, grid: 1 });
    for (const block of [0, 1]) recs.push({ tag: 300_003, block, entry: t + 1_500, wait: t + 2_000 + block * 50, exit: t + 9_000, grid: 2 });
  }
  return recs;
}

describe('trace_timeline.py', () => {
  it('names kernels by their macro line and base, splits the steps at the embedding, and reports a tag two files share', () => {
    const r = run(steps(3), '--tokens', '2');
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/step 0: 2 launches, 100\.0 us from the first release to the next step's/);
    expect(r.stdout).toMatch(/k_q4\/2\s+1\s+98\.10\s+7\.00/); // crit 98.1 us (to the next step's release), work 7.0
    expect(r.stdout).toMatch(/k_embedding\/1\s+1\s+1\.90\s/);
    expect(r.stderr).toMatch(/tag 5 is k_first \(.*a\.cu\) and k_clash \(.*b\.cu\)/);
    const out = JSON.parse(readFileSync(r.json, 'utf8')) as { steps: Array<{ name: string; grid: number }> };
    expect(out.steps.map((s) => `${s.name}/${s.grid}`)).toEqual(['k_embedding/1', 'k_q4/2', 'k_embedding/1', 'k_q4/2']);
  });

  it('says how many steps it found when the trace holds fewer than asked', () => {
    const r = run(steps(2), '--tokens', '4');
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(/only 1 decode steps in the trace/);
  });
});
