import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DTYPE_BYTES, f32ToBf16 } from '@nerva/core';
import { CpuBackend } from '@nerva/cpu-backend';
import type { PagedTensor, PlanBlock, ResidencyPlan } from '../src/index.js';

/** Small op scratch: these tests run no kernels, and a default CpuBackend reserves a few MiB. */
const SCRATCH = { vocab: 16, context: 16, width: 16 };

export function cpu(memoryBytes = 2 ** 20, hostMemoryBytes = 2 ** 20): CpuBackend {
  return new CpuBackend({ memoryBytes, hostMemoryBytes, scratch: SCRATCH });
}

/** The tensors of one streamed block: a float32 matrix and a bf16 vector (a layer's weight and norm). */
export const LAYOUT: readonly PagedTensor[] = [
  { name: 'w', dtype: 'f32', length: 48 },
  { name: 'n', dtype: 'bf16', length: 16 },
];
export const BLOCK_BYTES = LAYOUT.reduce((s, t) => s + t.length * DTYPE_BYTES[t.dtype], 0);

/** An always-hot block (embedding-like) and `layers` ordered blocks of one layout's size. */
export function model(layers: number, extra: Partial<PlanBlock>[] = []): PlanBlock[] {
  return [
    { id: 'embed', bytes: 4 * BLOCK_BYTES },
    ...Array.from({ length: layers }, (_, i) => ({ id: `L${i}`, bytes: BLOCK_BYTES, order: i, ...extra[i] })),
  ];
}

/**
 * Block `i`'s data, distinct per block and element. The bf16 values are small integers, exact in
 * bf16, so a slot read back as float32 equals them.
 */
export function blockData(i: number): { w: Float32Array; n: Float32Array } {
  const w = Float32Array.from({ length: 48 }, (_, e) => i * 1000 + e + 0.25);
  const n = Float32Array.from({ length: 16 }, (_, e) => i * 16 + e);
  return { w, n };
}

/** Store every streamed block's data through the pager (the bf16 tensor as raw bits or as float32). */
export function storeAll(pager: { store(id: string, t: string, src: Float32Array | Uint16Array, off?: number): void }, plan: ResidencyPlan): void {
  plan.streamed.forEach((id, j) => {
    const i = Number(id.slice(1));
    const d = blockData(i);
    // Two halves at element offsets, to exercise offset stores.
    pager.store(id, 'w', d.w.subarray(0, 20));
    pager.store(id, 'w', d.w.subarray(20), 20);
    if (j % 2 === 0) pager.store(id, 'n', d.n);
    else pager.store(id, 'n', Uint16Array.from(d.n, (x) => f32ToBf16(x)));
  });
}

/** A fresh temporary directory, removed by the returned cleanup. */
export function tempDir(prefix = 'nerva-memos-'): { dir: string; cleanup(): void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

export const sum = (xs: Iterable<number>): number => {
  let s = 0;
  for (const x of xs) s += x;
  return s;
};

/** Linux's conventional uid and gid of `nobody` / `nogroup`. */
export const NOBODY = 65534;

/**
 * Runs `source` (an ES module) in a child Node process as the unprivileged user nobody and
 * returns the JSON of its last stdout line. Root (CI runs as root) bypasses the mode bits a
 * permission check is about, so such a check runs here. The source imports the package's built
 * dist (`distUrl`): the test task builds first; a stale or missing build is reported as such.
 */
export function runAsNobody(source: string): unknown {
  if (!existsSync(fileURLToPath(distUrl))) throw new Error(`${fileURLToPath(distUrl)} is missing: build @nerva/memos first (pnpm build)`);
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', source], { uid: NOBODY, gid: NOBODY, cwd: '/', encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`the child process as nobody failed (${r.status ?? r.signal}): ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop()!);
}

/** The built package, for runAsNobody's child. */
export const distUrl = new URL('../dist/index.js', import.meta.url);
