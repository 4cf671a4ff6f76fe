import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** Linux's conventional uid and gid of `nobody` / `nogroup`. */
export const NOBODY = 65534;

/** The built @nerva/engine, for asNobody's child (the test task builds first). */
export const ENGINE_DIST = new URL('../dist/index.js', import.meta.url);

/**
 * The JSON of the last stdout line of `source` (an ES module) run by a child Node process as
 * the user nobody. Root, as CI runs, bypasses the mode bits a permission check is about; the
 * child checks them as a user they bind.
 */
export function asNobody(source: string): unknown {
  const dist = fileURLToPath(ENGINE_DIST);
  if (!existsSync(dist)) throw new Error(`${dist} is missing: build @nerva/engine first (pnpm build)`);
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', source], { uid: NOBODY, gid: NOBODY, cwd: '/', encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`child process as nobody: exit ${r.status ?? r.signal}: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop()!);
}
