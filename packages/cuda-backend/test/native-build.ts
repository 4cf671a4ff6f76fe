import { execFile, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The package folder: g++ runs from here, so sources are named relative to it. */
export const pkgDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** Whether g++ is on this machine (the native tests are skipped without it). */
export const hasGxx = spawnSync('g++', ['--version'], { stdio: 'ignore' }).status === 0;

/**
 * g++ arguments every standalone build of the host modules needs: the include folders, the pool,
 * the ISA layer and the knob table they read their settings from.
 */
export const HOST_BASE = ['-Inative/host', '-Inative/common', 'native/host/host_pool.cc', 'native/host/isa.cc', 'native/common/knobs.cc'];

/** What a finished child process left: its exit status (null if a signal ended it) and output. */
export interface ProcessResult {
  status: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs a program to its end without blocking the event loop (a synchronous child would stall the
 * test worker's reports to vitest: a two-minute g++ build on a busy two-core machine trips its RPC
 * timeout). Killed after timeoutMs (status null, signal SIGTERM); a program that cannot start
 * gives status null too.
 */
export function runProcess(
  cmd: string,
  args: readonly string[],
  opts: { cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): Promise<ProcessResult> {
  return new Promise((resolve) => {
    execFile(cmd, args, { cwd: opts.cwd, env: opts.env, timeout: opts.timeoutMs ?? 0, encoding: 'utf8', maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      const status = err ? (typeof err.code === 'number' ? err.code : null) : 0;
      resolve({ status, signal: err?.signal ?? null, stdout, stderr });
    });
  });
}

/**
 * Compiles a native test (`args`: g++ flags and sources, relative to the package) into a fresh
 * temporary folder; a failed build throws with g++'s stderr. dispose() removes the folder.
 */
export async function buildNative(name: string, args: string[]): Promise<{ exe: string; dispose: () => void }> {
  const tmp = mkdtempSync(path.join(os.tmpdir(), `nerva-${name}-`));
  const exe = path.join(tmp, name);
  const r = await runProcess('g++', ['-O2', '-std=c++17', ...args, '-o', exe], { cwd: pkgDir });
  if (r.status !== 0) {
    rmSync(tmp, { recursive: true, force: true });
    throw new Error(`g++ failed: ${r.stderr}`);
  }
  return { exe, dispose: () => rmSync(tmp, { recursive: true, force: true }) };
}

/**
 * Builds a native test that prints its result as one JSON line, runs it once and parses that line
 * (an emulation test: no arguments, no environment of its own). dispose() removes the build.
 */
export async function runNativeJson<T>(name: string, args: string[], timeoutMs = 120_000): Promise<{ result: T; dispose: () => void }> {
  const built = await buildNative(name, args);
  const r = await runProcess(built.exe, [], { timeoutMs });
  const line = r.stdout.split('\n').find((l) => l.startsWith('{'));
  if (!line) {
    built.dispose();
    throw new Error(`${name}: no result (status ${r.status}, signal ${r.signal}): ${r.stderr}`);
  }
  return { result: JSON.parse(line) as T, dispose: built.dispose };
}
