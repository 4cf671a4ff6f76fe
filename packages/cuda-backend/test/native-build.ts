import { spawnSync } from 'node:child_process';
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

/**
 * Compiles a native test (`args`: g++ flags and sources, relative to the package) into a fresh
 * temporary folder; a failed build throws with g++'s stderr. dispose() removes the folder.
 */
export function buildNative(name: string, args: string[]): { exe: string; dispose: () => void } {
  const tmp = mkdtempSync(path.join(os.tmpdir(), `nerva-${name}-`));
  const exe = path.join(tmp, name);
  const r = spawnSync('g++', ['-O2', '-std=c++17', ...args, '-o', exe], { cwd: pkgDir, encoding: 'utf8' });
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
export function runNativeJson<T>(name: string, args: string[], timeoutMs = 120_000): { result: T; dispose: () => void } {
  const built = buildNative(name, args);
  const r = spawnSync(built.exe, [], { encoding: 'utf8', timeout: timeoutMs });
  const line = r.stdout.split('\n').find((l) => l.startsWith('{'));
  if (!line) {
    built.dispose();
    throw new Error(`${name}: no result (status ${r.status}, signal ${r.signal}): ${r.stderr}`);
  }
  return { result: JSON.parse(line) as T, dispose: built.dispose };
}
